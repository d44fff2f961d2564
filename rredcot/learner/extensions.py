"""torch's JIT-built extension ops (DeepSpeed builds its shared-memory op on the first distributed init).

A build, and every first load of the op in a process, holds ``<dir>/<op>/lock`` while it compiles
or checks the build, and every other process that needs the op waits until the lock file is gone,
with no time limit: a process killed meanwhile (a SIGKILLed learner, a stopped run, a lost node)
leaves the lock behind, and every later start on that machine hangs there for good.
:func:`await_build_locks` waits for a build in progress and removes a lock older than any build
takes; and a learner loads DeepSpeed's shared-memory op with :func:`load_shm_op`, inside
:func:`holding_shm_op`, so that a lock of that op which no living learner can hold is removed at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import logging
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

STALE_LOCK_S = 180.0  # a build takes 20-35 s on 2 busy cores: a lock this old has no builder left
SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's shared-memory op: its build directory under extensions_dir()
HOLDERS = "holders"  # flocked (shared) by each process while it may hold SHM_OP's lock


SHARED_ROOT = Path.home() / ".cache" / "torch_extensions"


def extensions_dir() -> Path:
    """Where the ops are built and kept: ``TORCH_EXTENSIONS_DIR`` where the user set it, else
    ``~/.cache/torch_extensions/<build_key()>``, so that set-up's warm-up and every worker of one
    environment share one build. A build's command names the paths of torch, DeepSpeed and Python's
    headers, and ninja rebuilds when the command changes: two environments (two checkouts' .venv) in
    one directory rebuilt the op over each other's, 25-170 s each on 2 cores while every learner that
    needed it waited. Each environment has a directory of its own, and builds with its own ninja."""
    own_ninja_first()
    set_here = os.environ.get("TORCH_EXTENSIONS_DIR")
    if set_here is None or Path(set_here).parent == SHARED_ROOT:  # unset, or ours (maybe a parent's)
        os.environ["TORCH_EXTENSIONS_DIR"] = str(SHARED_ROOT / build_key())
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def own_ninja_first() -> None:
    """Put this interpreter's own ``ninja`` (the pip package, beside ``sys.executable``) first on PATH.
    torch runs whichever ``ninja`` PATH finds first, and ninja versions keep their build logs in formats
    the others discard (1.11: v5, 1.13: v7): a process started with the .venv's bin on PATH (a learner on
    a node that ``deploy/ray/ray_worker.sh`` started) and one started without it (``.venv/bin/python -m
    pytest``) rebuilt the op after each other all through a test suite."""
    here = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if (here / "ninja").is_file() and not path.startswith(f"{here}{os.pathsep}"):
        os.environ["PATH"] = f"{here}{os.pathsep}{path}"


def build_key() -> str:
    """What a JIT build's command depends on beyond the op's own flags: the compiler, the ninja that
    runs it, and the paths of Python's headers, torch and DeepSpeed (located, not imported), as a short
    digest."""
    parts = [os.environ.get("CXX", "c++"), str(shutil.which("ninja")), sysconfig.get_paths()["include"]]
    for name in ("torch", "deepspeed"):
        spec = importlib.util.find_spec(name)
        parts.append(str(Path(spec.origin).parent) if spec and spec.origin else "")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def await_build_locks(root: Path, stale_s: float = STALE_LOCK_S, poll_s: float = 0.5) -> list[Path]:
    """Wait until no op under ``root`` is being built; remove (with a warning) each lock that is
    ``stale_s`` old, or of SHM_OP with no process left inside ``holding_shm_op``. Returns the locks removed."""
    removed = []
    for lock in sorted(root.glob("*/lock")):
        while True:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # the build finished
                break
            orphaned = lock.parent.name == SHM_OP and not _held(lock.parent / HOLDERS)
            if age >= stale_s or orphaned:
                log.warning(
                    "removing %s: a JIT build or load of this op left it %.0f s ago and %s (a process killed "
                    "while building); without this every start would wait on it for good",
                    lock,
                    age,
                    "no process that could hold it is alive" if orphaned else "no build has finished since",
                )
                lock.unlink(missing_ok=True)
                removed.append(lock)
                break
            time.sleep(poll_s)
    return removed


def _held(holders: Path) -> bool:
    """Whether a living process is inside ``holding_shm_op`` (its shared flock, which the kernel drops
    when the process dies); True where the file system cannot tell (then only the lock's age counts)."""
    try:
        with open(holders, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except OSError:
        return True


@contextlib.contextmanager
def holding_shm_op(root: Path) -> Iterator[None]:
    """Hold SHM_OP's holders file (a shared flock) while this process may take the op's lock: its
    first load, which DeepSpeed then keeps for the process."""
    (root / SHM_OP).mkdir(parents=True, exist_ok=True)
    with open(root / SHM_OP / HOLDERS, "a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def load_shm_op(root: Path) -> None:
    """Load DeepSpeed's shared-memory op (building it where needed) inside ``holding_shm_op``, so that a
    lock this process leaves if killed meanwhile is told from a load in progress; DeepSpeed keeps the
    op for the process, and the line it prints when loaded is dropped."""
    from deepspeed.comm.torch import build_shm_op

    with holding_shm_op(root), contextlib.redirect_stdout(io.StringIO()):
        build_shm_op()
