"""The three tiers run by hand, each its own process (``rredcot learn``, ``generate``, ``redistribute``:
``launch.stages.run_stage``), against one real Redis and no Ray: the way a user adds workers to a
running job or runs a tier on a machine of its own (docs/multinode.md). The learner takes its steps
on the groups the other two made, and every admitted group is trained once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rredcot.common.control import RunControl
from rredcot.common.ledger import balance_now

pytestmark = pytest.mark.slow

STEPS, PROMPTS_PER_STEP = 2, 2


def _stage(command: str, overrides: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rredcot.launch.cli", command, "tests", *overrides],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_the_three_tiers_run_by_hand_train_every_group_once(redis_server, redis_client, run_id, tmp_path) -> None:
    overrides = [
        f"redis.url={redis_server.url}",
        f"run.name={run_id}",
        f"run.dir={tmp_path / 'run'}",
        f"run.steps={STEPS}",
        f"generation.prompts_per_step={PROMPTS_PER_STEP}",
        "data.eval_size=0",
    ]
    logs = {c: tmp_path / f"{c}.log" for c in ("learn", "generate", "redistribute")}
    procs = {c: _stage(c, overrides, log) for c, log in logs.items()}
    try:
        learner_rc = procs["learn"].wait(timeout=420)
        assert learner_rc == 0, logs["learn"].read_text()[-3000:]
        RunControl(redis_client, run_id).request_stop("the learner is done")  # nobody else raises it by hand
        deadline = time.monotonic() + 120
        for command in ("generate", "redistribute"):
            rc = procs[command].wait(timeout=max(1.0, deadline - time.monotonic()))
            assert rc == 0, logs[command].read_text()[-3000:]
    finally:
        for p in procs.values():
            p.kill()
    balance = balance_now(redis_client, run_id)
    assert balance.balanced and balance.trained == STEPS * PROMPTS_PER_STEP, balance.line()
    assert "gen0 done" in logs["generate"].read_text() and "red0 done" in logs["redistribute"].read_text()
    assert "learner0 done" in logs["learn"].read_text()
