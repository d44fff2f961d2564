"""What a killed driver's local Ray leaves running is ended by the run's next start, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rredcot.launch import leftovers
from rredcot.launch.leftovers import SESSION_FILE, end_leftovers, record_session, session_processes

HOLD_OPEN = "import sys, time; f = open(sys.argv[1], 'a'); print('up', flush=True); time.sleep(120)"
SESSION = "session_2026-12-01_10-00-00_123456_4242"  # the shape of Ray's session names


def _start(*args: str, title: str | None = None) -> subprocess.Popen:
    """A Python process; ``title``: its argv[0], as Ray retitles its own (``ray::DashboardAgent``)."""
    argv = [title or sys.executable, "-c", *args]
    proc = subprocess.Popen(argv, executable=sys.executable, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


@pytest.fixture
def ray_root(tmp_path: Path, monkeypatch) -> Path:
    """Ray's temp root for the test (``RAY_TMPDIR``), as a local Ray started now would use it."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "tmp"))
    root = tmp_path / "tmp" / "ray"
    root.mkdir(parents=True)
    return root


@pytest.fixture
def no_kill(monkeypatch) -> list[int]:
    """SIGKILLs recorded, not sent: a refusal test that regresses can never end the user's processes."""
    sent: list[int] = []
    monkeypatch.setattr(psutil.Process, "kill", lambda self: sent.append(self.pid))
    return sent


def test_the_processes_of_the_recorded_session_are_ended_and_no_other(tmp_path: Path, ray_root: Path) -> None:
    session, other = ray_root / SESSION, ray_root / "session_2026-12-01_10-00-00_654321_4343"
    for d in (session, other):
        (d / "logs").mkdir(parents=True)
    # a retitled agent: only its files say which session it is of
    holds_a_log = _start(HOLD_OPEN, str(session / "logs" / "agent.log"), title="ray::DashboardAgent")
    names_it = _start(f"print('up', flush=True); import time; time.sleep(120)  # {session}", title="ray::IDLE")
    unrelated = _start(HOLD_OPEN, str(other / "logs" / "agent.log"), title="ray::IDLE")  # another run's session
    not_ray = _start(HOLD_OPEN, str(session / "logs" / "mine.log"))  # the user's own, reading Ray's logs
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        record_session(run_dir, str(session))
        ended = end_leftovers(run_dir)
        assert sorted(ended) == sorted([holds_a_log.pid, names_it.pid])
        assert holds_a_log.poll() is not None and names_it.poll() is not None  # ended (and reaped)
        assert unrelated.poll() is None and not_ray.poll() is None and not (run_dir / SESSION_FILE).exists()
        assert end_leftovers(run_dir) == []  # nothing recorded any more
    finally:
        for p in (holds_a_log, names_it, unrelated, not_ray):
            p.kill()
            p.wait()


def test_a_planted_path_ends_no_process_that_names_or_holds_it(tmp_path: Path, ray_root: Path, caplog) -> None:
    """A ``.ray-session`` holding an unrelated path (anyone who can write ``run.dir`` can plant one):
    the user's process with that path in its arguments and a file open under it survives."""
    data = tmp_path / "data"
    data.mkdir()
    victim = _start(HOLD_OPEN, str(data / "notes.txt"))
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / SESSION_FILE).write_text(str(data))
        with caplog.at_level("DEBUG", logger="rredcot.launch.leftovers"):
            assert end_leftovers(run_dir) == []
        time.sleep(0.2)
        assert victim.poll() is None, "the planted path's process was ended"
        assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.text
        assert "no Ray session directory" in caplog.text and "ending no process" in caplog.text
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.parametrize(
    "planted",
    ["/", "home", "root", "root/session_latest", "outside/" + SESSION, "root/session_1_42", "root/link", "relative"],
)
def test_a_recorded_path_that_is_no_ray_session_is_refused(
    tmp_path: Path, ray_root: Path, no_kill: list[int], planted: str, caplog
) -> None:
    """``/``, the home directory, Ray's temp root itself, a well-named directory elsewhere, a name
    of another shape, a link in the root to elsewhere: one warning, no process ended."""
    (tmp_path / "outside" / SESSION).mkdir(parents=True)
    (ray_root / "session_latest").symlink_to(Path.home())
    (ray_root / "session_1_42").mkdir()
    (ray_root / "link").symlink_to(tmp_path / "outside" / SESSION)
    path = {
        "/": "/",
        "home": str(Path.home()),
        "root": str(ray_root),
        "root/session_latest": str(ray_root / "session_latest"),
        "outside/" + SESSION: str(tmp_path / "outside" / SESSION),
        "root/session_1_42": str(ray_root / "session_1_42"),
        "root/link": str(ray_root / "link"),
        "relative": SESSION,
    }[planted]
    bystander = _start(f"print('up', flush=True); import time; time.sleep(120)  # {path}", title="ray::IDLE")
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / SESSION_FILE).write_text(path)
        with caplog.at_level("DEBUG", logger="rredcot.launch.leftovers"):
            assert end_leftovers(run_dir) == []
        assert no_kill == [] and bystander.poll() is None
        assert [r.levelname for r in caplog.records] == ["WARNING"], caplog.text
        assert "no Ray session directory" in caplog.text and not (run_dir / SESSION_FILE).exists()
        assert session_processes(path) == []
    finally:
        bystander.kill()
        bystander.wait()


def test_a_session_that_no_longer_exists_is_a_debug_line(tmp_path: Path, ray_root: Path, caplog) -> None:
    """After a reboot or a cleaned /tmp the recorded session is gone, and so are its processes."""
    record_session(tmp_path, str(ray_root / SESSION))
    with caplog.at_level("DEBUG", logger="rredcot.launch.leftovers"):
        assert end_leftovers(tmp_path) == []
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


def test_rays_own_processes_are_known_by_their_markers() -> None:
    package = leftovers._ray_package()
    assert package is not None and package.endswith("/ray/")
    assert leftovers.is_ray_process(["ray::IDLE"], "/usr/bin/python3")
    assert leftovers.is_ray_process(["ray-dashboard-NodeHead-0 (/x/python -B -c ...)"], "/usr/bin/python3")
    assert leftovers.is_ray_process(
        [package + "core/src/ray/raylet/raylet", "--x"], package + "core/src/ray/raylet/raylet"
    )
    assert leftovers.is_ray_process(["/x/python", "-u", package + "autoscaler/_private/monitor.py"], "/usr/bin/python3")
    assert not leftovers.is_ray_process(["python", "-c", "ray::IDLE"], "/usr/bin/python3")
    assert not leftovers.is_ray_process(["sleep", "100"], "/usr/bin/sleep")
    assert not leftovers.is_ray_process([], None)


_DRIVER = """
import os, ray, time
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
ray.get(ray.remote(lambda: 1).remote())
print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
time.sleep(120)
"""


def _anything_of(session: str) -> list[int]:
    """Every live process (Ray's by its markers or not) that names ``session`` or holds a file under it."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if session in " ".join(p.info["cmdline"] or []) or any(
                f.path.startswith(session + "/") for f in p.open_files()
            ):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_a_sigkilled_drivers_ray_agents_are_ended_by_the_next_start(tmp_path: Path) -> None:
    """A real local Ray whose driver is SIGKILLed: its dashboard and runtime-env agents outlive it
    under PID 1 (seen with Ray 2.5x); ``end_leftovers`` ends every process of the session: Ray's
    markers (its titles, its programs and scripts) and the session's path know each of them."""
    env = os.environ | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True, env=env)
    session = driver.stdout.readline().strip()
    try:
        assert session and len(session_processes(session)) >= 3  # the GCS, the raylet, agents, workers
        record_session(tmp_path, session)
        driver.kill()
        driver.wait()
        time.sleep(2)
        left = session_processes(session)
        end_leftovers(tmp_path)
        assert session_processes(session) == [], f"left: {left}"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)
        assert _anything_of(session) == []  # none that Ray's markers missed
    finally:
        driver.kill()
        for p in session_processes(session) if session else []:
            p.kill()


def test_after_the_runs_own_stop_what_is_ended_is_a_debug_line_not_a_warning(
    tmp_path: Path, ray_root: Path, caplog
) -> None:
    session = ray_root / SESSION
    (session / "logs").mkdir(parents=True)
    # an agent still exiting after ray.shutdown
    slow = _start(HOLD_OPEN, str(session / "logs" / "agent.log"), title="ray::RuntimeEnvAgent")
    try:
        record_session(tmp_path, str(session))
        with caplog.at_level("DEBUG", logger="rredcot.launch.leftovers"):
            assert end_leftovers(tmp_path, after_own_stop=True) == [slow.pid]
        assert [r.levelname for r in caplog.records] == ["DEBUG"] and "outlived this run" in caplog.text
    finally:
        slow.kill()
        slow.wait()
