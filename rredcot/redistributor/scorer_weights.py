"""The scorer as a weight port: with ``credit.scorer.model=policy`` it follows the learner's published
versions through the run's weight transport, with the same receiver a generator's engine has
(``transports``), outside the learner's weight group (it reads files, or ``ipc`` slots
on the learner's node). The transport's engine-side functions run here, in the scorer's process."""

from __future__ import annotations

import time
from typing import Any

import torch

from rredcot.common.registry import load_class
from rredcot.redistributor.scorer import Scorer
from rredcot.transports.ports import Landing, WeightsLost


class ScorerPort:
    """``transports.ports.WeightPort`` over a ``Scorer`` (on the CPU or its GPU; versions land in host
    memory). It runs no requests of its own, so every in-flight policy is the same: load at once."""

    def __init__(self, scorer: Scorer) -> None:
        self.scorer = scorer
        self.landing = Landing(torch.device("cpu"))

    @property
    def version(self) -> int:
        return self.scorer.version

    def receive(self, function: str, **kwargs: Any) -> Any:
        return load_class(function)(self.landing, **kwargs)

    def apply(self, version: int, in_flight: str = "finish") -> float:
        start = time.perf_counter()
        tensors = self.landing.take()
        try:
            self.scorer.load_weights(tensors, version)
        except Exception as e:  # load_state_dict copies what fits before it raises
            raise WeightsLost(f"weights v{version} failed part-way into a scorer holding v{self.version}") from e
        return time.perf_counter() - start

    def drop(self) -> None:
        self.landing.drop()
