"""A weight port that stands in for an engine: it runs a transport's engine-side functions in this
process on a CPU landing (as a scorer's port does) and records what it was handed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rredcot.common.registry import load_class
from rredcot.transports.ports import Landing


class StandInPort:
    """``transports.ports.WeightPort`` without a model: ``apply`` takes the version (0.5 s, say), ``data``
    the last bytes handed to it, ``copied`` the slots copied, ``between`` runs after each receive."""

    def __init__(self, between: Callable[[], Any] = lambda: None) -> None:
        self.version, self.data, self.copied, self.between = 0, b"", [], between
        self.landing = Landing(torch.device("cpu"))

    def receive(self, function: str, **kwargs: Any) -> Any:
        out = load_class(function)(self.landing, **kwargs)
        self.data = kwargs.get("data", self.data)
        if "handle" in kwargs:
            self.copied.append(kwargs["handle"]["index"])
        self.between()
        return out

    def apply(self, version: int, in_flight: str = "finish") -> float:
        self.landing.take()
        self.version = version
        return 0.5

    def drop(self) -> None:
        self.landing.drop()
