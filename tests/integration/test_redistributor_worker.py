"""The redistributor worker on a real Redis server with a real tiny scorer: every rollout in comes
out as exactly one weighted sample or one dead letter, and a worker killed mid-batch loses nothing."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import torch

from rredcot.common.codec import decode, encode
from rredcot.common.config import load_config
from rredcot.common.records import RolloutGroup, WeightedGroup
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, Producer, dead_letters, key
from rredcot.learner.weights import publish
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.worker import GROUP, Redistributor
from rredcot.transports.ipc import IpcPublisher
from rredcot.transports.manifest import latest_manifest, publish_manifest, publish_weights
from tests.factories import rollout_group

# rollouts come from the test; no traces saved unless a test asks (and gives a run.dir): none land in the repo
BASE = ["task.name=arith", "redis.claim_idle_ms=300", "credit.segmentation.segments=4", "credit.save_traces=0"]


def _cfg(url: str, run_id: str, *extra: str):
    return load_config(None, [f"redis.url={url}", f"run.name={run_id}", *BASE, *extra])


def _put_groups(client, run_id: str, n: int, length: int = 24) -> dict[str, list[str]]:
    producer = Producer(client, key(run_id, ROLLOUTS), maxlen=64)
    groups = {}
    for i in range(n):
        g = rollout_group(g=4, length=length, seed=i)
        producer.put(encode(g))
        groups[g.group_id] = [s.id for s in g.samples]
    return groups


def _batches(client, run_id: str) -> list[WeightedGroup]:
    return [decode(f[b"d"], WeightedGroup) for _, f in client.xrange(key(run_id, BATCHES))]


def test_every_rollout_becomes_one_weighted_sample_or_dead_letter(redis_client, redis_server, run_id, tmp_path) -> None:
    groups = _put_groups(redis_client, run_id, 3)
    bad = rollout_group(seed=9)
    bad.samples[0].completion_ids = bad.samples[0].completion_ids.astype(np.int64)  # breaks the schema
    raw = msgpack.packb({"v": 1, "kind": "rollout_group", "body": {"group_id": "x"}})
    producer = Producer(redis_client, key(run_id, ROLLOUTS), maxlen=64)
    producer.put(b"\x00not msgpack")
    producer.put(raw)
    # random completions hold no keyword boundary: every token a candidate, so traces split and branches run
    every_token = "credit.segmentation.split_keywords=false"
    cfg = _cfg(redis_server.url, run_id, f"run.dir={tmp_path}", "credit.save_traces=2", every_token)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    worker = Redistributor(cfg, "red0", scorer=scorer)
    metrics = worker.run(idle_exit_s=1.0)
    saved = sorted((tmp_path / "traces").glob("red0-*.msgpack"))
    assert len(saved) == 2 and all(decode(p.read_bytes(), WeightedGroup).group_id in groups for p in saved)
    rollouts = [decode(p.read_bytes(), RolloutGroup) for p in sorted((tmp_path / "traces" / "rollouts").glob("*"))]
    assert [g.group_id for g in rollouts] == [decode(p.read_bytes(), WeightedGroup).group_id for p in saved]
    out = _batches(redis_client, run_id)
    assert {g.group_id: [s.rollout.id for s in g.samples] for g in out} == groups
    for g in out:
        for s in g.samples:
            assert abs(float(s.sigma.sum(dtype=np.float64)) - 1) < 1e-5 and s.credit_method == "rredcot"
            assert s.exit_points[-1] == len(s.sigma)  # no thinking tags: the whole completion
    reasons = [f[b"reason"].decode() for f in dead_letters(redis_client, key(run_id, DEAD))]
    assert len(reasons) == 2 and all("RecordError" in r for r in reasons)
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 0  # acked entries are deleted
    assert metrics["groups"] == 3 and metrics["rollouts"] == 12 and metrics["dead_letters"] == 2
    assert metrics["dead_letters.RecordError"] == 2 and metrics["samples.lt1k"] == 12  # by reason, by length
    assert 1.0 <= metrics["sigma_peak.lt1k"] <= max(len(s.sigma) for g in out for s in g.samples)
    completion_tokens = sum(len(s.rollout.completion_ids) for g in out for s in g.samples)
    assert metrics["scorer_trace_tokens"] == scorer.tokens.trace > completion_tokens  # prompts included
    assert metrics["scorer_branch_tokens"] == scorer.tokens.branch > 0
    assert metrics["scorer_branch_per_trace"] == pytest.approx(scorer.tokens.branch / scorer.tokens.trace)
    stored = redis_client.hgetall(key(run_id, "metrics:red0"))
    assert stored[b"tier"] == b"redistributor" and float(stored[b"rollouts"]) == 12


@pytest.mark.parametrize(
    "error",
    [
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
    ids=["sticky_cuda_error", "oom_at_every_budget"],
)
def test_a_failure_of_the_worker_leaves_the_entry_to_its_restart(redis_client, redis_server, run_id, error) -> None:
    """A sticky CUDA error, an allocation that fails at every budget or a compile failure (all
    ``RuntimeError``s) is the worker's fault, not the entry's: it was dead-lettered and acked, so a
    broken GPU dead-lettered the whole stream. It propagates now (the worker dies, Ray restarts it),
    the entry stays pending, and the restarted worker takes it up first."""
    groups = _put_groups(redis_client, run_id, 1)
    cfg = _cfg(redis_server.url, run_id)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )

    def fail(module, args, kwargs) -> None:
        raise error

    hook = scorer.model.get_decoder().register_forward_pre_hook(fail, with_kwargs=True)
    try:
        with pytest.raises(type(error), match=str(error)):
            Redistributor(cfg, "red0", scorer=scorer).step(block_ms=100)
    finally:
        hook.remove()
    assert redis_client.xpending(key(run_id, ROLLOUTS), GROUP)["pending"] == 1
    assert redis_client.xlen(key(run_id, DEAD)) == 0 and not _batches(redis_client, run_id)
    Redistributor(cfg, "red0", scorer=scorer).step(block_ms=100)  # restarted: its own unacked entries first
    assert [g.group_id for g in _batches(redis_client, run_id)] == list(groups)
    assert redis_client.xpending(key(run_id, ROLLOUTS), GROUP)["pending"] == 0


def test_an_allocation_that_fails_once_is_retried_with_half_the_budget_and_counted(
    redis_client, redis_server, run_id
) -> None:
    groups = _put_groups(redis_client, run_id, 1)
    cfg = _cfg(redis_server.url, run_id)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    failed: list[bool] = []

    def fail_once(module, args, kwargs) -> None:
        if not failed:
            failed.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    hook = scorer.model.get_decoder().register_forward_pre_hook(fail_once, with_kwargs=True)
    worker = Redistributor(cfg, "red0", scorer=scorer)
    try:
        worker.step(block_ms=100)
    finally:
        hook.remove()
    assert [g.group_id for g in _batches(redis_client, run_id)] == list(groups)
    assert worker.metrics.oom_retries == 1 and redis_client.xlen(key(run_id, DEAD)) == 0
    assert float(redis_client.hget(key(run_id, "metrics:red0"), "oom_retries")) == 1


def test_token_ids_outside_the_scorers_vocabulary_are_dead_lettered(redis_client, redis_server, run_id) -> None:
    """An id ≥ the scorer's vocabulary is refused before any forward (on CUDA the embedding lookup
    is a device-side assert that breaks the process; on CPU an ``IndexError`` crashed the worker)."""
    cfg = _cfg(redis_server.url, run_id)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    vocab = scorer.model.config.vocab_size
    bad = rollout_group(seed=3)
    bad.samples[1].completion_ids[5] = vocab
    Producer(redis_client, key(run_id, ROLLOUTS), maxlen=64).put(encode(bad))
    metrics = Redistributor(cfg, "red0", scorer=scorer).run(idle_exit_s=1.0)
    reasons = [f[b"reason"].decode() for f in dead_letters(redis_client, key(run_id, DEAD))]
    assert reasons == [
        f"RecordError: samples[1].completion_ids holds token id {vocab}, outside the scorer's vocabulary [0, {vocab})"
    ]
    assert metrics["dead_letters.RecordError"] == 1 and not _batches(redis_client, run_id)
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 0


def test_mc_rewards_read_the_answer_after_the_models_thinking_tags(redis_server, run_id) -> None:
    """The worker's verifier (``credit.method=mc``) reads an answer only after ``model.think_end``:
    a guess inside the thinking is no answer."""
    cfg = _cfg(redis_server.url, run_id, "credit.method=mc", "model.think_start=<r>", "model.think_end=</r>")
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    worker = Redistributor(cfg, "red0", scorer=scorer)
    try:
        assert worker.verifier.score("<r>Answer: 84</r>I am not sure", "84").verdict == "no_answer"
    finally:
        worker.verifier.close()


WORKER = """
import sys
from rredcot.common.config import load_config
from rredcot.redistributor.worker import Redistributor
cfg = load_config(None, sys.argv[1:])
Redistributor(cfg, "doomed").run()
"""


def _frozen_mid_batch(proc: subprocess.Popen, client, run_id: str, groups: int) -> bool:
    """Stop the worker (SIGSTOP) and say whether it has written part of what it read and still holds
    unacked entries; if not, let it go on. Checked while it is stopped, the state cannot change before
    the kill (on a slow machine a check on a running worker can fall between its ack and next read)."""
    proc.send_signal(signal.SIGSTOP)
    written = client.xlen(key(run_id, BATCHES))
    if 1 <= written < groups and client.xpending(key(run_id, ROLLOUTS), GROUP)["pending"] > 0:
        return True
    proc.send_signal(signal.SIGCONT)
    return False


def test_worker_killed_mid_batch_loses_nothing(redis_client, redis_server, run_id) -> None:
    groups = _put_groups(redis_client, run_id, 8, length=48)
    cfg_args = [f"redis.url={redis_server.url}", f"run.name={run_id}", *BASE, "model.path=tiny-qwen3"]
    proc = subprocess.Popen([sys.executable, "-c", WORKER, *cfg_args])
    try:
        deadline = time.monotonic() + 240
        while not _frozen_mid_batch(proc, redis_client, run_id, len(groups)):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert redis_client.xlen(key(run_id, BATCHES)) < len(groups)  # killed mid-batch
    assert redis_client.xpending(key(run_id, ROLLOUTS), GROUP)["pending"] > 0  # with entries it still held
    time.sleep(0.4)  # older than claim_idle_ms: another worker reclaims them
    cfg = load_config(None, cfg_args)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    Redistributor(cfg, "rescuer", scorer=scorer).run(idle_exit_s=1.5)
    out = _batches(redis_client, run_id)
    seen = {g.group_id: [s.rollout.id for s in g.samples] for g in out}
    assert seen == groups  # every group arrived (a group written but not acked may arrive twice)
    assert len(out) <= len(groups) + 1
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 0
    assert redis_client.xpending(key(run_id, ROLLOUTS), GROUP)["pending"] == 0


def test_policy_scorer_follows_published_weights(redis_client, redis_server, run_id, tmp_path) -> None:
    """credit.scorer.model=policy: the worker loads each newer published version (tied head left out)."""
    cfg = _cfg(redis_server.url, run_id, "credit.scorer.model=policy")
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    worker = Redistributor(cfg, "red0", scorer=scorer)
    assert not worker.sync_scorer()  # nothing published yet
    policy = build_tiny_model("qwen3", seed=5)
    publish_weights(redis_client, run_id, 3, policy.named_parameters(), tmp_path)
    assert worker.sync_scorer() and scorer.version == 3 and not worker.sync_scorer()
    for (name, a), b in zip(scorer.model.state_dict().items(), policy.state_dict().values()):
        assert torch.equal(a, b), name
    _put_groups(redis_client, run_id, 1)
    worker.step(block_ms=100)
    assert _batches(redis_client, run_id)[0].scorer_version == 3
    with pytest.raises(ValueError, match="do not fit"):
        scorer.load_weights({"model.embed_tokens.weight": policy.model.embed_tokens.weight}, 4)


def test_policy_scorer_reads_ipc_slots_and_waits_for_a_file_still_being_written(
    redis_client, redis_server, run_id, tmp_path
) -> None:
    """With the ipc transport the scorer copies each version out of the learner's slot (no file); a
    manifest announced before its file exists (collective) is skipped, not an error."""
    cfg = _cfg(redis_server.url, run_id, "credit.scorer.model=policy", "generation.weight_transport=ipc")
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    worker = Redistributor(cfg, "red0", scorer=scorer)
    policy = build_tiny_model("qwen3", seed=5)
    (tmp_path / "shm").mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=tmp_path / "shm")
    publish(publisher, policy, 2)
    assert worker.sync_scorer() and scorer.version == 2 and not (tmp_path / "weights").exists()
    for (name, a), b in zip(scorer.model.state_dict().items(), policy.state_dict().values()):
        assert torch.equal(a, b), name
    publisher.close()
    announced = dataclasses.replace(latest_manifest(redis_client, run_id), version=3, transport="collective", path="")
    publish_manifest(redis_client, run_id, announced)
    assert not worker.sync_scorer() and scorer.version == 2


def test_a_worker_takes_one_group_at_a_time_and_leaves_the_rest_to_its_peers(
    redis_client, redis_server, run_id
) -> None:
    """A group read in a batch would wait behind the others while an idle peer finds the stream empty
    (and, with long traces, be reclaimed and scored twice): each step reads one group."""
    groups = _put_groups(redis_client, run_id, 2)
    cfg = _cfg(redis_server.url, run_id)
    scorer = Scorer(
        build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), cfg.credit.scorer.exit_string
    )
    first, peer = Redistributor(cfg, "red0", scorer=scorer), Redistributor(cfg, "red1", scorer=scorer)
    assert first.step(block_ms=100) == 1 and peer.step(block_ms=100) == 1
    assert first.metrics.groups == peer.metrics.groups == 1
    assert sorted(g.group_id for g in _batches(redis_client, run_id)) == sorted(groups)
