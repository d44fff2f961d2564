"""Weight transports end to end on a real vLLM engine: a publisher publishes a model, the
transport's receiver applies it; the built-in ``file`` and docs/extending.md's example transport."""

from __future__ import annotations

import pytest

from rredcot.common.config import ConfigError, load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS


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
