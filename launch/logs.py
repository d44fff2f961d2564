"""Where output goes: the project's own lines on the console, everything in the run's log files.

The driver logs to ``<run.dir>/logs/driver.log`` (everything) and to the console (rredcot's own
INFO lines, other libraries' errors; everything with ``--verbose``). Each Ray actor sends its whole
stdout and stderr — vLLM's, Ray's and DeepSpeed's INFO lines included — to ``logs/<worker>.log``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
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


def setup_driver_logging(log_file: Path, verbose: bool = False, append: bool = True) -> Callable[[], None]:
    """Root logger → ``log_file`` (INFO, everything; overwritten unless ``append``) and stdout
    (filtered, short lines); returns the function that puts the previous handlers and level back."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    for h in before:
        root.removeHandler(h)
    root.setLevel(logging.INFO)
    to_file = logging.FileHandler(log_file, mode="a" if append else "w", encoding="utf-8")
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
