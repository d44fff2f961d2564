"""torch's JIT-built extension ops (DeepSpeed builds its shared-memory op on the first distributed init).

A build holds ``<dir>/<op>/lock`` while it compiles, and every other process that needs the op
waits until the lock file is gone, with no time limit: a process killed during the build (a
SIGKILLed learner, a stopped run) leaves the lock behind, and every later start on that machine
hangs there for good. :func:`await_build_locks` waits for a build in progress and removes a lock
older than any build takes.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

STALE_LOCK_S = 180.0  # a build takes 20-35 s on 2 busy cores: a lock this old has no builder left


def extensions_dir() -> Path:
    """Where the ops are built and kept: ``TORCH_EXTENSIONS_DIR``, set to ``~/.cache/torch_extensions``
    when unset (so that set-up's warm-up and every worker share one build)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def await_build_locks(root: Path, stale_s: float = STALE_LOCK_S, poll_s: float = 0.5) -> list[Path]:
    """Wait until no op under ``root`` is being built; remove (with a warning) each lock that is
    ``stale_s`` old. Returns the locks removed."""
    removed = []
    for lock in sorted(root.glob("*/lock")):
        while True:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # the build finished
                break
            if age >= stale_s:
                log.warning(
                    "removing %s: a JIT build of this op left it %.0f s ago and no build has finished since "
                    "(a process killed while building); without this every start would wait on it for good",
                    lock,
                    age,
                )
                lock.unlink(missing_ok=True)
                removed.append(lock)
                break
            time.sleep(poll_s)
    return removed
