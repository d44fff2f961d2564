"""Console vs log file: the project's own lines on the console, everything in the file."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from rredcot.launch.logs import ConsoleFilter, WorkerFailed, route_ray_errors_to_log, tail


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


def test_a_failed_worker_is_one_line_with_its_own_error_and_its_log() -> None:
    """Ray wraps a worker's exception (``RayTaskError.cause``) and a dead process (``ActorDiedError``,
    whose message runs to a dozen lines); the line names the worker, its own error and its log."""
    from ray.exceptions import ActorDiedError

    from rredcot.actors.prompt_fit import NoPromptFits

    class Wrapped(Exception):  # what RayTaskError exposes: the worker's exception as .cause
        cause = ValueError("bad shape\n  (3, 4) vs (4, 3)")

    log = Path("/runs/x/logs/red0.log")
    assert str(WorkerFailed("red0", Wrapped(), log)) == f"red0: ValueError: bad shape; its log: {log}"
    died = WorkerFailed("gen0", ActorDiedError(), Path("gen0.log"))
    assert str(died).startswith("gen0: its process died (killed by a signal") and "\n" not in str(died)
    user = WorkerFailed("gen0", NoPromptFits("no training prompt fits"), Path("gen0.log"))
    assert str(user) == "gen0: no training prompt fits; its log: gen0.log" and isinstance(user.error, NoPromptFits)


def test_rays_error_printer_writes_to_the_log_not_the_console(caplog, capsys) -> None:
    import ray._private.worker as ray_worker

    route_ray_errors_to_log()
    with caplog.at_level(logging.INFO, logger="ray"):
        ray_worker.print_to_stdstream({"lines": ["A worker died or was killed"], "pid": "raylet", "is_err": False})
    out = capsys.readouterr()
    assert out.out == out.err == ""
    assert [r.getMessage() for r in caplog.records] == ["(raylet) A worker died or was killed"]
    assert all(r.console is False for r in caplog.records)
