"""The whole ``rredcot train`` killed with SIGKILL mid-run (its embedded Redis and local Ray go with
it), then ``rredcot train ... run.resume=auto``: the run restores the newest checkpoint, trains
again what was trained after it, finishes, and its ledger balances: every admitted prompt trained,
none lost (the streams, the ledger and the replay log come back from Redis' append-only file); and
the killed driver's Ray processes that outlived it (its agents) are ended by the resumed run's start."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from omegaconf import OmegaConf

from rredcot.launch.leftovers import SESSION_FILE, session_processes
from tests.integration.test_train_stop import learner_step, signal_when, start_train

OVERRIDES = (
    "run.name=drvkill",
    "run.steps=4",  # a checkpoint at step 2, the kill after step 3: step 3 is trained again
    "data.eval_size=0",
    "learner.checkpoint_every=2",
    "learner.skip_zero_advantage=false",
    "logging.progress=true",
    "logging.progress_every_s=1",  # the test reads the learner's step from these lines
    "redis.claim_idle_ms=2000",  # the dead run's pending entries come back within seconds
)


def test_killed_driver_resumes_and_loses_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(tmp_path, *OVERRIDES)
    signal_when(proc, lambda: learner_step(run_dir / "logs" / "driver.log") >= 3, signal.SIGKILL, tmp_path, 400)
    assert not (run_dir / "report" / "summary.json").exists()  # killed: no report
    session = (run_dir / SESSION_FILE).read_text()  # its local Ray, whose agents outlive the driver
    assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")]
    time.sleep(1)
    resumed = start_train(tmp_path, *OVERRIDES, "run.resume=auto")
    assert resumed.wait(timeout=600) == 0, (tmp_path / "console.log").read_text()[-3000:]
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    ledger, prompts = summary["ledger"], 4 * 2
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert ledger["balanced"] and ledger["missing"] == [] and ledger["admitted"] == prompts, ledger
    assert (ledger["trained"], ledger["dead"], ledger["rejected"], ledger["in_flight"]) == (prompts, 0, 0, 0)
    assert "resumed from" in (run_dir / "logs" / "learner0.log").read_text()  # not a fresh start
    # the resumed learner trained nothing more than η versions older than the weights it held
    eta = OmegaConf.load(run_dir / "config.yaml").staleness.eta
    stalest = re.search(
        r"\| learner0 \| learner \|.*staleness_max=(\d+)", (run_dir / "report" / "summary.md").read_text()
    )
    assert stalest is not None and int(stalest[1]) <= eta
    assert session_processes(session) == []  # the resumed run ended what the killed driver left running
    assert "an earlier driver of this run left behind" in (tmp_path / "console.log").read_text()
