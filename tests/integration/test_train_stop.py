"""``rredcot train`` as a user runs it, stopped mid-run by SIGTERM: it ends within 30 s with a
checkpoint and the report, prints progress lines when stdout is no terminal, and leaves no Ray
daemon behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

GRACE_S = 30.0


def ray_daemons() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] in ("gcs_server", "raylet")}


def learner_step(driver_log: Path) -> int:
    """The newest progress line's learner step (0 before training)."""
    text = driver_log.read_text() if driver_log.exists() else ""
    steps = re.findall(r"training step (\d+)/", text)
    return int(steps[-1]) if steps else 0


def test_sigterm_mid_run_stops_in_order(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = ray_daemons()
    # as a user's shell has it: without the tests' RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER (rredcot sets it)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"} | {"PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "rredcot.launch.cli",
        "train",
        "tests",
        f"run.dir={run_dir}",
        "run.name=stoptest",
        "run.steps=400",
        "data.eval_size=0",
        "logging.progress=true",
        "logging.progress_every_s=1",  # the test reads the learner's step from these lines
    ]
    out = (tmp_path / "console.log").open("w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    driver_log = run_dir / "logs" / "driver.log"
    deadline = time.monotonic() + 300
    try:
        while learner_step(driver_log) < 1:
            assert proc.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run took no training step in time"
            time.sleep(1)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    console = (tmp_path / "console.log").read_text()
    assert took <= GRACE_S, f"stopped {took:.1f} s after SIGTERM"
    assert proc.returncode == 130  # interrupted: not a success, whatever the report says
    first = console.splitlines()[0]
    assert "run 'stoptest': starting an embedded Redis, a local Ray" in first and "dtype float32" in first
    assert "training step" in console and "ETA" in console  # plain progress lines: stdout is a file
    assert "INFO 1" not in console  # vLLM's INFO lines stay in the workers' logs ...
    assert any("INFO" in p.read_text() for p in (run_dir / "logs").glob("gen0.log"))  # ... which have them
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["status"] == "interrupted (SIGTERM)" and 1 <= summary["steps"] < 400
    assert summary["learner_stopped_in_time"] is True
    assert list((run_dir / "checkpoints").glob("step-*")), "no checkpoint at the stop"
    assert (run_dir / "report" / "summary.md").read_text().startswith("# rredcot run report")
    time.sleep(2)
    assert not (ray_daemons() - before), "the run left Ray daemons behind"
