"""Weight transports end to end on a real vLLM engine: a publisher publishes a model, the
transport's receiver applies it; the built-in ``file`` and docs/extending.md's example transport."""

from __future__ import annotations

import pytest

from rredcot.common.config import load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS


@pytest.mark.parametrize("transport", ["file", "tests.extensions.redis_weights"])
def test_published_versions_reach_the_engine(tied, helpers, redis_client, run_id, tmp_path, transport):
    engine, m0, m1, _ = tied
    cfg = load_config(
        "tests", [f"run.name={run_id}", f"run.dir={tmp_path}", f"generation.weight_transport={transport}"]
    )
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
