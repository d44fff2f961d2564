"""A run holds its name: an exclusive lock on its run directory for as long as its driver lives.

A second ``rredcot train`` of the same run (same ``run.dir``) used to truncate the live run's
``driver.log``, delete its worker logs, its Redis data and its TensorBoard files while the first
kept running. The lock is an ``flock`` on ``<run.dir>/.rredcot-lock``, taken before anything in the
directory is touched; the kernel drops it with the driver's file descriptor, so a driver killed by
SIGKILL leaves no stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from rredcot.common.errors import UserError

LOCK = ".rredcot-lock"


class RunLocked(UserError):
    """Another driver holds this run."""

    label = "cannot start"


def hold(run_dir: Path, name: str) -> Callable[[], None]:
    """Take run ``name``'s lock in ``run_dir``; returns its release. Raises ``RunLocked`` naming the
    live run's driver (pid, host, start) when another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 300).decode("utf-8", "replace").strip() or "a driver"
        os.close(fd)
        raise RunLocked(
            f"run {name!r} is already running in {run_dir} ({holder}): stop it first, or pick another "
            "run.name or run.dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(
        fd, f"driver pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode()
    )

    def release() -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    return release
