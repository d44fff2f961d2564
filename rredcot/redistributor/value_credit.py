"""The value-based credit methods: ``rredcot`` (exit values from the scorer's reference branches,
``values.py``) and ``mc`` (exit values from sampled continuations, ``mc.py``); both turn the change
of value over each segment into σ (``sigma.py``). Their exit points: the thinking span's segments
(``credit.segmentation``); their own settings: ``ctx.settings`` (``methods.RredcotSettings``,
``methods.McSettings``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from rredcot.common.config import Config
from rredcot.common.records import RolloutGroup, RolloutRecord
from rredcot.common.sampling import ContinuationSampler, RewardFn
from rredcot.redistributor.baseline import group_baselines
from rredcot.redistributor.credit import scored_traces, scorer_of, uniform_sigma
from rredcot.redistributor.entropy import TraceScores
from rredcot.redistributor.lines import answer_line_start
from rredcot.redistributor.mc import MCValues, mc_values
from rredcot.redistributor.methods import RredcotSettings
from rredcot.redistributor.references import Construct, Pair, Tail, tails
from rredcot.redistributor.registry import CreditContext, SampleCredit
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.segmentation import keyword_boundaries, segment, thinking_span, token_texts
from rredcot.redistributor.sigma import prob_rewards, segment_masses, segment_rewards, token_sigma, uniform_reason
from rredcot.redistributor.values import branch_logprobs_fast, exit_values


def working_texts(ctx: CreditContext, s: RolloutRecord) -> list[str]:
    """The token texts of a completion's working: up to its end tokens (EOS), and without thinking
    tags up to where its answer line starts (``answer_line_start``): the answer part is the answer,
    never a segment of working after which the answer would be asked again."""
    scorer = scorer_of(ctx)
    ids = s.completion_ids.tolist()
    texts = token_texts(scorer.tokenizer, ids[: scorer.content_end(ids)])
    if not thinking_span(texts, scorer.think_start, scorer.think_end)[2]:
        texts = texts[: answer_line_start(texts, scorer.answer_template)]
    return texts


def can_split(ctx: CreditContext, s: RolloutRecord) -> bool:
    """Whether segmentation could cut the working into two segments or more: its span holds a
    keyword boundary (with ``split_keywords`` off, every token is one). Needs no scorer pass."""
    scorer, seg = scorer_of(ctx), ctx.cfg.credit.segmentation
    texts = working_texts(ctx, s)
    lo, hi, _ = thinking_span(texts, scorer.think_start, scorer.think_end)
    return hi - lo >= 2 if not seg.split_keywords else bool(keyword_boundaries(texts, lo, hi, seg.keywords))


def exit_points(ctx: CreditContext, s: RolloutRecord, trace: TraceScores) -> np.ndarray:
    """The exit points of the segments of the working (``working_texts``): no exit point lies past
    the end tokens, where the policy never continues. With the method's ``answer_part=terminal``,
    less a last one that only end tokens follow (``scored_exits``)."""
    scorer = scorer_of(ctx)
    texts = working_texts(ctx, s)
    entropy = trace.entropy[: len(texts)].double().cpu().numpy()
    exits = segment(texts, entropy, ctx.cfg.credit.segmentation, scorer.think_start, scorer.think_end).exit_points
    n, body = len(s.completion_ids), scorer.content_end(s.completion_ids.tolist())
    return scored_exits(exits, n, body) if ctx.settings.answer_part == "terminal" else exits


def scored_exits(exits: np.ndarray, n_tokens: int, content_end: int) -> np.ndarray:
    """``answer_part=terminal``: the exit points scored before the end L takes the outcome R
    (``_terminal``). An answer part [e_K, L) of end tokens only (no thinking tags, or an unclosed
    thought, and a final EOS) is no segment of its own, or the EOS would take R − v̂(s_K), nearly all of
    σ: e_K is left out and the last segment runs to L. ``content_end``: L less the trailing end tokens."""
    if len(exits) > 1 and content_end <= exits[-1] < n_tokens:
        return exits[:-1]
    return exits


def _log(x: float) -> float:
    with np.errstate(divide="ignore"):
        return float(np.log(x))


def _terminal(exits: np.ndarray, values: np.ndarray, n_tokens: int, reward: float) -> tuple[np.ndarray, np.ndarray]:
    """``answer_part=terminal``: the answer part [e_K, L) is one more segment whose end value is the
    outcome R itself (never a scored state after the end), so its reward is R − v̂(s_K)."""
    if not values.size or exits[-1] >= n_tokens:
        return exits, values
    return np.append(exits, n_tokens).astype(np.int32), np.append(values, reward)


def answer_start(texts: Sequence[str], think_start: str, think_end: str, opened: bool = False) -> int | None:
    """Where a completion's answer part starts (after the closing thinking tag and whitespace; 0
    without tags); None when there is none: the thinking was opened (in the completion, or in the
    prompt: ``opened``) and never closed, or nothing but whitespace follows it."""
    joined = "".join(texts)
    if (opened or think_start in joined) and think_end not in joined:
        return None
    _, hi, has_think = thinking_span(texts, think_start, think_end)
    start = hi + 1 if has_think and hi < len(texts) else 0
    while start < len(texts) and not texts[start].strip():
        start += 1
    return start if start < len(texts) else None


def reference_pairs(group: RolloutGroup, scorer: Scorer, c: RredcotSettings) -> list[list[Pair]]:
    """Each sample's reference pairs: the dataset's (u_i, y_i); with ``group_refs`` also the
    answer parts of the group's *other* correct samples as (u, empty y), less their trailing end
    tokens — never a sample's own, and only from samples that stopped normally with their thinking
    closed (also when the prompt opened it, DeepSeek-R1-Distill style: a trace's answer read from
    inside its thinking is no reference) and an answer part of more than whitespace and end tokens;
    at most ``max_refs`` each. What a branch scores of a pair is ``reference``'s (``references.py``)."""
    dataset: list[Pair] = [(u.tolist(), y.tolist()) for u, y in zip(group.ref_solution_ids, group.ref_answer_ids)]
    answers: list[list[int] | None] = [None] * len(group.samples)
    if c.group_refs:
        opened = scorer.opens_thought(group.prompt_ids.tolist())
        for i, s in enumerate(group.samples):
            if s.verdict == "correct" and s.finish_reason == "stop":
                ids = s.completion_ids.tolist()
                end = scorer.content_end(ids)
                texts = token_texts(scorer.tokenizer, ids[:end])
                start = answer_start(texts, scorer.think_start, scorer.think_end, opened)
                answers[i] = None if start is None else ids[start:end]
    return [
        (dataset + [(a, []) for j, a in enumerate(answers) if a is not None and j != i])[: c.max_refs]
        for i in range(len(group.samples))
    ]


Rearrange = Callable[[RolloutRecord, np.ndarray], np.ndarray]  # a sample and its segment masses -> σ's masses


def _sigma(
    exits: np.ndarray,
    values: np.ndarray,
    n: int,
    advantage: float,
    ctx: CreditContext,
    log_values: np.ndarray | None = None,
    baseline: np.ndarray | None = None,
    rearrange: Callable[[np.ndarray], np.ndarray] | None = None,
) -> SampleCredit:
    """σ from the exit values; ``log_values`` (prob space) gives relu/abs masses that never underflow;
    ``baseline`` (one per exit) is subtracted from the values before their changes are taken;
    ``rearrange`` moves the segment masses before σ spreads them (``shuffled``)."""
    c = ctx.settings
    based = values if baseline is None else values - baseline
    rewards = segment_rewards(based) if values.size else np.zeros(max(len(exits) - 1, 0))
    scaled = prob_rewards(log_values) if log_values is not None and c.sign != "softmax" else rewards
    masses = segment_masses(scaled, advantage, c.sign, c.softmax_temperature)
    return SampleCredit(
        token_sigma(n, exits, masses if rearrange is None else rearrange(masses), c.uniform_mix),
        exits.astype(np.int32),
        values.astype(np.float32),
        rewards.astype(np.float32),
        fallback=uniform_reason(len(exits) - 1, based, scaled, masses),
    )


def exit_tails(
    scorer: Scorer,
    settings: RredcotSettings,
    pairs: Sequence[Construct],
    context: Sequence[int],
    exits: Sequence[int],
    prompt_len: int,
) -> list[list[Tail]]:
    """Each exit's tails (``references.tails`` of the construct ``settings.reference``); ``exits``:
    offsets in the completion, which follows ``prompt_len`` prompt tokens in ``context``, so an
    exit's last token is ``context[prompt_len + e - 1]``; its relative position is e over the
    completion's length without its end tokens (for ``settings.suffix_window``)."""
    length = max(scorer.content_end(context[prompt_len:]), 1)
    window = settings.suffix_window
    built: dict[tuple[bool, float], list[Tail]] = {}  # without a window, two tail lists serve every exit
    out = []
    for e in exits:
        key = (scorer.ends_line(int(context[prompt_len + e - 1])), min(e / length, 1.0) if window else 0.0)
        if key not in built:
            built[key] = tails(pairs, settings.reference, scorer.tail_text, *key, window)
        out.append(built[key])
    return out


Found = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # exits, values, log values (prob space)


def sample_values(
    ctx: CreditContext, s: RolloutRecord, trace: TraceScores, exits: np.ndarray, pairs: Sequence[Pair]
) -> Found:
    """(exits, v̂ at them in the ``value_space``, log v̂ when that space is ``prob``); with
    ``answer_part=terminal`` the end L is one more exit, valued R (``_terminal``). No pair: no values."""
    scorer, c, sc = scorer_of(ctx), ctx.settings, ctx.cfg.credit.scorer
    constructs = scorer.constructs(pairs, ctx.cfg.credit.segmentation.keywords, c.max_suffixes)
    if not constructs:
        return exits, np.zeros(0), None
    context = [*ctx.group.prompt_ids.tolist(), *s.completion_ids.tolist()]
    per_exit = exit_tails(scorer, c, constructs, context, exits.tolist(), trace.prompt_len)
    bl = branch_logprobs_fast(
        scorer.model,
        trace,
        exits.tolist(),
        per_exit,
        context,
        sc.values_memory_mb << 20,
        sc.entropy_chunk,
        sc.branch_attention,
    )
    scorer.tokens.branch += trace.counter.branch
    prob = c.value_space == "prob"  # computed in log space: σ survives values below e^-745
    shares = [t.share for t in per_exit[0]]
    values = exit_values(bl, [1.0] * len(shares), "log" if prob else c.value_space, shares)
    if c.answer_part == "terminal":
        exits, values = _terminal(exits, values, len(s.completion_ids), _log(s.reward) if prob else s.reward)
    return (exits, np.exp(values), values) if prob else (exits, values, None)


def rredcot(ctx: CreditContext, rearrange: Rearrange | None = None) -> list[SampleCredit]:
    """Entropy → segments → importance-sampled exit values → (group baseline) → segment rewards → σ;
    ``rearrange``: see ``credit_from_values``."""
    samples = ctx.group.samples
    refs = reference_pairs(ctx.group, scorer_of(ctx), ctx.settings)
    if ctx.settings.answer_part == "uniform" and not any(can_split(ctx, s) for s in samples):
        refs = [[] for _ in samples]  # one segment each: σ is uniform whatever the values, no branch scored
    found: list[Found] = [(np.zeros(1, np.int32), np.zeros(0), None)] * len(samples)
    timings: list[dict[str, float]] = [{} for _ in samples]
    for i, s, trace, t_entropy in scored_traces(ctx, keep_cache=any(refs)):
        t1 = time.perf_counter()
        exits = exit_points(ctx, s, trace)
        t2 = time.perf_counter()
        found[i] = sample_values(ctx, s, trace, exits, refs[i])
        timings[i] = {"entropy": t_entropy, "segment": t2 - t1, "values": time.perf_counter() - t2}
    out = credit_from_values(ctx, found, rearrange)
    for i, credit in enumerate(out):
        credit.timings = timings[i] | credit.timings
    return out


def credit_from_values(
    ctx: CreditContext, found: Sequence[Found], rearrange: Rearrange | None = None
) -> list[SampleCredit]:
    """RREDCoT's last stage for every sample of the group: its exit values (less the group baseline
    with ``baseline=group``), segment rewards, masses and σ; ``rearrange`` (sample, masses) gives the
    masses σ spreads instead (the recorded rewards stay the sample's own)."""
    grouped = ctx.settings.baseline == "group"
    baselines = group_baselines([v for _, v, _ in found]) if grouped else [None] * len(found)
    out = []
    for i, ((exits, values, log_values), baseline) in enumerate(zip(found, baselines, strict=True)):
        t = time.perf_counter()
        # a baseline is taken in the value space itself: prob values then lose their log-space masses
        s, adv = ctx.group.samples[i], float(ctx.advantages[i])
        own = None if rearrange is None else partial(rearrange, s)
        out.append(
            _sigma(exits, values, len(s.completion_ids), adv, ctx, None if grouped else log_values, baseline, own)
        )
        out[i].timings = {"sigma": time.perf_counter() - t}
    return out


def mc_exit_values(
    ctx: CreditContext, s: RolloutRecord, exits: np.ndarray, m: int, sample_id: str
) -> tuple[np.ndarray, MCValues]:
    """``outcome_mc_values`` of ``s`` from ``ctx.sampler`` at ``exits`` (M = ``m``, seeded by ``sample_id``;
    the method's ``answer_part``)."""
    if ctx.sampler is None or ctx.reward_fn is None:
        raise ValueError(f"credit method {ctx.cfg.credit.method!r} needs a continuation sampler and a reward function")
    prompt = ctx.group.prompt_ids.tolist()
    opened = scorer_of(ctx).opens_thought(prompt)
    terminal = ctx.settings.answer_part == "terminal"
    return outcome_mc_values(
        ctx.sampler, ctx.reward_fn, prompt, s, exits, m, ctx.cfg, ctx.group.answer, sample_id, opened, terminal
    )


def outcome_mc_values(
    sampler: ContinuationSampler,
    reward_fn: RewardFn,
    prompt_ids: list[int],
    s: RolloutRecord,
    exits: np.ndarray,
    m: int,
    cfg: Config,
    answer: str,
    sample_id: str,
    opened: bool,
    terminal: bool,
) -> tuple[np.ndarray, MCValues]:
    """(exits, their MC estimate): ``mc_values`` of completion ``s`` at ``exits``; with ``terminal``
    (``answer_part=terminal``) the end L is one more exit (or the last one already), valued R exactly
    (``MCValues.with_outcome``): a finished completion is never continued."""
    n = len(s.completion_ids)
    scored = exits[:-1] if terminal and len(exits) and exits[-1] == n else exits
    est = mc_values(
        sampler,
        reward_fn,
        prompt_ids,
        s.completion_ids.tolist(),
        scored.tolist(),
        m,
        cfg.generation.max_tokens,
        answer,
        sample_id=sample_id,
        max_len=cfg.model.max_model_len,
        opened=opened,
    )
    if terminal:
        return np.append(scored, n).astype(np.int32), est.with_outcome(s.reward)
    return exits, est


def mc(ctx: CreditContext) -> list[SampleCredit]:
    """Like ``rredcot`` but v̂(s_t) is the mean reward of M continuations sampled from ``ctx.sampler``
    within the budget left at each exit (prob space), with its standard error."""
    out: list[SampleCredit] = [SampleCredit(uniform_sigma(0))] * len(ctx.group.samples)
    for i, s, trace, t_entropy in scored_traces(ctx, keep_cache=False):
        t1 = time.perf_counter()
        exits = exit_points(ctx, s, trace)
        t2 = time.perf_counter()
        exits, est = mc_exit_values(ctx, s, exits, ctx.settings.samples, s.id)
        out[i] = _sigma(exits, est.values, len(s.completion_ids), float(ctx.advantages[i]), ctx)
        out[i].timings = {"entropy": t_entropy, "segment": t2 - t1, "values": time.perf_counter() - t2}
        out[i].exit_stderr, out[i].values_version = est.stderr.astype(np.float32), ctx.sampler.version
    return out
