"""Console vs log file: the project's own lines on the console, everything in the file."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from rredcot.launch.logs import ConsoleFilter, tail


def record(name: str, level: int, **extra: object) -> logging.LogRecord:
    r = logging.LogRecord(name, level, __file__, 1, "msg", (), None)
    r.__dict__.update(extra)
    return r


def test_console_filter_keeps_ours_and_third_party_errors() -> None:
    f = ConsoleFilter()
    assert f.filter(record("rredcot.launch.driver", logging.INFO))
    assert not f.filter(record("vllm.engine", logging.INFO))
    assert not f.filter(record("ray", logging.WARNING))
    assert f.filter(record("deepspeed", logging.ERROR))
    assert not f.filter(record("rredcot.progress", logging.INFO, console=False))
    assert ConsoleFilter(verbose=True).filter(record("vllm.engine", logging.INFO))


def test_driver_logging_and_actor_redirect(tmp_path: Path) -> None:
    """In a child process: the console shows ours only, the file has everything; a redirected
    process's C-level and Python output both land in its file."""
    code = f"""
import logging, os, sys
from pathlib import Path
from rredcot.launch.logs import setup_driver_logging, redirect_output
setup_driver_logging(Path({str(tmp_path / "logs" / "driver.log")!r}))
logging.getLogger("rredcot.x").info("ours")
logging.getLogger("vllm").info("theirs")
redirect_output(Path({str(tmp_path / "logs" / "gen0.log")!r}))
print("python print")
os.write(1, b"raw fd write\\n")
logging.getLogger("vllm").info("after redirect")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ours" in out.stdout and "theirs" not in out.stdout and "python print" not in out.stdout
    driver = (tmp_path / "logs" / "driver.log").read_text()
    assert "ours" in driver and "theirs" in driver
    worker = tail(tmp_path / "logs" / "gen0.log")
    assert "python print" in worker and "raw fd write" in worker and "after redirect" in worker
    assert tail(tmp_path / "missing.log") == ""


def test_setup_returns_the_previous_handlers(tmp_path: Path) -> None:
    from rredcot.launch.logs import setup_driver_logging

    root = logging.getLogger()
    before = list(root.handlers)
    restore = setup_driver_logging(tmp_path / "driver.log")
    assert root.handlers != before and len(root.handlers) == 2
    restore()
    assert root.handlers == before
