"""Bucketed gathering of full weights (ZeRO-3 partitioned, one rank) and their publication."""

from __future__ import annotations

import torch

from rredcot.common.config import LearnerConfig
from rredcot.common.weight_sync import latest_manifest, load_tensors
from rredcot.learner.broadcast import broadcast, gathered_buckets
from rredcot.learner.engine import LearnerEngine


def test_zero3_buckets_cover_all_parameters_in_order_and_publish(make_model, tmp_path, redis_client, run_id):
    model = make_model()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = LearnerEngine(model, LearnerConfig(zero_stage=3, zero3_persistence_threshold=0))
    assert any(p.numel() == 0 for p in engine.module.parameters())  # really partitioned
    buckets = list(gathered_buckets(engine.module, bucket_bytes=64 * 1024))
    assert len(buckets) > 3 and all(len(b) >= 1 for b in buckets)
    names = [n for b in buckets for n, _ in b]
    assert names == list(original)
    for bucket in buckets:
        assert len(bucket) == 1 or sum(t.numel() * 4 for _, t in bucket) <= 64 * 1024
        for name, tensor in bucket:
            assert torch.equal(tensor, original[name]), name
    manifest, seconds = broadcast(engine.module, redis_client, run_id, 7, tmp_path, rank=0)
    assert manifest == latest_manifest(redis_client, run_id) and manifest.version == 7 and seconds > 0
    received = load_tensors(manifest)
    assert all(torch.equal(received[n], t) for n, t in original.items())
