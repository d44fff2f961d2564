"""Weight transports: each is a publisher (learner side) and a receiver (engine side) under one name.

``generation.weight_transport`` picks one from ``common.registry.WEIGHT_TRANSPORTS``. The two
classes are named by ``"module:Class"`` (or given as classes), so that the learner never imports
the engine side and the generators never import the learner side. The interface they implement
is described in docs/extending.md; the built-ins:

- ``file``: one safetensors file + manifest per version (``learner.broadcast.FilePublisher``,
  ``common.weight_receivers.FileReceiver``); any receiver on the learner's filesystem;
- ``collective``: a broadcast group, gloo on CPU and NCCL on GPU, falling back to files
  (``learner.broadcast.CollectivePublisher``, ``common.weight_receivers.CollectiveReceiver``);
- ``ipc``: shared slots on the learner's node, ``/dev/shm`` or CUDA IPC (``learner.ipc.IpcPublisher``,
  ``common.weight_receivers.IpcReceiver``); receivers elsewhere ask for files.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rredcot.common.config import Config, ConfigError, choice
from rredcot.common.registry import WEIGHT_TRANSPORTS, typed_settings


def _load(ref: str | type) -> type:
    if isinstance(ref, type):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class WeightTransport:
    """A transport's publisher and receiver classes (or ``"module:Class"`` references to them)."""

    publisher: str | type
    receiver: str | type
    settings: type | None = None  # dataclass of ``generation.transport_settings``

    def typed_settings(self, cfg: Config) -> Any:
        """``generation.transport_settings`` as this transport's settings dataclass (None if it has none)."""
        g = cfg.generation
        owner = f"weight transport {g.weight_transport!r}"
        return typed_settings(self.settings, dict(g.transport_settings), "generation.transport_settings", owner)

    def publisher_class(self) -> type:
        return _load(self.publisher)

    def receiver_class(self) -> type:
        return _load(self.receiver)


def weight_receiver(cfg: Config, client: Any, port: Any, rank: int | None = None, name: str | None = None) -> Any:
    """The run's transport's receiver of ``port`` (``common.weight_receivers.WeightPort``): generator
    ``rank``'s, or with ``rank=None`` a port outside the learner's weight group, named ``name``."""
    transport = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport)
    return transport.receiver_class().from_config(cfg, client, port, rank, name)


WEIGHT_TRANSPORTS.register("file")(
    WeightTransport("rredcot.learner.broadcast:FilePublisher", "rredcot.common.weight_receivers:FileReceiver")
)
WEIGHT_TRANSPORTS.register("collective")(
    WeightTransport(
        "rredcot.learner.broadcast:CollectivePublisher", "rredcot.common.weight_receivers:CollectiveReceiver"
    )
)


@dataclass
class IpcSettings:
    """``generation.transport_settings`` of ``ipc``."""

    memory: str = choice("auto", "auto", "host", "device")  # the slots' memory; auto: the learner's device

    def check(self, cfg: Config) -> None:
        if self.memory == "device" and cfg.cluster.gpus_per_learner == 0:
            raise ConfigError(
                "generation.transport_settings.memory = 'device' needs a GPU learner (cluster.gpus_per_learner "
                "is 0); expected 'auto' or 'host'"
            )


WEIGHT_TRANSPORTS.register("ipc")(
    WeightTransport("rredcot.learner.ipc:IpcPublisher", "rredcot.common.weight_receivers:IpcReceiver", IpcSettings)
)
