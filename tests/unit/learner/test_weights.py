"""The learner's weights as it hands them to a publisher (``learner.weights``): bucketed gathering of
full weights (ZeRO-3 partitioned, one rank), published as files; a rank other than 0 only takes part
in the gathers; a publisher that fails part-way still lets every gather finish."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.weights import gathered_buckets, publish
from rredcot.transports.file import FilePublisher
from rredcot.transports.manifest import latest_manifest, load_tensors


def test_zero3_buckets_cover_all_parameters_in_order_and_publish(make_model, tmp_path, redis_client, run_id):
    model = make_model()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = LearnerEngine(model, LearnerConfig(dtype="float32", zero_stage=3, zero3_persistence_threshold=0))
    assert any(p.numel() == 0 for p in engine.module.parameters())  # really partitioned
    # the yielded tensors are the live gathered parameters: copy each bucket before asking for the next
    buckets = [[(n, t.clone()) for n, t in b] for b in gathered_buckets(engine.module, bucket_bytes=64 * 1024)]
    assert len(buckets) > 3 and all(len(b) >= 1 for b in buckets)
    names = [n for b in buckets for n, _ in b]
    assert names == list(original)
    for bucket in buckets:
        assert len(bucket) == 1 or sum(t.numel() * 4 for _, t in bucket) <= 64 * 1024
        for name, tensor in bucket:
            assert torch.equal(tensor, original[name]), name
    manifest, seconds = publish(FilePublisher(redis_client, run_id, tmp_path), engine.module, 7)
    assert manifest == latest_manifest(redis_client, run_id) and manifest.version == 7 and seconds > 0
    received = load_tensors(manifest)
    assert all(torch.equal(received[n], t) for n, t in original.items())


def test_a_rank_other_than_0_only_takes_part_in_the_gathers(make_model, tmp_path, redis_client, run_id):
    """A learner rank other than 0 has no publisher: it gathers every bucket and copies nothing."""
    model = make_model()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        manifest, _ = publish(None, model, 3)
    copies = [e.key for e in prof.key_averages() if e.key in ("aten::copy_", "aten::_to_copy", "aten::clone")]
    assert manifest is None and copies == []  # no host copy of any parameter
    assert latest_manifest(redis_client, run_id) is None and not any(tmp_path.iterdir())


def test_rank_0_that_cannot_write_still_joins_every_gather(make_model, tmp_path, redis_client, run_id, monkeypatch):
    """Under ZeRO-3 the other ranks wait in each bucket's gather: a rank 0 whose file cannot be
    written (here: the directory is a file) raises only after it has taken part in all of them."""
    seen: list[int] = []

    def counted(module, bucket_bytes=0):
        for i, bucket in enumerate(gathered_buckets(module, bucket_bytes=4096)):
            seen.append(i)
            yield bucket

    monkeypatch.setattr("rredcot.learner.weights.gathered_buckets", counted)
    model, blocker = make_model(), tmp_path / "weights"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        publish(FilePublisher(redis_client, run_id, blocker), model, 1)
    assert len(seen) == len(list(gathered_buckets(model, bucket_bytes=4096))) > 1
    assert latest_manifest(redis_client, run_id) is None
