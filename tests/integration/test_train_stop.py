"""``rredcot train`` as a user runs it, stopped by Ctrl-C: while it starts, it ends within 30 s with
one line; mid-run, a second Ctrl-C ends the orderly stop at once, and the report is still written;
it prints progress lines when stdout is no terminal and leaves no Ray daemon behind. (The orderly
stop by one SIGTERM, with the learner's checkpoint: tests/cluster/test_netns_slurm.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

GRACE_S = 30.0


def ray_daemons(driver_pid: int) -> set[int]:
    """The GCS and raylet of the Ray that ``driver_pid`` started (its session directory ends with the
    driver's pid), not those of other Ray instances on the machine (a parallel test worker's)."""
    session = re.compile(rf"session_[\d_-]+_{driver_pid}\b")
    return {
        p.pid
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] in ("gcs_server", "raylet") and session.search(" ".join(p.info["cmdline"] or []))
    }


def learner_step(driver_log: Path) -> int:
    """The newest progress line's learner step (0 before training)."""
    text = driver_log.read_text() if driver_log.exists() else ""
    steps = re.findall(r"training step (\d+)/", text)
    return int(steps[-1]) if steps else 0


def start_train(tmp_path: Path, *overrides: str) -> subprocess.Popen:
    """``rredcot train tests`` in ``tmp_path/run``, its console in ``tmp_path/console.log``, with the
    environment a user's shell has: without the tests' RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER (rredcot
    sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"} | {"PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rredcot.launch.cli", "train", "tests", f"run.dir={tmp_path / 'run'}", *overrides]
    out = (tmp_path / "console.log").open("w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def signal_when(
    proc: subprocess.Popen, ready: Callable[[], bool], sig: int, tmp_path: Path, wait_s: float, then_s: float = 0.0
) -> float:
    """Once ``ready()`` (checked while the run lives, for up to ``wait_s``) and ``then_s`` later, send
    ``sig``; returns the seconds the run took to exit after it (killed if it does not in 60 s)."""
    deadline = time.monotonic() + wait_s
    try:
        while not ready():
            assert proc.poll() is None, (tmp_path / "console.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not get there in time"
            time.sleep(0.2)
        time.sleep(then_s)
        signalled = time.monotonic()
        proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver_log = tmp_path / "run" / "logs" / "driver.log"
            logs = [p.read_text()[-3000:] for p in (tmp_path / "console.log", driver_log) if p.exists()]
            why = f"the run did not exit within 60 s of {signal.Signals(sig).name}"
            raise AssertionError("\n----\n".join([why, *logs])) from None
        return time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_during_start_up_ends_in_seconds_with_one_line(tmp_path: Path) -> None:
    """SIGINT while Ray, Redis and the workers start (what Ctrl-C sends): exit 130 within 30 s,
    ``rredcot: interrupted`` as the last line, no traceback, and nothing of the run left running."""
    proc = start_train(tmp_path, "run.name=ctrlc")
    driver_log = tmp_path / "run" / "logs" / "driver.log"
    started = lambda: "starting an embedded Redis" in (driver_log.read_text() if driver_log.exists() else "")
    took = signal_when(proc, started, signal.SIGINT, tmp_path, wait_s=120, then_s=2)  # while Ray comes up
    console = (tmp_path / "console.log").read_text()
    assert took <= GRACE_S and proc.returncode == 130, console[-3000:]
    assert console.rstrip().splitlines()[-1] == "rredcot: interrupted" and "Traceback" not in console, console
    time.sleep(2)
    assert not ray_daemons(proc.pid), "the run left Ray daemons behind"


def test_ctrl_c_twice_stops_at_once_and_still_writes_the_report(tmp_path: Path) -> None:
    """A second Ctrl-C while the run stops cuts the learner's grace period short; it used to end the
    run without its ``summary.json``. The console of a run whose stdout is a file: the first line says
    what starts, then plain progress lines, and vLLM's INFO lines only in the workers' logs. (The
    orderly stop by one signal: tests/cluster/test_netns_slurm.py, whose USR1 becomes the driver's SIGTERM.)"""
    run_dir = tmp_path / "run"
    proc = start_train(
        tmp_path,
        "run.name=twice",
        "run.steps=400",
        "data.eval_size=0",
        "logging.progress=true",
        "logging.progress_every_s=1",  # the test reads the learner's step from these lines
    )
    driver_log = run_dir / "logs" / "driver.log"
    deadline = time.monotonic() + 300
    while learner_step(driver_log) < 1:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "console.log").read_text()[-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # the first Ctrl-C; the second once the stop has begun
    stopping = lambda: "stopping: interrupted" in driver_log.read_text()
    took = signal_when(proc, stopping, signal.SIGINT, tmp_path, wait_s=30)
    console = (tmp_path / "console.log").read_text()
    assert proc.returncode == 130 and took <= GRACE_S, console[-3000:]
    assert "SIGINT again: not waiting for the learner's checkpoint" in console and "Traceback" not in console
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["status"] == "interrupted (SIGINT)" and summary["steps"] >= 1
    first = console.splitlines()[0]
    assert "run 'twice': starting an embedded Redis, a local Ray" in first and "dtype float32" in first
    assert "training step" in console and "ETA" in console  # plain progress lines: stdout is a file
    assert "INFO 1" not in console  # vLLM's INFO lines stay in the workers' logs ...
    assert "INFO" in (run_dir / "logs" / "gen0.log").read_text()  # ... which have them
    time.sleep(2)
    assert not ray_daemons(proc.pid), "the run left Ray daemons behind"


def test_a_worker_that_fails_says_its_own_error_in_one_line(tmp_path: Path) -> None:
    """Every prompt longer than the context: the generator stops the run, and the console's last
    line names it, its own error and its log (no Ray traceback, no raylet lines); exit 2, a user error."""
    long = "What is " + " + ".join(["1"] * 400) + "?"
    data = tmp_path / "long.jsonl"
    data.write_text(
        "\n".join(
            json.dumps({"problem": f"{long} ({i})", "solution": "Answer: 400", "answer": "400"}) for i in range(4)
        )
    )
    proc = start_train(
        tmp_path, "run.name=toolong", "task.name=math", "data.source=jsonl", f"data.path={data}", "data.eval_size=0"
    )
    proc.wait(timeout=300)
    console = (tmp_path / "console.log").read_text()
    last = console.rstrip().splitlines()[-1]
    log = tmp_path / "run" / "logs" / "gen0.log"
    assert proc.returncode == 2, console[-3000:]
    assert last.startswith("rredcot: error: gen0: no training prompt fits the context: all 4 were rejected"), last
    assert last.endswith(f"its log: {log}") and log.exists()
    assert "Traceback" not in console and "(raylet)" not in console and "ActorDiedError" not in console, console
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text())
    assert summary["status"].startswith("failed: gen0: no training prompt fits")
