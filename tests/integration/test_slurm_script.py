"""``deploy/slurm/slurm.sbatch`` as ``sbatch`` runs it, on one machine: stand-ins for SLURM's own ``srun`` and
``scontrol`` (``slurm_shims/``; a step is a process group here), the real Ray, Redis and driver."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from rredcot.common.net import free_port
from rredcot.models.store import cache_dir
from tests.integration.test_launch_scripts import BIN, REPO

pytestmark = pytest.mark.slow


def stop_seconds(driver_log: str) -> float:
    """Seconds between the driver's "stopping:" line and its last line (the report written)."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in driver_log.splitlines()
        if re.match(r"\d{4}-\d\d-\d\d ", line)
    ]
    stopping = next(line for line in driver_log.splitlines() if "stopping: interrupted (SIGTERM)" in line)
    return (stamps[-1] - datetime.strptime(stopping[:23], "%Y-%m-%d %H:%M:%S,%f")).total_seconds()


def test_the_slurm_script_starts_ray_and_the_run_and_stops_it_in_order_before_the_time_limit(tmp_path):
    """``deploy/slurm/slurm.sbatch`` as ``sbatch`` runs it on a one-node allocation, with stand-ins for SLURM's
    own ``srun`` and ``scontrol`` (a step is a process group here): the head starts, the driver trains,
    and the USR1 that ``--signal=B:USR1@300`` sends before the time limit stops the run in order, as
    any SIGTERM to the driver does: within 30 s, the learner's checkpoint, the report (interrupted by
    SIGTERM); then the script ends this job's Ray node and no other."""
    root = Path(tempfile.mkdtemp(prefix="rsl", dir="/tmp"))
    env = {
        **os.environ,
        "PATH": f"{REPO / 'tests' / 'integration' / 'slurm_shims'}:{BIN}:{os.environ['PATH']}",
        "HOME": str(root),  # the job's Ray token goes there
        "RREDCOT_CACHE": str(cache_dir()),  # but the models come from the suite's cache: not built again
        "SLURM_JOB_NODELIST": "node1",
        "RAY_PORT": str(free_port()),
        "NUM_GPUS": "0",
        "NUM_CPUS": "4",
        "RAY_START_EXTRA": f"--include-dashboard=false --dashboard-agent-listen-port=0 --temp-dir={root}/ray",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",  # a stopped node drains 30 s by default
    }
    for name in ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(name, None)
    run = root / "run"
    job = subprocess.Popen(
        # a progress line each second: the test signals at the first one past step 0 (every 15 s by default)
        [
            "bash",
            "deploy/slurm/slurm.sbatch",
            "tests",
            f"run.dir={run}",
            "run.steps=40",
            "data.eval_size=0",
            "logging.progress_every_s=1",
        ],
        cwd=REPO,
        env=env,
        stdout=open(root / "job.log", "w"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
    )
    try:
        deadline, driver_log = time.monotonic() + 420, run / "logs" / "driver.log"
        while not (driver_log.is_file() and re.search(r"training step [1-9]\d*/", driver_log.read_text())):
            assert job.poll() is None and time.monotonic() < deadline, (root / "job.log").read_text()[-3000:]
            time.sleep(2)
        job.send_signal(signal.SIGUSR1)
        assert job.wait(180) != 0
        summary = json.loads((run / "report" / "summary.json").read_text())
        assert summary["status"] == "interrupted (SIGTERM)"  # the driver's orderly stop, report written
        assert 0 < summary["steps"] < 40 and summary["learner_stopped_in_time"] is True
        assert list((run / "checkpoints").glob("step-*")), "no checkpoint at the stop"
        assert (run / "report" / "summary.md").read_text().startswith("# rredcot run report")
        assert stop_seconds(driver_log.read_text()) <= 30  # from the SIGTERM to the report
        log = (root / "job.log").read_text()
        assert "time limit near: stopping the run in order" in log
        assert not [p for p in psutil.process_iter(["cmdline"]) if any(str(root) in a for a in p.info["cmdline"] or [])]
    finally:
        if job.poll() is None:
            job.kill()
        for p in psutil.process_iter(["cmdline"]):
            if any(str(root) in arg for arg in p.info["cmdline"] or []):
                p.kill()
        shutil.rmtree(root, ignore_errors=True)
