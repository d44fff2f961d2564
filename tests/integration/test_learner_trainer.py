"""The learner loop against a real Redis: stream → step → ack, de-dup, dead letters, weights, metrics, resume."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from rredcot.common.codec import decode, encode
from rredcot.common.config import load_config
from rredcot.common.control import RunControl
from rredcot.common.ledger import GroupVersions, Ledger
from rredcot.common.net import loopback_interface
from rredcot.common.records import RolloutRecord, WeightedGroup, WeightedSample, new_id
from rredcot.common.staleness import Admission
from rredcot.common.streams import BATCHES, DEAD, PAYLOAD, Producer, key
from rredcot.learner.checkpoint import CheckpointError
from rredcot.learner.trainer import Trainer
from rredcot.learner.weights import full_state
from rredcot.transports.manifest import latest_manifest, load_tensors
from tests.integration.trainer_rank import DIED

ROOT = Path(__file__).resolve().parents[2]  # the ranks run as tests.integration.trainer_rank


def weighted_group(rng: np.random.Generator, version: int, size: int = 2) -> WeightedGroup:
    gid = new_id()
    samples = []
    for i in range(size):
        n = int(rng.integers(4, 20))
        sigma = rng.random(n).astype(np.float32)
        rollout = RolloutRecord(
            id=new_id(),
            group_id=gid,
            prompt_id="p",
            sample_index=i,
            completion_ids=rng.integers(10, 5000, n).astype(np.int32),
            behaviour_logprobs=np.full(n, -11.9, np.float32),
            version_runs=np.array([[0, version]], np.int32),
            finish_reason="stop",
            reward=float(i % 2),
            verdict="correct" if i % 2 else "wrong",
        )
        samples.append(
            WeightedSample(
                rollout=rollout,
                advantage=1.0 if i % 2 else -1.0,
                sigma=sigma / sigma.sum(),
                exit_points=np.zeros(1, np.int32),
                exit_values=np.zeros(1, np.float32),
                segment_rewards=np.zeros(0, np.float32),
                credit_method="rredcot",
            )
        )
    return WeightedGroup(gid, "p", rng.integers(10, 5000, 6).astype(np.int32), samples)


def _overrides(run_id: str, tmp_path, url: str) -> list[str]:
    """Three steps on the test server, a checkpoint every two, entries reclaimed at once."""
    return [
        f"run.name={run_id}",
        f"run.dir={tmp_path}",
        "run.steps=3",
        f"redis.url={url}",
        "learner.checkpoint_every=2",
        "redis.claim_idle_ms=0",
    ]


def _queued(redis_client, run_id: str, n: int, seed: int) -> list[WeightedGroup]:
    """``n`` random groups (version 0) written to the ``batches`` stream."""
    rng = np.random.default_rng(seed)
    groups = [weighted_group(rng, version=0) for _ in range(n)]
    producer = Producer(redis_client, key(run_id, BATCHES), maxlen=64)
    for g in groups:
        producer.put(encode(g))
    return groups


def _two_steps(overrides: list[str]) -> Trainer:
    """A learner that has taken two steps; the second one checkpointed."""
    trainer = Trainer(load_config("tests", overrides))
    for _ in range(2):
        trainer.train_on(trainer.next_batch())
    return trainer


def test_trainer_loop_end_to_end(tmp_path, redis_server, redis_client, run_id):
    overrides = [
        *_overrides(run_id, tmp_path, redis_server.url),
        "learner.lr=1e-3",
        "run.resume=auto",
    ]
    cfg = load_config("tests", overrides)
    rng = np.random.default_rng(0)
    groups = [weighted_group(rng, version=0) for _ in range(9)]
    groups.insert(7, weighted_group(rng, version=9))  # sampled by a policy newer than the resumed learner
    producer = Producer(redis_client, key(run_id, BATCHES), maxlen=64)
    for payload in [encode(groups[0]), encode(groups[1]), encode(groups[0]), b"not msgpack", *map(encode, groups[2:])]:
        producer.put(payload)

    trainer = Trainer(cfg)
    metrics = trainer.run()
    assert trainer.step == 3 and trainer.engine.version == 3
    assert trainer.totals["duplicates"] == 2  # the re-sent group's two samples were not trained again
    assert redis_client.xlen(key(run_id, DEAD)) == 1
    # 7 consumed (g0's copy does not count toward its step's 2 groups), 1 dead-lettered, 4 left
    assert redis_client.xlen(key(run_id, BATCHES)) == 4
    assert Admission(redis_client, run_id, 2, 1).learner_version() == 3
    manifest = latest_manifest(redis_client, run_id)
    assert manifest.version == 3
    trained = full_state(trainer.engine.module)
    received = load_tensors(manifest)
    assert all(torch.equal(received[n], t) for n, t in trained.items())
    snapshot = RunControl(redis_client, run_id).all_metrics()["learner0"]
    assert snapshot["step"] == 3 and 0 <= snapshot["idle_frac"] <= 1 and np.isfinite(snapshot["loss"])
    # the wait for the first batch is part of the wait; leaving it out can only lower the idle share
    assert 0 < snapshot["fill_wait_s"] <= snapshot["wait_s"] and snapshot["steady_idle_frac"] <= snapshot["idle_frac"]
    assert metrics["staleness_2"] == 1.0 and "broadcast_s" in metrics
    assert list((tmp_path / "tensorboard" / "learner").glob("events.*"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]

    # resumed: checkpoints by wall time only (every step here), three kept
    by_time = ["learner.checkpoint_every=0", "learner.checkpoint_every_s=1e-6", "learner.keep_checkpoints=3"]
    resumed = Trainer(load_config("tests", [*overrides[:2], "run.steps=5", *overrides[3:], *by_time]))
    assert resumed.step == 3 and resumed.engine.version == 3
    assert all(torch.equal(t, trained[n]) for n, t in full_state(resumed.engine.module).items())
    metrics = resumed.run()  # a group newer than the learner is trained, not crashed on (issue 15)
    assert resumed.step == 5 and redis_client.xlen(key(run_id, BATCHES)) == 0
    # the last step trains two version-0 groups at version 4; step 4 took the newer group (ahead) and a v0 one
    assert metrics["ahead_tokens"] > 0 and metrics["staleness_max"] == 4 and metrics["staleness_3plus"] == 1.0
    truth = Ledger(redis_client, run_id).versions()  # the ledger keeps each trained group's version truth
    assert set(truth) == {g.group_id for g in groups}
    assert truth[groups[7].group_id] == GroupVersions(oldest=9, newest=9, scorer=0, learner=3, lag=0)  # ahead
    assert sorted(v.lag for v in truth.values()) == [0, 0, 0, 1, 1, 2, 2, 3, 4, 4]  # g0's copy kept its first
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-00000003", "step-00000004", "step-00000005"]  # step 4 by time; nothing .partial


def test_a_resume_trains_again_what_was_trained_after_the_checkpoint(tmp_path, redis_server, redis_client, run_id):
    """A learner that dies after its step-3 step, with its newest checkpoint at step 2: the resumed
    one restores step 2, publishes it as a version above the dead one's, retrains step 3's groups
    (from its replay log: they were acknowledged and deleted from ``batches``), then goes on with new
    ones. Every group is trained into the final weights once; none is lost."""
    overrides = _overrides(run_id, tmp_path, redis_server.url)
    groups = _queued(redis_client, run_id, 10, seed=1)
    dead = _two_steps(overrides)
    after_step_2 = {n: t.clone() for n, t in full_state(dead.engine.module).items()}
    dead.train_on(dead.next_batch())  # a third step, then the process "dies": no final checkpoint
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]
    # the replay log: step 3's assignment and its 2 groups
    assert latest_manifest(redis_client, run_id).version == 3 and len(dead.replay) == 3
    step_3 = [decode(p, WeightedGroup).group_id for _, trained in dead.replay.after(2) for p, _ in trained]
    assert step_3 == [g.group_id for g in groups[4:6]]

    resumed = Trainer(load_config("tests", [*overrides, "run.steps=5", "run.resume=auto"]))
    assert resumed.step == 2 and resumed.engine.version == 4  # above the dead learner's version 3
    manifest = latest_manifest(redis_client, run_id)
    assert manifest.version == 4
    assert all(torch.equal(load_tensors(manifest)[n], t) for n, t in after_step_2.items())  # step 2's weights
    resumed.run()
    assert resumed.step == 5 and redis_client.xlen(key(run_id, BATCHES)) == 0
    assert resumed.totals["duplicates"] == 0 and resumed.totals["groups"] == 10  # 4 + 2 replayed + 4 new
    trained = {m.decode() for m in redis_client.smembers(key(run_id, "trained_ids"))}
    assert trained == {s.rollout.id for g in groups for s in g.samples}
    assert len(resumed.replay) == 0  # the final checkpoint holds everything


def test_a_crash_between_recording_and_acknowledging_trains_the_step_once(tmp_path, redis_server, redis_client, run_id):
    """The learner recorded step 3's groups in its replay log, then died before it marked them trained
    and acknowledged them: the resumed one retrains them from the log, and their entries, still
    pending in ``batches``, are acknowledged, not trained a second time."""
    overrides = _overrides(run_id, tmp_path, redis_server.url)
    groups = _queued(redis_client, run_id, 10, seed=2)
    dead = _two_steps(overrides)
    batch = dead.next_batch()
    dead.engine.train_step(batch.samples)
    dead.replay.record(3, batch.trained, batch.shares)  # ... and the process dies here

    resumed = Trainer(load_config("tests", [*overrides, "run.steps=5", "run.resume=auto"]))
    resumed.run()
    assert resumed.step == 5 and redis_client.xlen(key(run_id, BATCHES)) == 0
    assert resumed.totals["duplicates"] == 0 and resumed.consumer.pending_mine() == []
    assert resumed.totals["groups"] == 10  # 4 before the checkpoint + 2 replayed + 4 new
    trained = {m.decode() for m in redis_client.smembers(key(run_id, "trained_ids"))}
    assert trained == {s.rollout.id for g in groups for s in g.samples}


def test_a_restarted_learner_first_trains_what_its_predecessor_held(tmp_path, redis_server, redis_client, run_id):
    """The learner read step 3's entries and died before training them: the restarted one (same
    consumer name; no idle reclaim here, ``claim_idle_ms=0``) takes them first, before new entries."""
    overrides = _overrides(run_id, tmp_path, redis_server.url)
    groups = _queued(redis_client, run_id, 8, seed=3)
    dead = _two_steps(overrides)
    held = [decode(e.payload, WeightedGroup).group_id for e in dead.next_batch().entries]  # ... and dies
    assert held == [g.group_id for g in groups[4:6]]

    resumed = Trainer(load_config("tests", [*overrides, "run.steps=3", "run.resume=auto"]))
    batch = resumed.next_batch()
    assert [decode(e.payload, WeightedGroup).group_id for e in batch.entries] == held
    assert list(batch.groups) == held and len(batch.samples) == 4


def test_a_resume_trains_again_only_what_the_steps_after_the_checkpoint_trained(
    tmp_path, redis_server, redis_client, run_id
):
    """Step 3 read a re-sent copy of g0 (trained at step 1), g4, and g5 whose first sample was trained
    in an earlier step: it trained g4 and g5's second sample only. The learner dies after it; the
    resumed one (checkpoint at step 2) retrains those three samples, not g0 nor g5's first sample a
    second time."""
    overrides = _overrides(run_id, tmp_path, redis_server.url)
    g0 = _queued(redis_client, run_id, 4, seed=4)[0]
    dead = _two_steps(overrides)
    Producer(redis_client, key(run_id, BATCHES), maxlen=64).put(encode(g0))
    g4, g5 = _queued(redis_client, run_id, 2, seed=5)
    redis_client.sadd(key(run_id, "trained_ids"), g5.samples[0].rollout.id)
    dead.train_on(dead.next_batch())  # ... and the process dies
    assert dead.totals["duplicates"] == 3

    resumed = Trainer(load_config("tests", [*overrides, "run.resume=auto"]))
    assert resumed.step == 2 and resumed.engine.counters["samples"] == 8
    replayed = resumed.next_batch()
    assert sorted(s.id for s in replayed.samples) == sorted(s.rollout.id for s in [*g4.samples, g5.samples[1]])
    resumed.train_on(replayed)
    assert resumed.engine.counters["samples"] == 8 + 3


def test_the_end_of_the_run_writes_the_checkpoint_that_failed_at_its_last_step(
    tmp_path, redis_server, redis_client, run_id
):
    """The periodic checkpoint of the last step cannot be written (a file where the checkpoints'
    directory should be stands in for a full disk): the learner goes on to the end of the run, which
    tries it again and fails the run, rather than end without a checkpoint of its last step."""
    (tmp_path / "checkpoints").write_text("")
    _queued(redis_client, run_id, 4, seed=6)
    trainer = Trainer(load_config("tests", [*_overrides(run_id, tmp_path, redis_server.url), "run.steps=2"]))
    with pytest.raises(CheckpointError, match="could not write checkpoint step-00000002"):
        trainer.run()
    assert trainer.step == 2 and trainer.totals["checkpoint_failures"] == 1


def test_the_last_version_is_published_at_the_end_even_between_broadcasts(tmp_path, redis_server, redis_client, run_id):
    """``broadcast_every=2`` and three steps: version 3 is no broadcast's, but the final evaluation
    and the generators must get the trained weights, not version 2's."""
    _queued(redis_client, run_id, 6, seed=3)
    trainer = Trainer(
        load_config("tests", [*_overrides(run_id, tmp_path, redis_server.url), "learner.broadcast_every=2"])
    )
    trainer.run()
    manifest = latest_manifest(redis_client, run_id)
    assert trainer.engine.version == 3 and manifest.version == 3
    received = load_tensors(manifest)
    assert all(torch.equal(received[n], t) for n, t in full_state(trainer.engine.module).items())


def test_a_copy_of_a_group_a_skipped_step_consumed_is_a_duplicate_not_a_new_group(
    tmp_path, redis_server, redis_client, run_id
):
    """A step with nothing to learn (every advantage 0: no update) still consumes its groups, and the
    ledger counts them trained. A copy of one that comes again (a redistributor re-sends it, a
    generator re-generates it after a driver killed during a checkpoint write is resumed) used to
    count as a new group, since only an applied step marked its samples trained: the next step took
    it in place of a group still to come, and the run ended `finished` with `trained 7 + in flight 1`."""
    rng = np.random.default_rng(7)
    flat = [weighted_group(rng, version=0) for _ in range(2)]
    flat = [dataclasses.replace(g, samples=[dataclasses.replace(s, advantage=0.0) for s in g.samples]) for g in flat]
    fresh = [weighted_group(rng, version=0) for _ in range(2)]
    producer = Producer(redis_client, key(run_id, BATCHES), maxlen=64)
    for g in [*flat, flat[0], *fresh]:  # flat[0] again, after the step that consumed it
        producer.put(encode(g))
    trainer = Trainer(load_config("tests", [*_overrides(run_id, tmp_path, redis_server.url), "run.steps=2"]))
    trainer.run()
    assert trainer.engine.counters["skipped_empty"] == 1 and trainer.engine.version == 1  # step 1 skipped
    assert redis_client.xlen(key(run_id, BATCHES)) == 0  # both fresh groups trained by step 2, none left
    assert trainer.totals["duplicates"] == len(flat[0].samples)  # the copy: acknowledged, not trained
    trained = {m.decode() for m in redis_client.smembers(key(run_id, "ledger:trained"))}
    assert trained == {g.group_id for g in [*flat, *fresh]}


def _two_ranks(specs: list[dict], logs: Path, timeout: float = 300) -> list[tuple[int, str]]:
    """Two ``Trainer`` ranks as the driver starts them (a rendezvous id of this start, gloo on
    loopback); each rank's exit code and output (written to ``logs``: a pipe nobody reads while the
    ranks run could fill and stall a rank mid-collective)."""
    rendezvous = uuid.uuid4().hex
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank, spec in enumerate(specs):
        env = os.environ | {
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(len(specs)),
            "MASTER_ADDR": "127.0.0.1",
            "RREDCOT_RENDEZVOUS": rendezvous,
            "GLOO_SOCKET_IFNAME": loopback_interface(),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "tests.integration.trainer_rank", json.dumps(spec)]
        with open(logs / f"rank{rank}.log", "w") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        return [(p.wait(timeout), (logs / f"rank{rank}.log").read_text()) for rank, p in enumerate(procs)]
    finally:
        for p in procs:  # a rank left waiting in a collective
            p.kill()


@pytest.mark.slow
def test_a_rank_lost_after_the_all_reduce_before_its_record_is_replayed_whole(
    tmp_path, redis_server, redis_client, run_id
):
    """Two ranks, one group each a step, no checkpoint. At step 2 rank 1 takes part in the update,
    then dies before it records its share in its replay log; rank 0 recorded its own and fails at
    its next collective. The resumed ranks replay step 2 with both shares (rank 1's from the entries
    step 2's assignment gave it, still in the stream), so after 3 steps exactly the first 6 groups are
    trained, each once, and the last 2 wait in the stream. Before, rank 1 replayed step 2 empty and its
    share came back later as a new group: a step short, one admitted group left untrained at the end
    (the node-lost resume of tests/cluster)."""
    overrides = [
        *_overrides(run_id, tmp_path, redis_server.url),
        "learner.checkpoint_every=0",
        "learner.checkpoint_every_s=0",
    ]
    groups = _queued(redis_client, run_id, 8, seed=6)
    (code0, out0), (code1, out1) = _two_ranks(
        [{"overrides": overrides}, {"overrides": overrides, "die_at": 2}], tmp_path / "died"
    )
    assert code1 == DIED and code0 != 0, (out0[-3000:], out1[-3000:])  # rank 0 failed in a collective after step 2
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())

    ranks = _two_ranks([{"overrides": [*overrides, "run.resume=auto"]}] * 2, tmp_path / "resumed")
    assert [code for code, _ in ranks] == [0, 0], [out[-3000:] for _, out in ranks]
    ends = [json.loads(out.strip().splitlines()[-1]) for _, out in ranks]
    assert [e["step"] for e in ends] == [3, 3]
    assert [e["samples"] for e in ends] == [6 * 2] * 2  # the steps' samples (global): 2 replayed whole and step 3
    trained = {m.decode() for m in redis_client.smembers(key(run_id, "trained_ids"))}
    assert trained == {s.rollout.id for g in groups[:6] for s in g.samples}
    waiting = [decode(f[PAYLOAD], WeightedGroup).group_id for _, f in redis_client.xrange(key(run_id, BATCHES))]
    assert waiting == [g.group_id for g in groups[6:]]
