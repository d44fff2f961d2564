"""What a weight receiver updates: a *weight port*, where its transport's engine-side functions land
a version, and the error of a version lost part-way into one.

A port holds the weights a receiver updates: a generator's or the evaluator's vLLM engine
(``actors.engine.Engine``, whose worker extension runs the functions inside each engine worker), or a
redistributor's scorer following the policy (``redistributor.scorer_weights.ScorerPort``, in its own
process). A receiver moves a version in two calls: ``receive`` runs one of its transport's
engine-side functions, named ``"module:function"``, where the weights go (it is called as
``function(landing, **kwargs)`` with plain data only, and holds the tensors it got on the
``Landing``), then ``apply`` puts what is held into the model. The ports know no transport, and no
transport imports a stage: a new transport brings its own engine-side functions (docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


class WeightsLost(RuntimeError):
    """A version failed part-way into a port: its weights are a mix of two versions, so it must not be
    used again (its worker ends; the supervisor restarts it on the newest weights)."""


class Landing:
    """Where an engine-side function lands a version: the ``device`` of the port's worker (``rank``
    within its engine: a tensor-parallel engine has one landing per worker), the tensors it
    ``hold``s until the port applies them, and ``state`` that the transport keeps between calls
    (e.g. its weight group)."""

    def __init__(self, device: torch.device, rank: int = 0) -> None:
        self.device, self.rank = device, rank
        self.state: dict[str, Any] = {}
        self._held: dict[str, torch.Tensor] | None = None

    def hold(self, tensors: dict[str, torch.Tensor]) -> int:
        """Keep ``tensors`` (HF names) for the next ``apply``; returns how many."""
        self._held = tensors
        return len(tensors)

    def take(self) -> dict[str, torch.Tensor]:
        """What was held (then nothing is)."""
        if self._held is None:
            raise RuntimeError("no weights were received to apply")
        tensors, self._held = self._held, None
        return tensors

    def drop(self) -> None:
        self._held = None


def function_ref(function: Callable[..., Any]) -> str:
    """``"module:function"``: how an engine-side function is named across a process boundary."""
    return f"{function.__module__}:{function.__qualname__}"


class WeightPort(Protocol):
    """What a receiver updates: the version it holds, ``receive`` (run an engine-side function where
    the weights land; its plain result), ``apply`` (what was received becomes ``version`` under the
    in-flight policy; the seconds of the update; ``WeightsLost`` if it failed part-way) and ``drop``
    (forget what was received: a slot overwritten during the copy)."""

    @property
    def version(self) -> int: ...

    def receive(self, function: str, **kwargs: Any) -> Any: ...

    def apply(self, version: int, in_flight: str = "finish") -> float: ...

    def drop(self) -> None: ...
