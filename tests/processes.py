"""Ending what a test started in a process group of its own."""

from __future__ import annotations

import os
import signal
import subprocess


def end_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s process group (``ray start --block`` then stops the daemons it started),
    SIGKILL after ``grace_s``: a Ray head was seen to ignore SIGTERM for a minute, and nothing may stay."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
