"""Each built-in transport's publisher and receiver, built the way the trainer and a port's owner
build them, have what those use of them (``transports.Publisher``, ``transports.Receiver``); each
says what deployment needs of it (``transports.Deployment``), which launch asks instead of its name."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.common import registry
from rredcot.common.config import load_config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.transports import Deployment, Publisher, Receiver, deployment, weight_receiver


def declared(protocol: type) -> set[str]:
    """The names a protocol requires (its methods, properties and annotated attributes)."""
    return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)


def test_the_protocols_name_what_the_trainer_and_the_ports_owners_use() -> None:
    assert declared(Publisher) == {"from_config", "publish", "close", "send_s", "fallbacks"}
    assert declared(Receiver) == {"from_config", "poll", "holds_group", "close", "missing_files"}


def test_the_builtin_transports_are_named_where_they_are_registered() -> None:
    """Listed once: ``rredcot.transports`` registers them as the registry's built-ins; the registry
    itself names none (it imports that module when a name is first looked up)."""
    assert {"collective", "file", "ipc", "redis"} <= set(WEIGHT_TRANSPORTS.names())
    assert all(WEIGHT_TRANSPORTS.is_builtin(n) for n in ("file", "collective", "ipc", "redis"))
    assert not WEIGHT_TRANSPORTS.is_builtin("tests.extensions.redis_weights")
    source = Path(registry.__file__).read_text()
    assert not any(f'"{n}"' in source for n in ("collective", "ipc")), "common/registry.py lists a transport"


class _Port:
    """A weight port that is never loaded: the receivers here are only built."""

    version = 0


@pytest.mark.parametrize(
    "transport",
    ["file", "collective", "ipc", "redis", "tests.extensions.redis_weights", "tests.extensions.tensor_files"],
)
def test_each_transport_has_a_publisher_and_a_receiver(redis_client, run_id, tmp_path, transport) -> None:
    overrides = [f"run.name={run_id}", f"run.dir={tmp_path}", f"generation.weight_transport={transport}"]
    overrides.append("generation.weight_group_timeout_s=1")  # collective: no generator joins its group
    cfg = load_config("tests", overrides)
    spec = WEIGHT_TRANSPORTS.get(transport)
    publisher = spec.publisher_class().from_config(cfg, redis_client, tmp_path / "weights")
    receiver = weight_receiver(cfg, redis_client, _Port(), name="t0")  # outside the weight group: joins nothing
    for obj, protocol in ((publisher, Publisher), (receiver, Receiver)):
        missing = sorted(n for n in declared(protocol) if not hasattr(obj, n))
        assert missing == [], f"{type(obj).__name__} lacks {missing}"
        assert isinstance(obj, protocol)
    assert not isinstance(publisher, Receiver) and not isinstance(receiver, Publisher)  # the check tells them apart
    publisher.close()
    receiver.close()


def needs(transport: str, *overrides: str) -> tuple[bool, int, int | None]:
    cfg = load_config("tests", [f"generation.weight_transport={transport}", *overrides])
    d = deployment(cfg)
    assert isinstance(d, Deployment)
    return d.shared_run_dir(cfg), d.shm_versions(cfg), d.group_size(cfg)


def test_each_transport_says_what_deployment_needs_of_it() -> None:
    """(shared run.dir, /dev/shm versions, weight group's generators), as docs/multinode.md tells them."""
    assert needs("file") == (True, 0, None)
    assert needs("redis") == (False, 0, None)  # every receiver reads the run's Redis
    assert needs("ipc") == (True, 2, None)  # a CPU learner: two versions in /dev/shm; files for other nodes
    assert needs("ipc", "cluster.gpus_per_learner=1", "cluster.gpus_per_generator=1")[1] == 0  # on its GPU
    assert needs("collective", "cluster.generators=3", "data.eval_size=0") == (False, 0, 3)
    assert needs("collective", "data.eval_size=8")[0]  # the evaluator reads files
    assert needs("collective", "data.eval_size=0", "credit.scorer.model=policy")[0]  # so does a policy scorer
