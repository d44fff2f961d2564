"""Console vs log file: the project's own lines on the console, everything in the file."""

from __future__ import annotations

import errno
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from rredcot.launch.observe.logs import ConsoleFilter, WorkerFailed, route_ray_errors_to_log, tail


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
from rredcot.launch.observe.logs import setup_driver_logging, redirect_output
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
    from rredcot.launch.observe.logs import setup_driver_logging

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


class FullDisk:
    """A stub file whose writes fail as on a full disk (or work again when ``full`` is False)."""

    def __init__(self) -> None:
        self.full, self.written = True, ""

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written += text
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_full_disk_under_the_driver_log_is_one_console_line_not_a_traceback_per_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 62: a full disk flooded the console with 470 lines (logging's traceback for every record
    driver.log could not take); now the first failure is one line naming the file, why and the free
    space, the rest are dropped until a write succeeds again."""
    from rredcot.launch.observe.logs import setup_driver_logging

    log_file = tmp_path / "logs" / "driver.log"
    restore = setup_driver_logging(log_file)
    try:
        (handler,) = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
        disk = handler.stream = FullDisk()
        for i in range(300):
            logging.getLogger("rredcot.launch.driver").info("progress line %d", i)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err[:20]
        assert f"cannot write {log_file} (No space left on device; " in err[0] and " MiB free there)" in err[0]
        assert "-> free disk space or set run.dir elsewhere" in err[0]
        disk.full = False
        logging.getLogger("rredcot.launch.driver").info("room again")
        assert capsys.readouterr().err.strip().endswith(f"{log_file} is written again")
        assert disk.written.rstrip().endswith("room again")
    finally:
        restore()


def test_write_failures_say_each_paths_first_failure_once_with_its_free_space(tmp_path: Path) -> None:
    from rredcot.launch.observe.logs import WriteFailures, write_failed_line

    said: list[str] = []
    failures, disk = WriteFailures(said.append), FullDisk()
    for path in (tmp_path / "history.jsonl", tmp_path / "tensorboard") * 100:
        try:
            disk.write("x")
        except OSError as e:
            failures.failed(path, e)
    assert len(said) == 2 and failures.dropped == 198
    assert said[0].startswith(f"cannot write {tmp_path / 'history.jsonl'} (No space left on device; ")
    failures.succeeded(tmp_path / "tensorboard")
    failures.failed(tmp_path / "tensorboard", OSError(errno.ENOSPC, "No space left on device"))
    assert said[2:] == [f"{tmp_path / 'tensorboard'} is written again", said[1]]
    line = write_failed_line(tmp_path / "nope" / "deeper" / "x", OSError(errno.EACCES, "Permission denied"))
    assert "(Permission denied; " in line and "MiB free there" in line and "check the path's filesystem" in line


def test_the_monitor_keeps_its_history_in_memory_when_its_file_cannot_be_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rredcot.common.config import load_config
    from rredcot.launch.observe.monitor import Monitor

    class Control:
        n = 0

        def all_metrics(self) -> dict:
            self.n += 1
            return {"learner0": {"tier": "learner", "step": float(self.n), "version": float(self.n)}}

    cfg = load_config("tests", ["logging.tensorboard=false"])
    monitor = Monitor(cfg, Control(), tmp_path / "tb", {}, tmp_path / "history.jsonl")
    monitor._history_file.close()
    monitor._history_file = FullDisk()
    with caplog.at_level(logging.WARNING):
        for _ in range(50):
            monitor.poll()
    assert len(monitor.history) == 50
    (line,) = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert line.startswith(f"cannot write {tmp_path / 'history.jsonl'} (No space left on device")
