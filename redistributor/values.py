"""Exit-point values, importance-sampled over the reference pairs ("PR-style").

At exit point t the scorer reads, teacher-forced after ``x ⊕ o[:e_t] ⊕ exit``, log p(u_i | s_t)
and log p(y_i | u_i, s_t) for every reference pair (u_i, y_i). With a uniform proposal q = 1/N,
v̂(s_t) = (1/N) Σ_i [p(u_i, y_i | s_t) / q] · U(y_i) = Σ_i p(u_i, y_i | s_t) · U(y_i).

Two ways to get the log-probs, equal up to float rounding:
- ``branch_logprobs_fast``: the trace's KV cache from ``score_trace`` is reused; the branches of
  consecutive exit points, up to ``token_budget`` tokens, go in as one extra sequence whose 4D mask
  lets branch (t, i) see the first P + e_t trace positions and itself only. Each such forward runs
  on a temporary cache holding the trace prefix its last exit point needs (views of the trace KV;
  the trace cache itself is never modified), so a smaller budget wastes less attention on masked
  trace positions at the price of more forwards.
- ``branch_logprobs_reference``: one full forward per (exit point, pair), recomputing the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from rredcot.redistributor.entropy import TokenCounter, TraceScores, head_stats

VALUE_SPACES = ("log", "prob", "mean_token_prob")


@dataclass
class BranchLogprobs:
    """Per exit point t and reference pair i (arrays [T, N])."""

    log_u: np.ndarray  # Σ log p(u_i tokens | s_t ⊕ exit)
    log_y: np.ndarray  # Σ log p(y_i tokens | s_t ⊕ exit ⊕ u_i)
    mean_token_prob: np.ndarray  # mean over the u_i ⊕ y_i tokens of p(token | ...)


@dataclass
class _Branch:
    exit_index: int
    prefix_len: int  # trace positions the branch may attend to (P + e_t)
    ids: list[int]  # exit ⊕ u ⊕ y
    n_exit: int
    n_u: int


def _branches(
    prompt_len: int,
    exit_points: Sequence[int],
    refs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
) -> list[_Branch]:
    if not exit_ids:
        raise ValueError("the exit string must tokenise to at least one token")
    return [
        _Branch(t, prompt_len + int(e), [*exit_ids, *u, *y], len(exit_ids), len(u))
        for t, e in enumerate(exit_points)
        for u, y in refs
    ]


def _collect(branches: list[_Branch], lps: list[torch.Tensor], n_exits: int, n_refs: int) -> BranchLogprobs:
    """Split each branch's scored log-probs (tokens after the exit string) into the u and y parts."""
    log_u = np.zeros((n_exits, n_refs), dtype=np.float64)
    log_y = np.zeros_like(log_u)
    mtp = np.zeros_like(log_u)
    for k, (b, lp) in enumerate(zip(branches, lps)):
        t, i = divmod(k, n_refs)
        lp = lp.double().cpu()
        log_u[t, i] = lp[: b.n_u].sum().item()
        log_y[t, i] = lp[b.n_u :].sum().item()
        mtp[t, i] = lp.exp().mean().item() if lp.numel() else 1.0
    return BranchLogprobs(log_u, log_y, mtp)


def _batches(branches: list[_Branch], budget: int) -> list[list[int]]:
    """Consecutive branch indices grouped so that each group holds ≤ ``budget`` tokens (≥ 1 branch)."""
    groups: list[list[int]] = [[]]
    used = 0
    for k, b in enumerate(branches):
        if groups[-1] and used + len(b.ids) > budget:
            groups.append([])
            used = 0
        groups[-1].append(k)
        used += len(b.ids)
    return [g for g in groups if g]


@torch.no_grad()
def branch_logprobs_fast(
    model: Any,
    trace: TraceScores,
    exit_points: Sequence[int],
    refs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
    token_budget: int,
    chunk: int = 1024,
) -> BranchLogprobs:
    """Branch log-probs on top of the cached trace (``trace.cache`` must hold the whole trace)."""
    if trace.cache is None:
        raise ValueError("branch_logprobs_fast needs the trace KV cache (score_trace(keep_cache=True))")
    branches = _branches(trace.prompt_len, exit_points, refs, exit_ids)
    base, head = model.get_decoder(), model.get_output_embeddings()
    device = head.weight.device
    out: list[torch.Tensor] = [torch.zeros(0)] * len(branches)
    for group in _batches(branches, token_budget):
        ids, pos, item, local, prefix = [], [], [], [], []
        for k in group:
            b = branches[k]
            n = len(b.ids)
            ids += b.ids
            pos += range(b.prefix_len, b.prefix_len + n)
            item += [k] * n
            local += range(n)
            prefix += [b.prefix_len] * n
        ids_t = torch.tensor(ids, device=device)
        item_t, local_t = torch.tensor(item, device=device), torch.tensor(local, device=device)
        limit = max(prefix)
        sees_trace = torch.arange(limit, device=device)[None, :] < torch.tensor(prefix, device=device)[:, None]
        sees_branch = (item_t[:, None] == item_t[None, :]) & (local_t[None, :] <= local_t[:, None])
        mask = torch.cat([sees_trace, sees_branch], dim=1)[None, None]
        hidden = base(
            input_ids=ids_t[None],
            position_ids=torch.tensor(pos, device=device)[None],
            attention_mask=mask,
            past_key_values=_prefix_cache(trace, limit, model.config),
            use_cache=True,
        ).last_hidden_state[0]
        # scored rows: within each branch, positions n_exit-1 .. n-2 predict tokens n_exit .. n-1
        rows, targets, owners = [], [], []
        start = 0
        for k in group:
            b = branches[k]
            rows += range(start + b.n_exit - 1, start + len(b.ids) - 1)
            targets += b.ids[b.n_exit :]
            owners += [k] * (len(b.ids) - b.n_exit)
            start += len(b.ids)
        _, lp = head_stats(head, hidden[rows], torch.tensor(targets, device=device), chunk, entropy=False)
        owners_t = torch.tensor(owners)
        for k in group:
            out[k] = lp[owners_t == k]
        trace.counter.branch += len(ids)
    return _collect(branches, out, len(exit_points), len(refs))


def _prefix_cache(trace: TraceScores, n: int, config: Any) -> DynamicCache:
    """A cache holding the first ``n`` positions of the trace's row (the branch forward appends to it)."""
    b = trace.row
    layers = trace.cache.layers  # type: ignore[union-attr]
    return DynamicCache([(la.keys[b : b + 1, :, :n], la.values[b : b + 1, :, :n]) for la in layers], config=config)


@torch.no_grad()
def branch_logprobs_reference(
    model: Any,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    exit_points: Sequence[int],
    refs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
    counter: TokenCounter | None = None,
) -> BranchLogprobs:
    """Plain per-exit-point, per-pair recomputation of the whole prefix (the tests' reference)."""
    branches = _branches(len(prompt_ids), exit_points, refs, exit_ids)
    device = model.get_output_embeddings().weight.device
    out = []
    for b in branches:
        e = b.prefix_len - len(prompt_ids)
        ids = torch.tensor([*prompt_ids, *completion_ids[:e], *b.ids], device=device)
        n_scored = len(b.ids) - b.n_exit
        logits = model(input_ids=ids[None], logits_to_keep=n_scored + 1).logits[0, :-1].float()
        targets = ids[ids.numel() - n_scored :]
        out.append(torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1))
        if counter is not None:
            counter.trace += b.prefix_len
            counter.branch += len(b.ids)
    return _collect(branches, out, len(exit_points), len(refs))


def importance_weights(log_u: np.ndarray, log_y: np.ndarray) -> np.ndarray:
    """w_i = p(u_i, y_i | s_t) / q with the uniform proposal q = 1/N (last axis = pairs)."""
    n = log_u.shape[-1]
    return np.exp(log_u + log_y + np.log(n))


def exit_values(bl: BranchLogprobs, utilities: Sequence[float], space: str) -> np.ndarray:
    """v̂ per exit point in ``space``: ``log`` (log v̂, via logsumexp), ``prob`` (v̂) or
    ``mean_token_prob`` ((1/N) Σ_i U_i · mean token probability of u_i ⊕ y_i).

    With no pair of positive utility, ``log`` gives −inf and the others 0.
    """
    if space not in VALUE_SPACES:
        raise ValueError(f"value space {space!r} not in {VALUE_SPACES}")
    u = np.asarray(utilities, dtype=np.float64)
    if u.size == 0:
        return np.full(bl.log_u.shape[0], -np.inf if space == "log" else 0.0)
    if space == "mean_token_prob":
        return (bl.mean_token_prob * u).mean(axis=-1)
    with np.errstate(divide="ignore"):
        terms = bl.log_u + bl.log_y + np.log(u)
        top = np.max(terms, axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        log_v = np.log(np.exp(terms - top).sum(axis=-1)) + top[..., 0]
    return log_v if space == "log" else np.exp(log_v)
