"""A run holds its name: a second driver of the same run refuses before it touches the run's files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.driver import train
from rredcot.launch.run_dir import RUN_MARKER
from rredcot.launch.run_lock import RunLocked, hold

HOLDER = "import sys, time\nfrom pathlib import Path\nfrom rredcot.launch.run_lock import hold\n"
HOLDER += "hold(Path(sys.argv[1]), 'x')\nprint('held', flush=True)\ntime.sleep(600)\n"


def test_a_second_holder_is_refused_with_the_live_drivers_pid(tmp_path: Path) -> None:
    release = hold(tmp_path, "exp")
    with pytest.raises(RunLocked, match=rf"run 'exp' is already running in {tmp_path} \(driver pid {os.getpid()} on "):
        hold(tmp_path, "exp")
    release()
    hold(tmp_path, "exp")()  # free again once released


def test_a_driver_killed_by_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(RunLocked, match=f"driver pid {proc.pid}"):
        hold(tmp_path, "x")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    hold(tmp_path, "x")()  # the kernel dropped the lock with the process


def test_train_refuses_a_live_run_before_touching_its_files(tmp_path: Path) -> None:
    """The same run started again used to truncate the live run's driver.log and delete its logs,
    Redis data and TensorBoard files while the live one kept running."""
    run_dir = tmp_path / "dup"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("dup\n")
    (run_dir / "logs" / "driver.log").write_text("the live run's log\n")
    (run_dir / "logs" / "gen0.log").write_text("a worker's log\n")
    release = hold(run_dir, "dup")
    cfg = load_config("tests", ["model.path=tiny-qwen3", "run.name=dup", f"run.dir={run_dir}"])
    try:
        with pytest.raises(RunLocked, match="run 'dup' is already running"):
            train(cfg)
    finally:
        release()
    assert (run_dir / "logs" / "driver.log").read_text() == "the live run's log\n"
    assert (run_dir / "logs" / "gen0.log").read_text() == "a worker's log\n"
