"""Weight transports: each moves every new policy version from the learner to the engines that sample from it.

A transport is one module holding its publisher (learner side, ``Publisher``: it reads the plain
(name, tensor) buckets of a ``WeightSource``), its receiver (one per weight port: a generator's or the
evaluator's vLLM engine, an MC prover's engine, a policy-following scorer; ``Receiver``), the
engine-side functions its receiver runs where the weights land (``transports.ports``), and what
deployment must know of it (``Deployment``), registered under one name in
``common.registry.WEIGHT_TRANSPORTS`` and picked by ``generation.weight_transport``. The built-ins
are named only here (this module is the registry's registrar), by ``"module:Class"`` references, so
naming one imports no transport module
(docs/extending.md: a new transport is one file plus YAML):

- ``file`` (``transports.file``): one safetensors file + manifest per version; any receiver on the
  learner's filesystem;
- ``collective`` (``transports.collective``): a broadcast group, gloo on CPU and NCCL on GPU,
  falling back to files;
- ``ipc`` (``transports.ipc``): shared slots on the learner's node, ``/dev/shm`` or CUDA IPC;
  receivers elsewhere ask for files.
- ``redis`` (``transports.redis``): each version in the run's Redis, in chunks; any receiver that
  reaches Redis, no shared filesystem.

What they share: ``transports.ports`` (what a receiver updates, ``WeightPort``, the ``Landing`` of its
engine-side functions, and ``WeightsLost``), ``transports.manifest`` (the version's manifest in Redis,
the file's format), ``transports.group`` (the broadcast group) and ``transports.slots`` (the shared
slots).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rredcot.common.config import Config
from rredcot.common.registry import WEIGHT_TRANSPORTS, load_class, typed_settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from rredcot.transports.manifest import WeightManifest
    from rredcot.transports.ports import WeightPort


class WeightSource(Protocol):
    """A version's weights as the learner hands them over (``learner.weights.ModelWeights``)."""

    device: torch.device  # where the learner keeps them

    def columns(self) -> tuple[list[str], list[list[int]], list[str]]:
        """(names, shapes, dtypes) of every tensor, in bucket order, without gathering anything."""
        ...

    def buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """(name, full tensor) buckets, once; a bucket's tensors are valid until the next is asked for."""
        ...


@runtime_checkable
class Publisher(Protocol):
    """The learner side, on learner rank 0 (the other ranks only take part in the gathers)."""

    send_s: float  # seconds spent in background sends
    fallbacks: int  # versions re-published as files after a failed send

    @classmethod
    def from_config(cls, cfg: Config, client: Any, out_dir: Path) -> Publisher: ...

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (its manifest when published on this thread, seconds on the
        training thread). It may stop reading ``weights`` part-way: the learner finishes the gathers."""
        ...

    def close(self) -> None:
        """The last version reaches the receivers; release what the publisher holds."""
        ...


@runtime_checkable
class Receiver(Protocol):
    """The engine side, as its ports' owners use it (a generator, the evaluator, an MC prover, a scorer)."""

    missing_files: int  # versions whose file this node could not find (the generator's weight_files_missing)

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: WeightPort, rank: int | None, name: str | None = None
    ) -> Receiver: ...

    @property
    def holds_group(self) -> bool:
        """Whether the learner's sends wait for this receiver (then it polls until the run ends)."""
        ...

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        """Apply the newest published version if it is newer than the port's: (version, seconds), or None."""
        ...

    def close(self) -> None: ...


SHM_DIR = Path("/dev/shm")  # a node's shared memory, where ``shm_versions`` go


class Deployment:
    """What launch asks of a transport instead of its name; these defaults are the ``file`` transport's.
    A transport with other needs subclasses it and names the subclass in its registry entry."""

    def shared_run_dir(self, cfg: Config) -> bool:
        """Whether receivers read files the learner writes into ``run.dir`` (then every node needs it)."""
        return True

    def shm_versions(self, cfg: Config) -> int:
        """How many weight versions it keeps in ``/dev/shm`` on the learner's node (0: none)."""
        return 0

    def group_size(self, cfg: Config) -> int | None:
        """How many generators the learner's collective group has room for (None: no group); a
        generator added by hand must fit, and NCCL takes one rank per GPU."""
        return None

    def reset(self, client: Any, run_id: str) -> None:
        """Before a run's workers start: forget what an earlier learner of the run left for receivers."""

    def left_behind(self, run_id: str, uid: str) -> list[Path]:
        """What a killed or failed learner leaves on this node outside ``run.dir`` (kept for
        ``run.resume``; the driver says how to free it)."""
        return []


@dataclass(frozen=True)
class WeightTransport:
    """A transport's publisher, receiver, settings and deployment classes (or ``"module:Class"``
    references to them)."""

    publisher: str | type
    receiver: str | type
    settings: str | type | None = None  # dataclass of ``generation.transport_settings``
    deployment: str | type = Deployment

    def typed_settings(self, cfg: Config) -> Any:
        """``generation.transport_settings`` as this transport's settings dataclass (None if it has none)."""
        g = cfg.generation
        owner = f"weight transport {g.weight_transport!r}"
        return typed_settings(self.settings, dict(g.transport_settings), "generation.transport_settings", owner)

    def publisher_class(self) -> type:
        return load_class(self.publisher)

    def receiver_class(self) -> type:
        return load_class(self.receiver)


def deployment(cfg: Config) -> Deployment:
    """The run's transport's ``Deployment``."""
    return load_class(WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).deployment)()


def weight_receiver(cfg: Config, client: Any, port: Any, rank: int | None = None, name: str | None = None) -> Receiver:
    """The run's transport's receiver of ``port`` (``transports.ports.WeightPort``): generator
    ``rank``'s, or with ``rank=None`` a port outside the learner's weight group, named ``name``."""
    transport = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport)
    return transport.receiver_class().from_config(cfg, client, port, rank, name)


WEIGHT_TRANSPORTS.register("file", builtin=True)(
    WeightTransport("rredcot.transports.file:FilePublisher", "rredcot.transports.file:FileReceiver")
)
WEIGHT_TRANSPORTS.register("collective", builtin=True)(
    WeightTransport(
        "rredcot.transports.collective:CollectivePublisher",
        "rredcot.transports.collective:CollectiveReceiver",
        deployment="rredcot.transports.collective:CollectiveDeployment",
    )
)
WEIGHT_TRANSPORTS.register("ipc", builtin=True)(
    WeightTransport(
        "rredcot.transports.ipc:IpcPublisher",
        "rredcot.transports.ipc:IpcReceiver",
        "rredcot.transports.ipc:IpcSettings",
        "rredcot.transports.ipc:IpcDeployment",
    )
)
WEIGHT_TRANSPORTS.register("redis", builtin=True)(
    WeightTransport(
        "rredcot.transports.redis:RedisPublisher",
        "rredcot.transports.redis:RedisReceiver",
        "rredcot.transports.redis:RedisSettings",
        "rredcot.transports.redis:RedisDeployment",
    )
)
