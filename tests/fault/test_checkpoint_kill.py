"""``rredcot train`` SIGKILLed while its learner writes a checkpoint (a ``step-….partial`` exists),
then ``run.resume=auto`` (issue 62, item 3, the issue's own command: ``model.path=tiny-qwen3``,
whose rewards are all 0, so every step is skipped): the resumed run trains every admitted group
once, leaves none in flight, and only then says ``finished``; the killed driver's Ray processes that
outlived it (its agents) are ended by the resumed run's start (one killed driver checks both: each
whole run costs every tier's start-up twice).

A kill can land between a generator's write of a group and its removal from the generator's
in-flight set (or between a redistributor's write and its ack): the resumed run then makes the
group a second time. That window is a matter of luck at a real kill, so the test makes it certain:
after the kill it puts a group the killed run trained back into gen0's in-flight set, as such a
kill leaves it. The copy used to count as a new group, because a skipped step never marked its
samples trained: the resumed run took it in place of the last group still to come and ended
``finished`` with ``admitted 8 = trained 7 + … + in flight 1`` and ``balanced: true``."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import redis
from omegaconf import OmegaConf

from rredcot.common.control import RunControl
from rredcot.common.ledger import group_id
from rredcot.common.streams import connect, key, single_try
from rredcot.launch.leftovers import SESSION_FILE, session_processes
from rredcot.launch.services import EmbeddedRedis
from tests.integration.test_train_stop import signal_when, start_train

RUN = "ckptkill"
PASSWORD = "ckpt-kill-test"  # the run's embedded Redis password (config.yaml redacts it)
OVERRIDES = (
    f"run.name={RUN}",
    "model.path=tiny-qwen3",
    "run.steps=4",
    "data.eval_size=0",
    "learner.checkpoint_every=1",
    "redis.claim_idle_ms=2000",  # the dead run's pending entries come back within seconds
    f"redis.password={PASSWORD}",
)


def _writing_a_checkpoint(run_dir: Path) -> bool:
    return any(p.name.endswith(".partial") for p in (run_dir / "checkpoints").glob("step-*"))


def _server_gone(url: str, timeout_s: float = 60) -> None:
    """Wait until the killed driver's embedded Redis (SIGTERMed with its parent) has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            single_try(url, socket_connect_timeout=1).ping()
        except redis.ConnectionError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the killed driver's Redis at {url} still answers")


def test_a_driver_killed_during_a_checkpoint_write_resumes_and_trains_every_group_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_train(tmp_path, *OVERRIDES)
    signal_when(proc, lambda: _writing_a_checkpoint(run_dir), signal.SIGKILL, tmp_path, 400)
    assert not (run_dir / "report" / "summary.json").exists()  # killed: no report
    session = (run_dir / SESSION_FILE).read_text()  # its local Ray, whose agents outlive the driver
    _server_gone(OmegaConf.load(run_dir / "config.yaml").redis.url.replace("***", PASSWORD))

    # the killed run's state, from its append-only file: a group it trained goes back into gen0's
    # in-flight set, as a kill between the group's write and its removal from the set leaves it
    server = EmbeddedRedis(run_dir / "redis", password=PASSWORD).start()
    try:
        client = connect(server.url)
        trained = {m.decode() for m in client.smembers(key(RUN, "ledger:trained"))}
        admitted = int(client.get(key(RUN, "admitted")) or 0)
        again = next((n for n in range(admitted) if group_id(RUN, n) in trained), None)
        assert again is not None, "the killed run trained no group before its checkpoint"
        client.sadd(key(RUN, "inflight:gen0"), again)
        client.close()
    finally:
        server.stop()

    resumed = start_train(tmp_path, *OVERRIDES, "run.resume=auto")
    try:
        assert resumed.wait(timeout=600) == 0, (tmp_path / "console.log").read_text()[-3000:]
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait(30)
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    ledger, prompts, group_size = summary["ledger"], 4 * 2, 4
    assert summary["status"] == "finished" and summary["steps"] == 4, summary["status"]
    assert ledger["balanced"] and ledger["missing"] == [] and ledger["admitted"] == prompts, ledger
    assert (ledger["trained"], ledger["dead"], ledger["rejected"], ledger["in_flight"]) == (prompts, 0, 0, 0), ledger
    assert "resumed from" in (run_dir / "logs" / "learner0.log").read_text()  # not a fresh start
    assert session_processes(session) == []  # the resumed run ended what the killed driver left running
    assert "an earlier driver of this run left behind" in (tmp_path / "console.log").read_text()

    server = EmbeddedRedis(run_dir / "redis", password=PASSWORD).start()  # what the run left, read back
    try:
        client = connect(server.url)
        # every sample of the 8 groups consumed by a learner step, and each once (a set)
        assert client.scard(key(RUN, "trained_ids")) == prompts * group_size
        learner = RunControl(client, RUN).all_metrics()["learner0"]
        assert learner["step"] == 4 and learner["skipped_empty"] >= 1  # the case: skipped steps
        client.close()
    finally:
        server.stop()
