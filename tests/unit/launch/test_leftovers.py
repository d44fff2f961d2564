"""What a killed driver's local Ray leaves running is ended by the run's next start, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rredcot.launch.leftovers import SESSION_FILE, end_leftovers, record_session, session_processes

HOLD_OPEN = "import sys, time; f = open(sys.argv[1], 'a'); print('up', flush=True); time.sleep(120)"


def _start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_the_processes_of_the_recorded_session_are_ended_and_no_other(tmp_path: Path) -> None:
    session, other = tmp_path / "session_1_42", tmp_path / "session_2_43"
    for d in (session, other):
        (d / "logs").mkdir(parents=True)
    holds_a_log = _start(HOLD_OPEN, str(session / "logs" / "agent.log"))  # a retitled agent: only its files say
    names_it = _start(f"print('up', flush=True); import time; time.sleep(120)  # {session}")
    unrelated = _start(HOLD_OPEN, str(other / "logs" / "agent.log"))  # another run's session
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        record_session(run_dir, str(session))
        ended = end_leftovers(run_dir)
        assert sorted(ended) == sorted([holds_a_log.pid, names_it.pid])
        assert holds_a_log.poll() is not None and names_it.poll() is not None  # ended (and reaped)
        assert unrelated.poll() is None and not (run_dir / SESSION_FILE).exists()
        assert end_leftovers(run_dir) == []  # nothing recorded any more
    finally:
        for p in (holds_a_log, names_it, unrelated):
            p.kill()
            p.wait()


_DRIVER = """
import os, ray, time
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
ray.get(ray.remote(lambda: 1).remote())
print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_sigkilled_drivers_ray_agents_are_ended_by_the_next_start(tmp_path: Path) -> None:
    """A real local Ray whose driver is SIGKILLed: its dashboard and runtime-env agents outlive it
    under PID 1 (seen with Ray 2.5x); ``end_leftovers`` ends every process of the session."""
    env = os.environ | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True, env=env)
    session = driver.stdout.readline().strip()
    try:
        assert session and len(session_processes(session)) >= 3  # the driver, the GCS, the raylet, agents
        record_session(tmp_path, session)
        driver.kill()
        driver.wait()
        time.sleep(2)
        left = session_processes(session)
        end_leftovers(tmp_path)
        assert session_processes(session) == [], f"left: {left}"
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in left)
    finally:
        driver.kill()
        for p in session_processes(session) if session else []:
            p.kill()


def test_after_the_runs_own_stop_what_is_ended_is_a_debug_line_not_a_warning(tmp_path: Path, caplog) -> None:
    session = tmp_path / "session_3_44"
    (session / "logs").mkdir(parents=True)
    slow = _start(HOLD_OPEN, str(session / "logs" / "agent.log"))  # an agent still exiting after ray.shutdown
    try:
        record_session(tmp_path, str(session))
        with caplog.at_level("DEBUG", logger="rredcot.launch.leftovers"):
            assert end_leftovers(tmp_path, after_own_stop=True) == [slow.pid]
        assert [r.levelname for r in caplog.records] == ["DEBUG"] and "outlived this run" in caplog.text
    finally:
        slow.kill()
        slow.wait()
