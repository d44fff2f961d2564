"""A run's directory and Redis keys: claimed for the run by its marker, and cleared by ``run.resume=never``
only where the run itself wrote (the marker's directory, the keys under the run's prefix)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rredcot.common.config import ConfigError
from rredcot.common.streams import registered_keys

log = logging.getLogger(__name__)

# what ``run.resume=never`` clears in a run directory that carries this run's marker
RUN_DIR_OUTPUTS = ("logs", "redis", "checkpoints", "weights", "traces", "tensorboard", "report", "placement.json")
RUN_MARKER = ".rredcot-run"  # written by rredcot into each run directory it creates: the run's name


class RunDirError(ConfigError):
    """A run directory this run may not clear: it holds files rredcot did not write for this run."""


WRITABLE_FIX = "set run.dir to a directory this user can write (the run keeps its logs and checkpoints there)"


def run_dir_problem(run_dir: Path) -> str:
    """Why this process cannot make ``run_dir`` or write in it, with the fix, as one line (the caller
    names the key, ``run.dir``); "" when it can. Nothing is created (the file made to try has no name
    and goes when closed)."""
    try:
        existing = next(p for p in (run_dir, *run_dir.parents) if p.exists())
    except OSError as e:  # a directory on the way this user may not look into
        return f"{run_dir}: cannot look at {e.filename} ({e.strerror}) -> {WRITABLE_FIX}"
    if not existing.is_dir():
        what = "a file" if existing.is_file() else "no directory (a FIFO, socket or device)"
        if existing == run_dir:
            return f"{run_dir} is {what} -> set run.dir to a directory, or to a path rredcot creates"
        return f"{run_dir} lies under {existing}, which is {what} -> set run.dir to a path under a directory"
    try:
        if existing == run_dir:
            with os.scandir(run_dir) as entries:  # the claim looks inside
                next(entries, None)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        return f"{run_dir}: this user cannot write in {existing} ({e.strerror or e}) -> {WRITABLE_FIX}"
    return ""


def claim_run_dir(run_dir: Path, name: str, resume: str) -> None:
    """Create ``run_dir`` with this run's marker, or find the marker there.

    ``run.resume=never`` on a directory that has content but no marker naming ``name`` raises
    ``RunDirError`` (nothing is deleted); ``auto`` resumes from such a directory without marking it.
    """
    marker = run_dir / RUN_MARKER
    if marker.is_file() and marker.read_text().strip() == name:
        return
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        if resume == "never":
            raise RunDirError(
                f"run.dir {run_dir} is not empty and has no {RUN_MARKER} file naming run {name!r}, so "
                "run.resume=never will not clear it: pick another run.dir or run.name, or continue it "
                "with run.resume=auto"
            )
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(name + "\n")


def clear_run_dir(run_dir: Path, keep: Path) -> None:
    """``run.resume=never`` starts afresh: list, then remove, what an earlier run of this name left
    in its (marked) directory; ``keep`` is the driver's new log file."""
    doomed: list[Path] = []
    for path in (run_dir / name for name in RUN_DIR_OUTPUTS):
        if path == keep.parent and path.is_dir() and not path.is_symlink():
            doomed += [p for p in sorted(path.iterdir()) if p != keep]
        elif path.exists() or path.is_symlink():
            doomed.append(path)
    if doomed:
        log.info("run.resume=never: deleting the earlier run's %s", ", ".join(map(str, doomed)))
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def clear_run_keys(client: Any, run_id: str) -> None:
    """``run.resume=never`` on a shared server: list, then delete, the keys an earlier run of this
    name registered (its streams, counters, metrics); nothing else."""
    names = registered_keys(client, run_id)
    if client.exists(names[-1]):  # the registry: an earlier run of this name wrote keys here
        log.info("run.resume=never: deleting the earlier run's Redis keys %s", ", ".join(names))
        client.delete(*names)
