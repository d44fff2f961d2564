"""Where output goes: the project's own lines on the console, everything in the run's log files.

The driver logs to ``<run.dir>/logs/driver.log`` (everything) and to the console (rredcot's own
INFO lines, other libraries' errors; everything with ``--verbose``). Each Ray actor sends its whole
stdout and stderr — vLLM's, Ray's and DeepSpeed's INFO lines included — to ``logs/<worker>.log``.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rredcot.common.errors import UserError

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ConsoleFilter(logging.Filter):
    """rredcot's INFO and above, and ERROR from other libraries (all of it when ``verbose``);
    records logged with ``extra={"console": False}`` go to the file only."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", True) is False:
            return False
        return self.verbose or record.name.startswith("rredcot") or record.levelno >= logging.ERROR


DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk, a quota, a file-size limit


def free_mib(path: str | Path) -> float | None:
    """Free space (MiB) on the filesystem of ``path`` or of its nearest existing parent; None if unknown."""
    here = Path(path)
    for folder in (here, *here.parents):
        try:
            return shutil.disk_usage(folder).free / 2**20
        except OSError:
            continue
    return None


def write_failed_line(path: str | Path, error: OSError) -> str:
    """The one line that says a run's write failed: the path, why, the free space left there, the fix."""
    why = error.strerror or str(error) or type(error).__name__
    free = free_mib(path)
    room = f"; {free:.0f} MiB free there" if free is not None else ""
    if error.errno in DISK_FULL:
        fix = "free disk space or set run.dir elsewhere"
    else:
        fix = "check the path's filesystem and permissions"
    return (
        f"cannot write {path} ({why}{room}) -> {fix}; until a write to it succeeds again, its failures are not repeated"
    )


class WriteFailures:
    """Writes of a run that may fail (a full disk): the first failure of each path is one line
    (``write_failed_line``) given to ``say``, the later ones are dropped in silence, until a write to
    that path succeeds again (said too), so a full disk is a line, not a traceback per record."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.failing: set[str] = set()
        self.dropped = 0  # failed writes not said

    def failed(self, path: str | Path, error: OSError) -> None:
        if str(path) in self.failing:
            self.dropped += 1
            return
        self.failing.add(str(path))
        self.say(write_failed_line(path, error))

    def succeeded(self, path: str | Path) -> None:
        if str(path) in self.failing:
            self.failing.discard(str(path))
            self.say(f"{path} is written again")


def say_on_console(line: str) -> None:
    """A warning on the driver's console (stderr), past logging: for what cannot go through a log file."""
    print(f"{time.strftime('%H:%M:%S')} rredcot: warning: {line}", file=sys.stderr, flush=True)


class RunLogHandler(logging.FileHandler):
    """``driver.log``: a record it cannot write (a full disk) is one line on the console, not
    logging's traceback per record (470 console lines in a run on a full disk)."""

    def __init__(self, path: Path, mode: str, say: Callable[[str], None] = say_on_console) -> None:
        super().__init__(path, mode=mode, encoding="utf-8")
        self.failures = WriteFailures(say)
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)
        if not self._failed and self.failures.failing:
            self.failures.succeeded(self.baseFilename)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self._failed = True
        self.failures.failed(self.baseFilename, error)


def setup_driver_logging(log_file: Path, verbose: bool = False, append: bool = True) -> Callable[[], None]:
    """Root logger → ``log_file`` (INFO, everything; overwritten unless ``append``) and stdout
    (filtered, short lines); returns the function that puts the previous handlers and level back."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    for h in before:
        root.removeHandler(h)
    root.setLevel(logging.INFO)
    to_file = RunLogHandler(log_file, mode="a" if append else "w")
    to_file.setFormatter(logging.Formatter(FORMAT))
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    console.addFilter(ConsoleFilter(verbose))
    root.addHandler(to_file)
    root.addHandler(console)

    def restore() -> None:
        for h in (to_file, console):
            root.removeHandler(h)
            h.close()
        for h in before:
            root.addHandler(h)
        root.setLevel(level)

    return restore


def route_library_loggers(*names: str) -> None:
    """Libraries that install their own console handlers (Ray): send their records to ours instead."""
    for name in names:
        lib = logging.getLogger(name)
        for h in list(lib.handlers):
            lib.removeHandler(h)
        lib.propagate = True


def route_ray_errors_to_log() -> None:
    """Ray's driver prints what its raylet publishes ("A worker died or was killed …") straight to
    stdout, past logging and ``log_to_driver=False``: send it to driver.log instead (the run's own
    line says which worker failed and where its log is)."""
    import ray._private.worker as ray_worker

    def to_log(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        for line in data.get("lines", []):
            logging.getLogger("ray").info("(%s) %s", data.get("pid"), line, extra={"console": False})

    if hasattr(ray_worker, "print_to_stdstream"):  # the name Ray's error listener calls at each message
        ray_worker.print_to_stdstream = to_log


def redirect_output(log_file: Path) -> None:
    """This process's stdout and stderr (Python and C++ alike) → ``log_file`` (appended); Python
    logging at INFO to it as well."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr, force=True)


def tail(log_file: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist here)."""
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def headline(error: BaseException) -> str:
    """The first non-empty line of an error's message ("" when it has none)."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def own_error(error: BaseException) -> BaseException:
    """A worker's own exception where Ray wraps it (``RayTaskError.cause``), else ``error``."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error


def what_failed(error: BaseException) -> str:
    """A worker's failure in a few words: its process's death, or its exception's type and first line."""
    if type(error).__name__ == "ActorDiedError" and not getattr(error, "actor_init_failed", False):
        exit_type = re.search(r"Worker exit type: (\w+)", str(error))
        how = f"; Ray says {exit_type[1]}" if exit_type else ""
        return f"its process died (killed by a signal, the out-of-memory killer or a crash{how})"
    if isinstance(error, UserError):
        return headline(error)
    return f"{type(error).__name__}: {headline(error)}"


class WorkerFailed(RuntimeError):
    """A stage worker's ``run()`` failed: which worker, its own error in one line, where its log is
    (Ray's tracebacks stay in the logs)."""

    def __init__(self, worker: str, error: BaseException, log_path: Path) -> None:
        self.worker, self.error, self.log_path = worker, own_error(error), log_path
        super().__init__(f"{worker}: {what_failed(self.error)}; its log: {log_path}")
