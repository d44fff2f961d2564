"""The scorer as a weight port: with ``credit.scorer.model=policy`` it follows the learner's published
versions through the run's weight transport, with the same receiver a generator's engine has
(``transports``), outside the learner's weight group (it reads files, or ``ipc`` slots
on the learner's node)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from safetensors.torch import load as st_load

from rredcot.redistributor.scorer import Scorer
from rredcot.transports.manifest import WeightManifest
from rredcot.transports.ports import WeightsLost
from rredcot.transports.slots import copy_slot, slot_tensors


class ScorerPort:
    """``transports.ports.WeightPort`` over a ``Scorer`` (on the CPU or its GPU). It runs no
    requests of its own, so every in-flight policy is the same: load at once."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer

    @property
    def version(self) -> int:
        return self.scorer.version

    def load_weights_bytes(self, data: bytes, version: int, in_flight: str = "finish") -> float:
        start = time.perf_counter()
        self._load(st_load(data), version)
        return time.perf_counter() - start

    def load_weights_shared(
        self, manifest: WeightManifest, still_held: Callable[[], bool], in_flight: str = "finish"
    ) -> float | None:
        start = time.perf_counter()
        own = copy_slot(manifest.shared, torch.device("cpu"))  # raises when the slot is gone: the file next
        if not still_held():  # overwritten during the copy: a newer version is there to take
            return None
        self._load(slot_tensors(own, manifest), manifest.version)
        return time.perf_counter() - start

    def _load(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        try:
            self.scorer.load_weights(tensors, version)
        except Exception as e:  # load_state_dict copies what fits before it raises
            raise WeightsLost(f"weights v{version} failed part-way into a scorer holding v{self.version}") from e
