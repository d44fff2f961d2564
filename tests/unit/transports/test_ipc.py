"""The ``ipc`` publisher: versions alternate between two stamped slots, files appear only when a
receiver asks or the learner ends, and slots that do not fit turn the run to files."""

from __future__ import annotations

import torch

from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.weights import publish
from rredcot.transports.group import unflatten
from rredcot.transports.ipc import IpcPublisher
from rredcot.transports.manifest import latest_manifest, load_tensors
from rredcot.transports.slots import copy_slot, holds, want_files

CPU = torch.device("cpu")


def _in_slot(manifest) -> dict[str, torch.Tensor]:
    own = copy_slot(manifest.shared, CPU)
    return dict(zip(manifest.names, unflatten(own, manifest.shapes, manifest.dtypes), strict=True))


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _bump(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def test_versions_alternate_between_stamped_slots_and_the_last_becomes_a_file_at_close(
    make_model, tmp_path, redis_client, run_id
):
    model, shm = make_model(), tmp_path / "shm"
    shm.mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=shm)
    assert publish(publisher, model, 0)[0] is None and latest_manifest(redis_client, run_id) is None
    published, manifests = {}, {}
    for version in (1, 2, 3):
        manifest, seconds = publish(publisher, model, version)
        assert manifest == latest_manifest(redis_client, run_id) and seconds > 0
        assert manifest.transport == "ipc" and manifest.path == "" and manifest.shared["index"] == (version + 1) % 2
        published[version], manifests[version] = _params(model), manifest
        slot = _in_slot(manifest)
        assert all(torch.equal(slot[n], t) for n, t in published[version].items())
        assert holds(redis_client, run_id, (version + 1) % 2, version)
        if version == 2:  # version 1 is untouched in the other slot while version 2 is read
            assert holds(redis_client, run_id, 0, 1)
            assert all(torch.equal(_in_slot(manifests[1])[n], t) for n, t in published[1].items())
        _bump(model)
    assert not holds(redis_client, run_id, 0, 1)  # version 3 took its slot: a late copy of 1 is dropped
    assert not (tmp_path / "weights").exists()  # no file until the learner ends
    publisher.close()
    last = latest_manifest(redis_client, run_id)
    assert last.version == 3 and last.transport == "ipc" and last.path
    assert all(torch.equal(load_tensors(last)[n], t) for n, t in published[3].items())
    assert not any(shm.iterdir())  # the slots end with the learner


def test_versions_alternate_slots_whatever_their_numbers(make_model, tmp_path, redis_client, run_id):
    """``broadcast_every=2`` publishes only even versions: they must still alternate, or the newest
    version is overwritten while the next one is written."""
    shm = tmp_path / "shm"
    shm.mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=shm)
    model = make_model()
    assert [publish(publisher, model, v)[0].shared["index"] for v in (2, 4, 6)] == [0, 1, 0]
    publisher.close()


def test_files_are_written_beside_the_slots_once_a_receiver_asks(make_model, tmp_path, redis_client, run_id):
    model, shm = make_model(), tmp_path / "shm"
    shm.mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=shm)
    assert publish(publisher, model, 1)[0].path == ""
    want_files(redis_client, run_id, "gen1")
    manifest, _ = publish(publisher, model, 2)
    assert manifest.transport == "ipc" and manifest.path and manifest.shared["index"] == 1
    assert all(torch.equal(load_tensors(manifest)[n], t) for n, t in _params(model).items())
    publisher.close()


def test_slots_that_cannot_be_allocated_turn_the_run_to_files(make_model, tmp_path, redis_client, run_id, caplog):
    model = make_model()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=tmp_path / "no-such-dir")
    for version in (1, 2):
        manifest, _ = publish(publisher, model, version)
        assert manifest.transport == "file" and manifest.path and manifest.version == version
    assert publisher.fallbacks == 1 and "shared slots do not fit" in caplog.text
    publisher.close()


def test_zero3_rank_0_gathers_into_the_slot_and_another_rank_only_takes_part(
    make_model, tmp_path, redis_client, run_id
):
    model = make_model()
    original = _params(model)
    engine = LearnerEngine(model, LearnerConfig(dtype="float32", zero_stage=3, zero3_persistence_threshold=0))
    assert any(p.numel() == 0 for p in engine.module.parameters())  # really partitioned
    shm = tmp_path / "shm"
    shm.mkdir()
    assert publish(None, engine.module, 1)[0] is None and not any(shm.iterdir())  # another rank: no publisher
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=shm)
    manifest, _ = publish(publisher, engine.module, 1)
    assert manifest.names == list(original) and all(torch.equal(_in_slot(manifest)[n], t) for n, t in original.items())
    publisher.close()


def test_two_runs_of_one_name_on_one_machine_keep_their_own_slots(make_model, tmp_path, redis_server, run_id):
    """Two ``ipc`` runs of one ``run.name``, each with its own Redis (here two databases of one
    server, as two embedded servers in two run.dirs): the second learner's slots are named by its
    own run id, so starting it leaves the first run's slots (and the weights in them) alone. They
    were named by ``run.name``, and a starting learner unlinked the other run's files."""
    from rredcot.common.streams import connect

    shm = tmp_path / "shm"
    shm.mkdir()
    base = redis_server.url.rsplit("/", 1)[0]
    clients = [connect(f"{base}/1"), connect(f"{base}/2")]
    try:
        first, second = (IpcPublisher(c, run_id, tmp_path / f"w{i}", shm_dir=shm) for i, c in enumerate(clients))
        model = make_model()
        kept = _params(model)
        manifest, _ = publish(first, model, 1)
        _bump(model)
        other, _ = publish(second, model, 1)  # the second run's learner starts
        assert other.shared["path"] != manifest.shared["path"] and len(list(shm.iterdir())) == 4
        assert all(torch.equal(_in_slot(manifest)[n], t) for n, t in kept.items())  # the first run's weights
        first.close()
        assert len(list(shm.iterdir())) == 2  # each run frees its own slots only
        second.close()
        assert not any(shm.iterdir())
    finally:
        for c in clients:
            c.close()
