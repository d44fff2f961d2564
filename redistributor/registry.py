"""Credit methods: a new method is a function plus ``@register("name", ...)`` in any module.

Methods live in ``common.registry.CREDIT_METHODS`` (so the config checks ``credit.method`` against
them); a method may declare a settings dataclass, filled from ``credit.settings`` and handed to
it as ``ctx.settings``. ``credit.method: mypkg.my_method`` imports your module on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rredcot.common.config import Config
from rredcot.common.records import RolloutGroup
from rredcot.common.registry import CREDIT_METHODS, typed_settings
from rredcot.common.sampling import ContinuationSampler, RewardFn
from rredcot.redistributor.scorer import Scorer


def _empty(dtype: type) -> np.ndarray:
    return np.zeros(0, dtype=dtype)


@dataclass
class SampleCredit:
    """What a method computes for one sample (empty arrays where the method has no segments)."""

    sigma: np.ndarray  # float32 [L]
    exit_points: np.ndarray = field(default_factory=lambda: _empty(np.int32))
    exit_values: np.ndarray = field(default_factory=lambda: _empty(np.float32))
    segment_rewards: np.ndarray = field(default_factory=lambda: _empty(np.float32))
    timings: dict[str, float] = field(default_factory=dict)
    fallback: str = ""  # why σ fell back to uniform ('' when it did not): sigma.uniform_reason, or 'skipped'
    exit_stderr: np.ndarray = field(default_factory=lambda: _empty(np.float32))  # MC: standard error per exit
    values_version: int = -1  # MC: policy version of the weights that sampled the continuations


@dataclass
class CreditContext:
    """Everything a method may use for one group."""

    group: RolloutGroup
    advantages: np.ndarray  # float64 [G]
    cfg: Config
    scorer: Scorer | None = None
    sampler: ContinuationSampler | None = None
    reward_fn: RewardFn | None = None
    settings: Any = None  # the method's own settings (its ``settings`` dataclass), if it declares any


CreditFn = Callable[[CreditContext], list[SampleCredit]]


@dataclass(frozen=True)
class CreditMethod:
    name: str
    fn: CreditFn
    return_equivalent: bool  # Σσ = 1 for every sample by design
    needs_scorer: bool = False
    needs_sampler: bool = False
    settings: type | None = None  # dataclass of ``credit.settings``

    def typed_settings(self, cfg: Config) -> Any:
        """``credit.settings`` as this method's settings dataclass (None if it declares none)."""
        return typed_settings(
            self.settings, dict(cfg.credit.settings), "credit.settings", f"credit method {self.name!r}"
        )


def register(
    name: str,
    *,
    return_equivalent: bool,
    needs_scorer: bool = False,
    needs_sampler: bool = False,
    settings: type | None = None,
) -> Callable[[CreditFn], CreditFn]:
    """Decorator: make ``fn`` the credit method ``name`` (``credit.method=name``)."""

    def wrap(fn: CreditFn) -> CreditFn:
        CREDIT_METHODS.register(name)(CreditMethod(name, fn, return_equivalent, needs_scorer, needs_sampler, settings))
        return fn

    return wrap


def get_method(name: str) -> CreditMethod:
    """The method registered as ``name`` (built-in, or from the module ``name`` names)."""
    return CREDIT_METHODS.get(name)
