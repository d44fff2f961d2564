"""Each built-in transport's publisher and receiver, built the way the trainer and a port's owner
build them, have what those use of them (``transports.Publisher``, ``transports.Receiver``)."""

from __future__ import annotations

import pytest

from rredcot.common.config import load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.transports import Publisher, Receiver, weight_receiver


def declared(protocol: type) -> set[str]:
    """The names a protocol requires (its methods, properties and annotated attributes)."""
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def test_the_protocols_name_what_the_trainer_and_the_ports_owners_use() -> None:
    assert declared(Publisher) == {"from_config", "publish", "close", "send_s", "fallbacks"}
    assert declared(Receiver) == {"from_config", "poll", "holds_group", "close", "missing_files"}


class _Port:
    """A weight port that is never loaded: the receivers here are only built."""

    version = 0


@pytest.mark.parametrize("transport", ["file", "collective", "ipc", "redis", "tests.extensions.redis_weights"])
def test_each_transport_has_a_publisher_and_a_receiver(redis_client, run_id, tmp_path, transport) -> None:
    overrides = [f"run.name={run_id}", f"run.dir={tmp_path}", f"generation.weight_transport={transport}"]
    cfg = load_config("tests", overrides)
    spec = WEIGHT_TRANSPORTS.get(transport)
    publisher = spec.publisher_class().from_config(cfg, redis_client, 1, tmp_path / "weights")  # rank 1: hosts nothing
    receiver = weight_receiver(cfg, redis_client, _Port(), name="t0")  # outside the weight group: joins nothing
    for obj, protocol in ((publisher, Publisher), (receiver, Receiver)):
        missing = sorted(n for n in declared(protocol) if not hasattr(obj, n))
        assert missing == [], f"{type(obj).__name__} lacks {missing}"
        assert isinstance(obj, protocol)
    assert not isinstance(publisher, Receiver) and not isinstance(receiver, Publisher)  # the check tells them apart
    publisher.close()
    receiver.close()
