"""Ray processes a dead driver left behind: recorded by their session, ended at the run's next start.

A driver killed during its stop (SIGKILL, the OOM killer) can leave the local Ray's agents running
under PID 1, where they ignore SIGTERM. The driver writes its local Ray's session directory into the
run directory; a later start of the same run (which holds the run's lock, so that driver is gone)
ends what is left of that session.

The recorded path is a file anyone who can write ``run.dir`` can change, so it decides nothing by
itself: it must be a Ray session directory of this user under Ray's temp root, named as Ray names
them (``session_<date>_<time>_<microseconds>_<pid>``), and a process is ended only when it is a Ray
process by its own markers (a title Ray gives its processes, or a program or script of the installed
Ray package) and belongs to that session (names it on its command line, or holds a file open under
it). Anything else is refused with one line, and nothing is ended.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
from functools import cache
from pathlib import Path

import psutil

from rredcot.common.files import write_text_atomic

log = logging.getLogger(__name__)

SESSION_FILE = ".ray-session"  # in the run directory: the local Ray session its driver started
# ray._private.node: f"session_{datetime.today().strftime('%Y-%m-%d_%H-%M-%S_%f')}_{os.getpid()}"
SESSION_NAME = re.compile(r"session_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}_\d{6}_\d+")
# the titles Ray gives the processes it retitles (workers and actors ``ray::IDLE``, ``ray::Generator``,
# agents ``ray::DashboardAgent``; the dashboard's modules ``ray-dashboard-NodeHead-0``)
RAY_TITLES = ("ray::", "ray-dashboard-")


def record_session(run_dir: Path, session_dir: str) -> None:
    """Remember the local Ray session of the run's driver (its processes are ended at the next start)."""
    write_text_atomic(run_dir / SESSION_FILE, session_dir)


def ray_temp_root() -> Path:
    """Where a local Ray started with no ``_temp_dir`` puts its sessions, as
    ``ray._common.utils.get_default_ray_temp_dir`` finds it (without importing ray)."""
    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp"
    return Path(base, "ray").resolve()


def why_not_a_session(session_dir: str) -> str | None:
    """None when ``session_dir`` is a Ray session directory of this user under Ray's temp root;
    otherwise what it is not."""
    if not session_dir or not os.path.isabs(session_dir):
        return "not an absolute path"
    path = Path(session_dir).resolve()
    root = ray_temp_root()
    if path.parent != root:
        return f"not directly under Ray's temp root {root}"
    if not SESSION_NAME.fullmatch(path.name):
        return "not named as Ray names a session (session_YYYY-MM-DD_HH-MM-SS_<microseconds>_<pid>)"
    try:
        st = path.lstat()
    except OSError:
        return "no such directory"
    if not path.is_dir():
        return "not a directory"
    if st.st_uid != os.getuid():
        return "not owned by this user"
    return None


@cache
def _ray_package() -> str | None:
    """The installed Ray package's directory, found without importing it."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.realpath(spec.origin)) + os.sep


def is_ray_process(cmdline: list[str], exe: str | None) -> bool:
    """A process is Ray's by its own markers: a title Ray gives it, or a program (``gcs_server``,
    ``raylet``) or script (the dashboard, the monitors, ``default_worker.py``) of the installed Ray."""
    if cmdline and cmdline[0].startswith(RAY_TITLES):
        return True
    package = _ray_package()
    if package is None:
        return False
    paths = [exe or "", *cmdline[:3]]  # the program, or the interpreter's script (``python -u <script>``)
    return any(p.startswith(package) or os.path.realpath(p).startswith(package) for p in paths if p.startswith("/"))


def session_processes(session_dir: str) -> list[psutil.Process]:
    """This user's Ray processes (not this one) of ``session_dir``: their command line names it, or
    they hold a file open under it (Ray's agents retitle themselves, but keep their session's log
    files open). Empty when ``session_dir`` is no Ray session directory (``why_not_a_session``)."""
    if why_not_a_session(session_dir) is not None:
        return []
    session = str(Path(session_dir).resolve())
    found, uid, prefix = [], os.getuid(), session + "/"
    for p in psutil.process_iter(["cmdline", "uids", "exe"]):
        try:
            if p.pid == os.getpid() or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            cmdline = p.info["cmdline"] or []
            if not is_ray_process(cmdline, p.info["exe"]):
                continue
            if any(session in arg for arg in cmdline) or any(f.path.startswith(prefix) for f in p.open_files()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_leftovers(run_dir: Path, after_own_stop: bool = False) -> list[int]:
    """End (SIGKILL) what is left of the session recorded in ``run_dir``; returns their PIDs.
    ``after_own_stop``: the run's own driver, after its Ray's shutdown (a debug line, not a warning).
    A recorded path that is no Ray session directory is refused with one warning, and nothing ended."""
    recorded = run_dir / SESSION_FILE
    if not recorded.exists():
        return []
    session, refused = "", "not a regular file"
    if recorded.is_file():  # not a FIFO that blocks the read, nor a device
        with recorded.open("rb") as f:
            session = f.read(4096).decode("utf-8", "replace").strip()
        refused = why_not_a_session(session)
    if refused is not None:
        recorded.unlink(missing_ok=True)
        # a session directory removed since (a reboot, a cleaned /tmp) has no process left: a debug line
        (log.debug if refused == "no such directory" else log.warning)(
            "%s names %r, which is no Ray session directory (%s): ending no process for it",
            recorded,
            session,
            refused,
        )
        return []
    procs = session_processes(session)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=5)
    recorded.unlink(missing_ok=True)
    if procs:
        whose = (
            "that outlived this run's Ray shutdown" if after_own_stop else "an earlier driver of this run left behind"
        )
        (log.debug if after_own_stop else log.warning)(
            "ended %d process(es) %s, of Ray session %s (pids %s)",
            len(procs),
            whose,
            session,
            ", ".join(str(p.pid) for p in procs),
        )
    return [p.pid for p in procs]
