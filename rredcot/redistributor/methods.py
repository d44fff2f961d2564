"""The built-in credit methods as registered, the one place their names are listed (the registry
imports this module to learn them): each one's settings dataclass (``credit.settings.<name>``), its
rules between config keys (``check``) and its prover, its function named by ``"module:function"``
and imported when a group is first credited. Light on purpose (no torch): loading a config checks
every block of settings and the chosen method's rules without importing a stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rredcot.common.config_fields import require
from rredcot.common.config_schema import COUNT_MAX, Config, bounded, choice
from rredcot.redistributor.registry import add_method, policy
from rredcot.tasks.task import build_task


def _answer_part() -> Any:
    """After the thinking span (docs/credit.md, "The answer part"): GRPO's weight, or one more
    segment whose end value is the outcome R."""
    return choice("uniform", "uniform", "terminal")


@dataclass
class TopEntropySettings:
    """``credit.settings.top_entropy``."""

    fraction: float = bounded(0.2, 0.0, 1.0, lo_open=True)  # share of the completion's tokens that get σ


@dataclass
class ValueSettings:
    """What the value-based methods (``rredcot``, ``mc``) share: σ from the change of value."""

    value_space: str = choice("log", "log", "prob", "mean_token_prob")
    sign: str = choice("relu", "relu", "abs", "softmax")
    softmax_temperature: float = bounded(1.0, 1e-6, 1e6)
    uniform_mix: float = bounded(0.0, 0.0, 1.0)  # lambda
    answer_part: str = _answer_part()


@dataclass
class RredcotSettings(ValueSettings):
    """``credit.settings.rredcot``: exit values from the scorer's branches on reference pairs."""

    # λ: a floor of uniform weight. At 0 the relu sign with the group baseline left 40% of the chain
    # task's tokens with σ = 0 and learned less than GRPO (one seed); at 0.3 as much (five seeds, docs/study.md)
    uniform_mix: float = bounded(0.3, 0.0, 1.0)
    group_refs: bool = False  # add the group's correct completions as reference pairs
    # what a branch scores (docs/credit.md): the whole reference, the answer alone, or the reference's
    # remaining steps from each of its step boundaries, then the answer
    reference: str = choice("suffix", "solution", "answer", "suffix")
    # reference=suffix: step boundaries per reference pair (0 and |u| kept)
    max_suffixes: int = bounded(8, 2, COUNT_MAX)
    # reference=suffix: score only the W starts nearest the exit's relative position (0: every start)
    suffix_window: int = bounded(0, 0, COUNT_MAX)
    # group: less the other traces' values at the same relative segment position
    baseline: str = choice("group", "none", "group")
    max_refs: int = bounded(4, 1, COUNT_MAX)


@dataclass
class OracleSettings:
    """``credit.settings.oracle``: the positive control's floor of uniform weight."""

    uniform_mix: float = bounded(0.3, 0.0, 1.0)  # λ, rredcot's default: the two compare at the same floor


@dataclass
class McSettings(ValueSettings):
    """``credit.settings.mc``: exit values from continuations sampled by the policy."""

    samples: int = bounded(4, 1, COUNT_MAX)  # M: continuations per exit point


@dataclass
class ProgressSettings:
    """``credit.settings.progress``."""

    alpha: float = bounded(1.0, 0.0, 1e6)  # weight of the prover's progress against the outcome advantage
    prover: str = "initial"  # "initial" (model.path's weights, frozen), "policy" (follows them), or a model path
    samples: int = bounded(4, 1, COUNT_MAX)  # M: prover continuations per exit point
    answer_part: str = _answer_part()


def check_bnpo(cfg: Config, settings: None) -> None:
    require(
        cfg.learner.loss_agg == "token",
        "learner.loss_agg",
        cfg.learner.loss_agg,
        "'token' with credit.method=bnpo (BNPO is the token mean over the batch)",
    )


def check_drgrpo(cfg: Config, settings: None) -> None:
    require(
        cfg.learner.loss_agg == "sample",
        "learner.loss_agg",
        cfg.learner.loss_agg,
        "'sample' with credit.method=drgrpo (Dr. GRPO divides each sample by the constant max_tokens)",
    )
    require(
        not cfg.credit.advantage_std_norm,
        "credit.advantage_std_norm",
        cfg.credit.advantage_std_norm,
        "false with credit.method=drgrpo (Dr. GRPO does not divide advantages by their std)",
    )


def _unset(settings: Any, name: str) -> bool:
    """Whether ``settings.<name>`` holds its default (a value the run would not use is no mistake then)."""
    return getattr(settings, name) == getattr(type(settings)(), name)


def check_values(settings: ValueSettings, block: str) -> None:
    """What rredcot and mc share: a setting the value settings around it leave unused is an error
    naming both keys, not a silent no-op."""
    require(
        settings.sign == "softmax" or _unset(settings, "softmax_temperature"),
        f"credit.settings.{block}.softmax_temperature",
        settings.softmax_temperature,
        f"1.0 (its default) with credit.settings.{block}.sign={settings.sign!r}: only sign=softmax uses a "
        f"temperature; set credit.settings.{block}.sign=softmax, or leave the temperature unset",
    )


def check_rredcot(cfg: Config, settings: RredcotSettings) -> None:
    require(
        settings.answer_part != "terminal" or settings.value_space != "log",
        "credit.settings.rredcot.value_space",
        settings.value_space,
        "'prob' or 'mean_token_prob' with credit.settings.rredcot.answer_part=terminal (the outcome R is a "
        "probability; log R is -inf for a wrong answer)",
    )
    for name in ("suffix_window", "max_suffixes"):  # only the suffix construct has starts to choose from
        require(
            settings.reference == "suffix" or _unset(settings, name),
            f"credit.settings.rredcot.{name}",
            getattr(settings, name),
            f"{getattr(RredcotSettings(), name)} (its default) with credit.settings.rredcot.reference="
            f"{settings.reference!r}: only reference=suffix scores suffix starts; set "
            f"credit.settings.rredcot.reference=suffix, or leave {name} unset",
        )
    check_values(settings, "rredcot")


def check_mc(cfg: Config, settings: McSettings) -> None:
    check_values(settings, "mc")


def check_oracle(cfg: Config, settings: OracleSettings) -> None:
    task = build_task(cfg.task)
    op = getattr(task.settings, "op", None)
    which = f"task {cfg.task.name!r}" + (f" with task.settings.op={op!r}" if op is not None else "")
    require(
        task.checks_slips,
        "credit.method",
        cfg.credit.method,
        f"a task with a slip checker (Task.checks_slips; e.g. task.name=arith with task.settings.op=chain): "
        f"the oracle blames the first wrong line the checker names, and {which} has none",
    )


def check_shuffled(cfg: Config, settings: RredcotSettings) -> None:
    """rredcot's rules, and a segmentation that can make two segments (one has nothing to permute)."""
    check_rredcot(cfg, settings)
    seg = cfg.credit.segmentation
    if not (seg.merge or seg.homogenise):  # every keyword piece is a segment
        return
    why = "with credit.method=shuffled (its segments' masses are permuted: one segment leaves nothing to permute)"
    require(
        seg.segments > 1 or not seg.stop_at_k,
        "credit.segmentation.segments",
        seg.segments,
        f">= 2 {why}",
    )
    require(
        2 * seg.min_segment_tokens <= cfg.generation.max_tokens,
        "credit.segmentation.min_segment_tokens",
        seg.min_segment_tokens,
        f"<= half of generation.max_tokens ({cfg.generation.max_tokens}) {why}",
    )


def own_prover(settings: ProgressSettings) -> str:
    """``progress``'s prover: the one its settings name."""
    return settings.prover


def add_builtin(name: str, fn: str, **declared: Any) -> None:
    """Register the built-in credit method ``name``: this module is ``CREDIT_METHODS``' registrar,
    and these calls are the one list of the built-ins' names."""
    add_method(name, fn, builtin=True, **declared)


CREDIT, VALUES = "rredcot.redistributor.credit", "rredcot.redistributor.value_credit"
add_builtin("grpo", f"{CREDIT}:grpo", return_equivalent=True)
add_builtin("bnpo", f"{CREDIT}:bnpo", return_equivalent=True, check=check_bnpo)
add_builtin("drgrpo", f"{CREDIT}:drgrpo", return_equivalent=False, check=check_drgrpo)
add_builtin("entropy", f"{CREDIT}:entropy_credit", return_equivalent=True, needs_scorer=True)
add_builtin(
    "top_entropy", f"{CREDIT}:top_entropy", return_equivalent=True, needs_scorer=True, settings=TopEntropySettings
)
add_builtin(
    "rredcot",
    f"{VALUES}:rredcot",
    return_equivalent=True,
    needs_scorer=True,
    settings=RredcotSettings,
    check=check_rredcot,
)
add_builtin(
    "shuffled",
    "rredcot.redistributor.shuffled:shuffled",
    return_equivalent=True,
    needs_scorer=True,
    settings_of="rredcot",
    check=check_shuffled,
)
add_builtin(
    "oracle",
    "rredcot.redistributor.oracle:oracle",
    return_equivalent=True,
    needs_tokenizer=True,
    settings=OracleSettings,
    check=check_oracle,
)
add_builtin(
    "mc", f"{VALUES}:mc", return_equivalent=True, needs_scorer=True, settings=McSettings, prover=policy, check=check_mc
)
add_builtin(
    "progress",
    "rredcot.redistributor.progress:progress",
    return_equivalent=True,
    needs_scorer=True,
    settings=ProgressSettings,
    prover=own_prover,
)
