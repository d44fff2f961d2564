"""What a weight receiver updates: a *weight port*, and the error of a version lost part-way into one.

A port holds the weights a receiver updates: a generator's or the evaluator's vLLM engine
(``actors.engine.Engine``), or a redistributor's scorer following the policy
(``redistributor.scorer_weights.ScorerPort``). The receivers know ports only by this protocol, so
no transport imports a stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rredcot.transports.group import GroupInfo
    from rredcot.transports.manifest import WeightManifest


class WeightsLost(RuntimeError):
    """A version failed part-way into a port: its weights are a mix of two versions, so it must not be
    used again (its worker ends; the supervisor restarts it on the newest weights)."""


class WeightPort(Protocol):
    """What a receiver updates: the version it holds and the two ways to load one. Each load returns
    the seconds of the update (``load_weights_shared``: None when the slot was overwritten during the
    copy, a newer version being there to take) and raises ``WeightsLost`` if it failed part-way."""

    @property
    def version(self) -> int: ...

    def load_weights_bytes(self, data: bytes, version: int, in_flight: str = "finish") -> float: ...

    def load_weights_shared(
        self, manifest: WeightManifest, still_held: Callable[[], bool], in_flight: str = "finish"
    ) -> float | None: ...


class GroupWeightPort(WeightPort, Protocol):
    """A port that can also be a rank of the learner's weight group (a generator's engine)."""

    def join_weight_group(self, info: GroupInfo, rank: int, timeout_s: float) -> None: ...

    def leave_weight_group(self) -> None: ...

    def load_weights_broadcast(self, manifest: WeightManifest, in_flight: str = "finish") -> tuple[int, float]: ...
