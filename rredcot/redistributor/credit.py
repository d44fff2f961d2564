"""Credit methods that need no exit values (grpo, bnpo, drgrpo, entropy, top_entropy; ``rredcot``
and ``mc`` live in ``value_credit.py``; ``progress``, ``shuffled`` and ``oracle`` in modules of their
own; all registered, with their settings, in ``methods.py``), group advantages, the scorer's
batched trace pass, and ``redistribute_group``: RolloutGroup in, WeightedGroup out."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rredcot.common.config import Config, CreditSpec, resolve_credit
from rredcot.common.records import RolloutGroup, RolloutRecord, WeightedGroup, WeightedSample
from rredcot.common.sampling import ContinuationSampler, RewardFn
from rredcot.redistributor.entropy import TraceScores, halve_on_oom, score_traces
from rredcot.redistributor.methods import TopEntropySettings
from rredcot.redistributor.registry import CreditContext, SampleCredit
from rredcot.redistributor.scorer import Scorer


def group_advantages(rewards: Sequence[float], std_norm: bool, eps: float = 1e-6) -> np.ndarray:
    """GRPO: A_i = R_i − mean(R), divided by (population std + eps) when ``std_norm``."""
    r = np.asarray(rewards, dtype=np.float64)
    a = r - r.mean()
    return a / (r.std() + eps) if std_norm else a


def uniform_sigma(n: int, weight: float | None = None) -> np.ndarray:
    return np.full(n, 1.0 / n if weight is None else weight, dtype=np.float32) if n else np.zeros(0, np.float32)


def grpo(ctx: CreditContext) -> list[SampleCredit]:
    """σ = 1/|o|."""
    return [SampleCredit(uniform_sigma(len(s.completion_ids))) for s in ctx.group.samples]


def bnpo(ctx: CreditContext) -> list[SampleCredit]:
    """σ = 1/|o|; the batch token mean that defines BNPO is the learner's ``loss_agg=token``
    (c_i = |o_i|/N_tokens, so every token of the global batch weighs 1/N_tokens), which the config
    requires with this method."""
    return grpo(ctx)


def drgrpo(ctx: CreditContext) -> list[SampleCredit]:
    """σ = 1/M with M = ``generation.max_tokens``; with the learner's ``loss_agg=sample`` and
    advantages not divided by their std (both required by the config), this is Dr. GRPO's loss."""
    m = ctx.cfg.generation.max_tokens
    return [SampleCredit(uniform_sigma(len(s.completion_ids), 1.0 / m)) for s in ctx.group.samples]


def scorer_of(ctx: CreditContext) -> Scorer:
    if ctx.scorer is None:
        raise ValueError(f"credit method {ctx.cfg.credit.method!r} needs a scorer model")
    return ctx.scorer


def budget_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped by ascending length so that rows × longest row ≤ ``budget`` (≥ 1 per batch)."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def scored_traces(ctx: CreditContext, keep_cache: bool) -> Iterator[tuple[int, RolloutRecord, TraceScores, float]]:
    """(index, sample, trace, scorer seconds per sample), one ``credit.scorer.token_budget`` batch at a time.

    A batch's KV cache is released before the next batch's forward (one batch's cache is held at a
    time). A failed allocation redoes the batch with half the budget, which then holds for the rest
    of the group (``halve_on_oom``, as the branches do; counted in ``scorer.tokens.oom_retries``)."""
    scorer, group = scorer_of(ctx), ctx.group
    c, prompt = ctx.cfg.credit.scorer, group.prompt_ids.tolist()
    comps = [s.completion_ids.tolist() for s in group.samples]
    lengths = [len(prompt) + len(x) for x in comps]
    left, budget = list(range(len(comps))), c.token_budget

    def next_batch(budget: int) -> tuple[list[int], list[TraceScores]]:
        batch = [left[j] for j in budget_batches([lengths[i] for i in left], budget)[0]]
        seqs = [(prompt, comps[i]) for i in batch]
        return batch, score_traces(scorer.model, seqs, c.entropy_chunk, keep_cache=keep_cache, forward_chunk=budget)

    while left:
        t0 = time.perf_counter()
        (batch, traces), budget = halve_on_oom(next_batch, budget, 1, scorer.tokens)
        seconds = (time.perf_counter() - t0) / len(batch)
        scorer.tokens.trace += sum(t.counter.trace for t in traces)
        for i, trace in zip(batch, traces):
            yield i, group.samples[i], trace, seconds
        for trace in traces:  # the caller still holds the last one
            trace.cache = None
        left = [i for i in left if i not in batch]


def entropy_weights(trace: TraceScores) -> np.ndarray:
    """The ``entropy`` method's unnormalised σ: the scorer's token entropies (non-finite ones count
    as 0), or all ones when they are all 0 (float64 [L])."""
    h = np.nan_to_num(trace.entropy.double().cpu().numpy(), nan=0.0, posinf=0.0, neginf=0.0).clip(min=0.0)
    return h if h.sum() > 0 else np.ones_like(h)


def entropy_credit(ctx: CreditContext) -> list[SampleCredit]:
    """σ ∝ scorer token entropy (non-finite entropies count as 0; uniform when all are 0)."""
    out: list[SampleCredit] = [SampleCredit(uniform_sigma(0))] * len(ctx.group.samples)
    for i, _, trace, seconds in scored_traces(ctx, keep_cache=False):
        w = entropy_weights(trace)
        out[i] = SampleCredit((w / w.sum()).astype(np.float32), timings={"entropy": seconds})
    return out


def top_entropy_sigma(entropy: np.ndarray, fraction: float) -> np.ndarray:
    """σ uniform over the ⌈fraction·L⌉ tokens of highest entropy (non-finite entropies count as 0;
    ties go to the earlier token), 0 elsewhere; ``fraction`` is taken as the decimal it prints as,
    so 0.07 of 100 tokens is 7, not 8."""
    n = len(entropy)
    k = math.ceil(Fraction(repr(fraction)) * n)
    h = np.nan_to_num(np.asarray(entropy, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    sigma = np.zeros(n, np.float32)
    sigma[np.argsort(-h, kind="stable")[:k]] = 1.0 / k if k else 0.0
    return sigma


def top_entropy(ctx: CreditContext) -> list[SampleCredit]:
    """σ uniform over the top ``settings.fraction`` of completion tokens by scorer entropy (the
    "top-20% high-entropy tokens" baseline)."""
    fraction = (ctx.settings or TopEntropySettings()).fraction
    out: list[SampleCredit] = [SampleCredit(uniform_sigma(0))] * len(ctx.group.samples)
    for i, _, trace, seconds in scored_traces(ctx, keep_cache=False):
        out[i] = SampleCredit(
            top_entropy_sigma(trace.entropy.double().cpu().numpy(), fraction), timings={"entropy": seconds}
        )
    return out


def redistribute_group(
    group: RolloutGroup,
    cfg: Config,
    scorer: Scorer | None = None,
    credit: CreditSpec | None = None,
    sampler: ContinuationSampler | None = None,
    reward_fn: RewardFn | None = None,
    tokenizer: Any = None,
) -> WeightedGroup:
    """Advantages + the credit method for one group (``credit``: the method and its settings,
    resolved once by the caller, else from ``cfg``; ``tokenizer``: the run's, else the scorer's).
    Raises ``RecordError`` for token ids outside the scorer's vocabulary before any forward
    (``Scorer.check_ids``)."""
    if scorer is not None:
        scorer.check_ids(group)
    credit = credit or resolve_credit(cfg)
    method = credit.method
    adv = group_advantages([s.reward for s in group.samples], cfg.credit.advantage_std_norm)
    if cfg.generation.overlong == "filter":  # in the baseline, out of the gradient (rredcot/common/overlong.py)
        adv[[s.finish_reason == "length" for s in group.samples]] = 0.0
    if method.needs_scorer and not adv.any():
        # every advantage is 0: no σ changes the loss, so the scorer's work is skipped (σ uniform)
        credits = [SampleCredit(uniform_sigma(len(s.completion_ids)), fallback="skipped") for s in group.samples]
    else:
        tok = tokenizer if tokenizer is not None or scorer is None else scorer.tokenizer
        credits = method(CreditContext(group, adv, cfg, scorer, sampler, reward_fn, credit.settings, tok))
    samples = [
        WeightedSample(
            s,
            float(a),
            c.sigma,
            c.exit_points,
            c.exit_values,
            c.segment_rewards,
            method.name,
            c.timings,
            c.fallback,
            c.exit_stderr,
            c.values_version,
        )
        for s, a, c in zip(group.samples, adv, credits)
    ]
    return WeightedGroup(group.group_id, group.prompt_id, group.prompt_ids, samples, scorer.version if scorer else 0)
