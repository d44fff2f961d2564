"""Bucketed gathering of full weights (ZeRO-3 partitioned, one rank) and their publication."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from rredcot.common.config import LearnerConfig
from rredcot.common.weight_group import open_group, read_group, receive_tensors
from rredcot.common.weight_sync import latest_manifest, load_tensors
from rredcot.learner.broadcast import CollectivePublisher, FilePublisher, gathered_buckets
from rredcot.learner.engine import LearnerEngine

CPU = torch.device("cpu")


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
    manifest, seconds = FilePublisher(redis_client, run_id, tmp_path, rank=0).publish(engine.module, 7)
    assert manifest == latest_manifest(redis_client, run_id) and manifest.version == 7 and seconds > 0
    received = load_tensors(manifest)
    assert all(torch.equal(received[n], t) for n, t in original.items())


def _receive_one(client, run_id: str, timeout_s: float = 30) -> tuple[int, dict[str, torch.Tensor]]:
    """A bare receiver (group rank 1): join, wait for the manifest, receive one version."""
    info = read_group(client, run_id)
    group = open_group(info, 1, timeout_s)
    deadline = time.monotonic() + timeout_s
    while (manifest := latest_manifest(client, run_id)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert manifest.transport == "collective"
    return receive_tensors(group, manifest.names, manifest.shapes, manifest.dtypes, manifest.buckets, CPU)


def test_collective_publication_reaches_the_group_and_writes_the_file_too(make_model, tmp_path, redis_client, run_id):
    model = make_model()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = LearnerEngine(model, LearnerConfig(dtype="float32", zero_stage=3, zero3_persistence_threshold=0))
    publisher = CollectivePublisher(
        redis_client,
        run_id,
        tmp_path,
        rank=0,
        group_address="127.0.0.1",
        receivers=1,
        timeout_s=30,
        bucket_bytes=64 * 1024,
    )
    with ThreadPoolExecutor(1) as pool:
        receiver = pool.submit(_receive_one, redis_client, run_id)
        manifest, seconds = publisher.publish(engine.module, 5)  # returns while the send runs behind
        assert manifest is None and seconds > 0
        version, received = receiver.result(60)
    publisher.close()
    assert version == 5 and publisher.collective and publisher.fallbacks == 0 and publisher.send_s > 0
    assert received.keys() == original.keys()
    assert all(torch.equal(received[n], t) for n, t in original.items())
    manifest = latest_manifest(redis_client, run_id)
    assert manifest.transport == "collective" and len(manifest.buckets) > 3 and sum(manifest.buckets) == len(original)
    on_disk = load_tensors(manifest)  # file_too: receivers outside the group read the same weights
    assert all(torch.equal(on_disk[n], t) for n, t in original.items())
    assert publisher.publish(engine.module, 0)[0].transport == "file"  # v0 is every receiver's start: no send


def _assert_file_holds(manifest, module) -> None:
    state = load_tensors(manifest)
    assert all(torch.equal(state[n], p) for n, p in module.named_parameters())


def test_a_group_that_never_forms_means_files(make_model, tmp_path, redis_client, run_id):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, rank=0, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=1
    )
    manifest, _ = publisher.publish(engine.module, 1)  # nobody joined within the timeout
    assert not publisher.collective and publisher.fallbacks == 0
    assert manifest == latest_manifest(redis_client, run_id) and manifest.transport == "file"
    _assert_file_holds(manifest, engine.module)
    publisher.close()


def test_a_receiver_lost_after_joining_turns_the_version_into_a_file(make_model, tmp_path, redis_client, run_id):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, rank=0, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=5
    )
    open_group(read_group(redis_client, run_id), 1, 5)  # joins, then is gone (its group is dropped)
    assert publisher.publish(engine.module, 1)[0] is None  # the send runs, and fails, behind
    publisher.wait()
    assert not publisher.collective and publisher.fallbacks == 1
    first = latest_manifest(redis_client, run_id)
    assert first.transport == "file" and first.version == 1
    _assert_file_holds(first, engine.module)
    manifest, _ = publisher.publish(engine.module, 2)  # from now on: files, published on this thread
    assert manifest == latest_manifest(redis_client, run_id) and manifest.version == 2
    publisher.close()
