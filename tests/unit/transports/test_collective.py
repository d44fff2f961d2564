"""The ``collective`` publisher: each version's buckets broadcast to the weight group from a
background thread (with the file too when receivers outside the group need it), and files whenever
the group does not form or breaks."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.weights import publish
from rredcot.transports.collective import CollectivePublisher
from rredcot.transports.group import open_group, read_group, receive_tensors
from rredcot.transports.manifest import latest_manifest, load_tensors
from rredcot.transports.slots import want_files
from tests.unit.transports.test_file import _assert_file_holds

CPU = torch.device("cpu")


def _receive(client, run_id: str, versions: int = 1, timeout_s: float = 30) -> list[tuple[int, dict]]:
    """A bare receiver (group rank 1): join, then for each version wait for its manifest and receive it."""
    info = read_group(client, run_id)
    group = open_group(info, 1, timeout_s)
    out = []
    for _ in range(versions):
        deadline = time.monotonic() + timeout_s
        while (
            manifest := latest_manifest(client, run_id, newer_than=out[-1][0] if out else -1)
        ) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert manifest.transport == "collective"
        out.append(receive_tensors(group, manifest.names, manifest.shapes, manifest.dtypes, manifest.buckets, CPU))
    return out


def test_collective_publication_reaches_the_group_and_writes_the_file_too(make_model, tmp_path, redis_client, run_id):
    model = make_model()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = LearnerEngine(model, LearnerConfig(dtype="float32", zero_stage=3, zero3_persistence_threshold=0))
    publisher = CollectivePublisher(
        redis_client,
        run_id,
        tmp_path,
        group_address="127.0.0.1",
        receivers=1,
        timeout_s=30,
    )
    with ThreadPoolExecutor(1) as pool:
        receiver = pool.submit(_receive, redis_client, run_id)
        manifest, seconds = publish(publisher, engine.module, 5, 64 * 1024)  # returns while the send runs behind
        assert manifest is None and seconds > 0
        [(version, received)] = receiver.result(60)
    publisher.close()
    assert version == 5 and publisher.collective and publisher.fallbacks == 0 and publisher.send_s > 0
    assert received.keys() == original.keys()
    assert all(torch.equal(received[n], t) for n, t in original.items())
    manifest = latest_manifest(redis_client, run_id)
    assert manifest.transport == "collective" and len(manifest.buckets) > 3 and sum(manifest.buckets) == len(original)
    on_disk = load_tensors(manifest)  # file_too: receivers outside the group read the same weights
    assert all(torch.equal(on_disk[n], t) for n, t in original.items())
    assert publish(publisher, engine.module, 0)[0].transport == "file"  # v0 is every receiver's start: no send


def test_versions_back_to_back_reuse_the_host_buffers_and_arrive_whole(make_model, tmp_path, redis_client, run_id):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, group_address="127.0.0.1", receivers=1, timeout_s=30
    )
    sent = []
    with ThreadPoolExecutor(1) as pool:
        receiver = pool.submit(_receive, redis_client, run_id, 3)
        for version in (1, 2, 3):
            with torch.no_grad():
                engine.module.model.norm.weight.fill_(float(version))  # the next step's training
            sent.append({n: p.detach().clone() for n, p in engine.module.named_parameters()})
            publish(publisher, engine.module, version)
        received = receiver.result(60)
    publisher.close()
    assert [v for v, _ in received] == [1, 2, 3] and publisher.fallbacks == 0
    for (_, got), want in zip(received, sent, strict=True):
        assert all(torch.equal(got[n], t) for n, t in want.items())
    assert load_tensors(latest_manifest(redis_client, run_id))["model.norm.weight"].eq(3).all()  # file_too


def test_a_group_that_never_forms_means_files(make_model, tmp_path, redis_client, run_id):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=1
    )
    manifest, _ = publish(publisher, engine.module, 1)  # nobody joined within the timeout
    assert not publisher.collective and publisher.fallbacks == 0
    assert manifest == latest_manifest(redis_client, run_id) and manifest.transport == "file"
    _assert_file_holds(manifest, engine.module)
    publisher.close()


def test_a_receiver_outside_the_group_that_asks_gets_files(make_model, tmp_path, redis_client, run_id):
    """An MC continuation engine follows the policy from outside the group (``file_too`` off: no
    evaluation, no policy scorer): it asks, and the versions reach it as files."""
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=1
    )
    assert publish(publisher, engine.module, 0)[0] is None  # nobody outside asked
    want_files(redis_client, run_id, "mc0")
    manifest, _ = publish(publisher, engine.module, 0)
    assert manifest == latest_manifest(redis_client, run_id) and manifest.path
    _assert_file_holds(manifest, engine.module)
    publisher.close()


def test_a_receiver_lost_after_joining_turns_the_version_into_a_file(make_model, tmp_path, redis_client, run_id):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", zero_stage=0))
    publisher = CollectivePublisher(
        redis_client, run_id, tmp_path, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=5
    )
    group = open_group(read_group(redis_client, run_id), 1, 5)  # joins...
    publisher.wait()  # ...until rank 0's side of the group has formed too (it may still be connecting)
    assert publisher.collective
    del group  # ...then is gone
    assert publish(publisher, engine.module, 1)[0] is None  # the send runs, and fails, behind
    publisher.wait()
    assert not publisher.collective and publisher.fallbacks == 1
    first = latest_manifest(redis_client, run_id)
    assert first.transport == "file" and first.version == 1
    _assert_file_holds(first, engine.module)
    manifest, _ = publish(publisher, engine.module, 2)  # from now on: files, published on this thread
    assert manifest == latest_manifest(redis_client, run_id) and manifest.version == 2
    publisher.close()
