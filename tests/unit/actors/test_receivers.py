"""Weight transports end to end on a real vLLM engine: a publisher publishes a model, the
transport's receiver applies it; the built-in ``file`` and docs/extending.md's example transport.
And a file receiver on a node that does not see the learner's files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rredcot.actors.receivers import FileReceiver
from rredcot.common.config import ConfigError, load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.weight_sync import publish_weights


@pytest.mark.parametrize(("transport", "settings"), [("file", "{}"), ("tests.extensions.redis_weights", "{keep: 1}")])
def test_published_versions_reach_the_engine(tied, helpers, redis_client, run_id, tmp_path, transport, settings):
    engine, m0, m1, _ = tied
    overrides = [f"generation.weight_transport={transport}", f"generation.transport_settings={settings}"]
    cfg = load_config("tests", [f"run.name={run_id}", f"run.dir={tmp_path}", *overrides])
    spec = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport)
    publisher = spec.publisher_class().from_config(cfg, redis_client, 0, tmp_path / "weights")
    receiver = spec.receiver_class().from_config(cfg, redis_client, engine, 0)
    assert receiver.poll() is None and not receiver.holds_group  # nothing published yet
    start = engine.version
    for version, model in ((start + 1, m1), (start + 2, m0)):
        publisher.publish(model, version)
        applied, seconds = receiver.poll()
        assert applied == engine.version == version and seconds > 0
        helpers.check_greedy(engine, model, version)
        assert receiver.poll() is None  # applied once
    publisher.close()
    receiver.close()
    if transport != "file":  # its setting took effect: only the newest version is kept in Redis
        assert [redis_client.exists(f"rredcot:{run_id}:weights:blob:{v}") for v in (start + 1, start + 2)] == [0, 1]


def test_transport_settings_are_checked():
    with pytest.raises(ConfigError, match=r"generation.transport_settings.keep = 0 is not allowed; expected a number"):
        load_config(
            "tests",
            ["generation.weight_transport=tests.extensions.redis_weights", "generation.transport_settings={keep: 0}"],
        )
    with pytest.raises(ConfigError, match=r"expected \{\}: weight transport 'file' takes no settings"):
        load_config("tests", ["generation.transport_settings={keep: 1}"])


class _Loads:
    """Stands in for the engine where only its version and the bytes it is handed matter."""

    version = 0

    def load_weights_bytes(self, data: bytes, version: int, in_flight: str) -> float:
        self.version = version
        return 0.5


def test_a_file_this_node_cannot_see_is_an_error_counted_and_retried(redis_client, run_id, tmp_path, caplog):
    engine = _Loads()
    receiver = FileReceiver(redis_client, run_id, engine, "gen0")
    m = publish_weights(redis_client, run_id, 1, [("w", torch.ones(2))], tmp_path / "learner")
    hidden = Path(m.path).rename(tmp_path / "elsewhere")  # on the learner's disk, not this node's
    with caplog.at_level(logging.ERROR, logger="rredcot.actors.receivers"):
        assert receiver.poll() is None and receiver.poll() is None
    assert receiver.missing_files == 1 and len(caplog.records) == 1  # once per version, retried on every poll
    assert m.path in caplog.text and "run.dir" in caplog.text and "weight_transport=collective" in caplog.text
    hidden.rename(m.path)  # the mount catches up
    assert receiver.poll() == (1, 0.5) and engine.version == 1


def test_a_pruned_file_is_silently_skipped_for_the_newer_version(redis_client, run_id, tmp_path, caplog):
    receiver = FileReceiver(redis_client, run_id, _Loads(), "gen0")
    old = publish_weights(redis_client, run_id, 1, [("w", torch.ones(2))], tmp_path, keep=1)
    publish_weights(redis_client, run_id, 2, [("w", torch.zeros(2))], tmp_path, keep=1)  # prunes v1
    with caplog.at_level(logging.ERROR, logger="rredcot.actors.receivers"):
        assert receiver._apply_file(old, "finish") is None  # read between the two publications
    assert receiver.missing_files == 0 and not caplog.records
    assert receiver.poll() == (2, 0.5)
