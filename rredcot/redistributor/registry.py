"""Credit methods: a new method is a function plus ``@register("name", ...)`` in any module.

Methods live in ``common.registry.CREDIT_METHODS`` (so the config checks ``credit.method`` against
them). A method declares what it needs: the scorer (``needs_scorer``), or only the run's tokenizer
(``needs_tokenizer``), a settings dataclass (filled from its block ``credit.settings.<name>`` and
handed to it as ``ctx.settings``) or another method's settings (``settings_of``), a ``check`` of its
rules between config keys, and a ``prover``: whose continuations it samples, from its settings (None:
none). ``credit.method: mypkg.my_method`` imports your module on first use. This module imports no
torch: the built-ins register in ``methods.py`` (the one list of their names), naming their functions
by ``"module:function"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rredcot.common.config import Config
from rredcot.common.records import RolloutGroup
from rredcot.common.registry import CREDIT_METHODS, load_class
from rredcot.common.sampling import ContinuationSampler, RewardFn

if TYPE_CHECKING:
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
    tokenizer: Any = None  # the run's tokenizer: the scorer's, or loaded for a method that ``needs_tokenizer``


CreditFn = Callable[[CreditContext], list[SampleCredit]]
Check = Callable[[Config, Any], None]  # (config, the method's settings): raises ConfigError naming the key
Prover = Callable[[Any], str]  # the method's settings -> "policy", "initial" or a model path


def policy(settings: Any) -> str:
    """The prover of a method that samples from the policy being trained (``mc``)."""
    return "policy"


@dataclass(frozen=True)
class CreditMethod:
    name: str
    fn: CreditFn | str  # the function, or "module:function" (imported on first use)
    return_equivalent: bool  # Σσ = 1 for every sample by design
    needs_scorer: bool = False
    needs_tokenizer: bool = False  # reads token texts (``ctx.tokenizer``) without a scorer
    settings: type | str | None = None  # dataclass of credit.settings.<name> (or "module:Class")
    settings_of: str | None = None  # takes that method's settings (its dataclass and block) instead
    check: Check | None = None  # rules between config keys, run while the config is loaded
    prover: Prover | None = None  # whose continuations it samples; None: it samples none

    @property
    def needs_sampler(self) -> bool:
        """Whether it samples continuations (it declares a prover)."""
        return self.prover is not None

    def __call__(self, ctx: CreditContext) -> list[SampleCredit]:
        """The method's credit for one group."""
        return load_class(self.fn)(ctx)


def add_method(name: str, fn: CreditFn | str, builtin: bool = False, **declared: Any) -> CreditMethod:
    """Register ``fn`` (or the ``"module:function"`` it names) as the credit method ``name``;
    ``builtin``: one of ``methods.py``'s; ``declared``: ``CreditMethod``'s other fields."""
    return CREDIT_METHODS.register(name, builtin=builtin)(CreditMethod(name, fn, **declared))


def register(name: str, **declared: Any) -> Callable[[CreditFn], CreditFn]:
    """Decorator: make ``fn`` the credit method ``name`` (``credit.method=name``); ``declared``:
    ``return_equivalent`` (required), ``needs_scorer``, ``needs_tokenizer``, ``settings`` or
    ``settings_of``, ``check``, ``prover``."""

    def wrap(fn: CreditFn) -> CreditFn:
        add_method(name, fn, **declared)
        return fn

    return wrap
