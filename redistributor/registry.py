"""The credit-method registry: a new method is a function plus ``@register("name", ...)``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rredcot.common.config import Config
from rredcot.common.records import RolloutGroup
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


@dataclass
class CreditContext:
    """Everything a method may use for one group."""

    group: RolloutGroup
    advantages: np.ndarray  # float64 [G]
    cfg: Config
    scorer: Scorer | None = None
    sampler: ContinuationSampler | None = None
    reward_fn: RewardFn | None = None


CreditFn = Callable[[CreditContext], list[SampleCredit]]


@dataclass(frozen=True)
class CreditMethod:
    name: str
    fn: CreditFn
    return_equivalent: bool  # Σσ = 1 for every sample by design
    needs_scorer: bool = False
    needs_sampler: bool = False


CREDIT_METHODS: dict[str, CreditMethod] = {}


def register(
    name: str, *, return_equivalent: bool, needs_scorer: bool = False, needs_sampler: bool = False
) -> Callable[[CreditFn], CreditFn]:
    """Decorator: make ``fn`` the credit method ``name`` (``credit.method=name``)."""

    def wrap(fn: CreditFn) -> CreditFn:
        if name in CREDIT_METHODS:
            raise ValueError(f"credit method {name!r} is already registered")
        CREDIT_METHODS[name] = CreditMethod(name, fn, return_equivalent, needs_scorer, needs_sampler)
        return fn

    return wrap


def get_method(name: str) -> CreditMethod:
    if name not in CREDIT_METHODS:
        raise ValueError(f"unknown credit method {name!r}; registered: {sorted(CREDIT_METHODS)}")
    return CREDIT_METHODS[name]
