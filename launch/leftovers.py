"""Ray processes a dead driver left behind: recorded by their session, ended at the run's next start.

A driver killed during its stop (SIGKILL, the OOM killer) can leave the local Ray's agents running
under PID 1, where they ignore SIGTERM. The driver writes its local Ray's session directory into the
run directory; a later start of the same run (which holds the run's lock, so that driver is gone)
ends every process of this user that names the session or holds a file open under it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil

from rredcot.common.files import write_text_atomic

log = logging.getLogger(__name__)

SESSION_FILE = ".ray-session"  # in the run directory: the local Ray session its driver started


def record_session(run_dir: Path, session_dir: str) -> None:
    """Remember the local Ray session of the run's driver (its processes are ended at the next start)."""
    write_text_atomic(run_dir / SESSION_FILE, session_dir)


def session_processes(session_dir: str) -> list[psutil.Process]:
    """This user's processes (not this one) whose command line names ``session_dir`` or that hold a
    file open under it (Ray's agents retitle themselves, but keep their session's log files open)."""
    found, uid, prefix = [], os.getuid(), session_dir.rstrip("/") + "/"
    for p in psutil.process_iter(["cmdline", "uids"]):
        try:
            if p.pid == os.getpid() or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if session_dir in " ".join(p.info["cmdline"] or []) or any(
                f.path.startswith(prefix) for f in p.open_files()
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def end_leftovers(run_dir: Path, after_own_stop: bool = False) -> list[int]:
    """End (SIGKILL) what is left of the session recorded in ``run_dir``; returns their PIDs.
    ``after_own_stop``: the run's own driver, after its Ray's shutdown (a debug line, not a warning)."""
    recorded = run_dir / SESSION_FILE
    if not recorded.exists():
        return []
    session = recorded.read_text().strip()
    procs = session_processes(session) if session else []
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
