"""Exit-point values, importance-sampled over the reference pairs.

At exit point t the scorer teacher-forces each branch tail after ``x ⊕ o[:e_t]`` (what a tail holds
is the value construct: ``references.py``) and reads the summed log-probs of its reference-step
tokens (log p(u)) and of its answer tokens (log p(y)). With a uniform proposal over the pairs,
v̂(s_t) = Σ_i s_i · p(u_i, y_i | s_t) · U(y_i), s_i the tail's share of its pair (1/S for each of a
reference's S suffixes, else 1).

Two ways to get the log-probs, equal up to float rounding:
- ``branch_logprobs_fast``: the trace's KV cache from ``score_trace`` is reused; the branches of
  consecutive exit points go in as one extra sequence whose mask lets branch (t, i) see the first
  P + e_t trace positions and itself only (``branch_attention``: dense, or block-sparse flex on
  CUDA). Each forward runs on views of the trace KV (never copied or modified) and holds as many
  branches as fit a memory budget in bytes and cost less together than apart (``branch_plan``),
  so its peak is bounded whatever the trace length; a branch too long for the budget alone is
  forwarded in chunks on its own cache.
- ``branch_logprobs_reference``: one full forward per (exit point, tail), recomputing the prefix.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rredcot.redistributor.branch_attention import BranchRows, dense_mask, flex_attention_on, flex_mask, resolve
from rredcot.redistributor.branch_plan import Branch, ModelShape, Piece, plan_pieces
from rredcot.redistributor.entropy import TokenCounter, TraceScores, halve_on_oom, head_stats, is_oom, score_trace
from rredcot.redistributor.references import CONTEXT, Tail, U, Y

VALUE_SPACES = ("log", "prob", "mean_token_prob")


@dataclass
class BranchLogprobs:
    """Per exit point t and tail i (arrays [T, N])."""

    log_u: np.ndarray  # Σ log p(reference-step tokens of tail i | s_t, the tail before them)
    log_y: np.ndarray  # Σ log p(answer tokens of tail i | ...)
    mean_token_prob: np.ndarray  # mean over the tail's scored tokens of p(token | ...); 1 with none


def exit_branches(
    context_ids: Sequence[int], prompt_len: int, exit_points: Sequence[int], tails: Sequence[Sequence[Tail]]
) -> list[Branch]:
    """The branch of every (exit point, tail), exit-major; ``tails[t]``: exit t's tails (as many for
    every exit). ``context_ids``: prompt ⊕ completion. A tail whose first token is scored is preceded
    by its anchor, the prefix's last token forwarded again (same position, same keys and values as
    in the trace), whose output predicts it; otherwise the tail's first token (context) does that."""
    out = []
    for t, e in enumerate(exit_points):
        end = prompt_len + int(e)
        for tail in tails[t]:
            if tail.labels and tail.labels[0] != CONTEXT:
                out.append(Branch(t, end - 1, [int(context_ids[end - 1]), *tail.ids], [CONTEXT, *tail.labels]))
            else:
                out.append(Branch(t, end, list(tail.ids), list(tail.labels)))
    return out


def _scored_labels(b: Branch) -> np.ndarray:
    """The labels of a branch's scored tokens (ids[1:] not labelled CONTEXT), in order."""
    labels = np.asarray(b.labels[1:], dtype=np.int64)
    return labels[labels != CONTEXT]


def _collect(labels: list[np.ndarray], lps: list[torch.Tensor], n_exits: int, n_tails: int) -> BranchLogprobs:
    """Sum each branch's scored log-probs (exit-major; ``labels``: theirs) into step and answer parts."""
    log_u = np.zeros((n_exits, n_tails), dtype=np.float64)
    log_y = np.zeros_like(log_u)
    mtp = np.ones_like(log_u)
    for k, (lp, lab) in enumerate(zip(lps, labels, strict=True)):
        t, i = divmod(k, n_tails)
        lp = lp.double().cpu().numpy()
        log_u[t, i] = lp[lab == U].sum()
        log_y[t, i] = lp[lab == Y].sum()
        if lp.size:
            mtp[t, i] = np.exp(lp).mean()
    return BranchLogprobs(log_u, log_y, mtp)


def _tails_per_exit(tails: Sequence[Sequence[Tail]], n_exits: int) -> int:
    counts = {len(x) for x in tails}
    if len(tails) != n_exits or len(counts) > 1:
        raise ValueError(f"each of the {n_exits} exit points needs as many tails, got {[len(x) for x in tails]}")
    return counts.pop() if counts else 0


class _PrefixLayer(DynamicLayer):
    """A layer cache over a view of the trace's keys/values: the forward's own keys are kept apart
    and joined to the prefix only transiently (the trace KV is never copied or modified)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.prefix_keys, self.prefix_values = keys, values
        self.keys, self.values = keys[..., :0, :], values[..., :0, :]  # the forward's own, none yet
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return torch.cat([self.prefix_keys, self.keys], dim=-2), torch.cat([self.prefix_values, self.values], dim=-2)

    def get_seq_length(self) -> int:
        return self.prefix_keys.shape[-2] + self.keys.shape[-2]


def _prefix_cache(trace: TraceScores, n: int, config: Any) -> DynamicCache:
    """A cache over the first ``n`` positions of the trace's row (views, never copies)."""
    b = trace.row
    cache = DynamicCache(config=config)
    cache.layers = [
        _PrefixLayer(la.keys[b : b + 1, :, :n], la.values[b : b + 1, :, :n])
        for la in trace.cache.layers  # type: ignore[union-attr]
    ]
    return cache


@torch.no_grad()
def branch_logprobs_fast(
    model: Any,
    trace: TraceScores,
    exit_points: Sequence[int],
    tails: Sequence[Sequence[Tail]],
    context_ids: Sequence[int],
    memory_bytes: int,
    chunk: int = 1024,
    attention: str = "auto",
    overhead_cells: int | None = None,
) -> BranchLogprobs:
    """Branch log-probs on top of the cached trace (``trace.cache`` must hold the whole trace);
    ``tails[t]``: exit t's tails, ``context_ids``: prompt ⊕ completion (``exit_branches``).

    Each forward's peak (``ModelShape.forward_bytes``) stays within ``memory_bytes``, whatever the
    trace length; a failed allocation retries the whole computation with half the budget.
    ``attention``: ``credit.scorer.branch_attention``; ``overhead_cells``: the cost of one forward in
    attention cells (None: ``forward_overhead_cells`` measures it once for the model).
    """
    if trace.cache is None:
        raise ValueError("branch_logprobs_fast needs the trace KV cache (score_trace(keep_cache=True))")
    n_tails = _tails_per_exit(tails, len(exit_points))
    branches = exit_branches(context_ids, trace.prompt_len, exit_points, tails)
    flex = resolve(attention, model) == "flex"
    shape = ModelShape.of(model, sparse=flex)
    if overhead_cells is None:  # flex computes no waste: only memory splits its forwards
        overhead_cells = 0 if flex else forward_overhead_cells(model)

    labels = [_scored_labels(b) for b in branches]
    live = [k for k, lab in enumerate(labels) if lab.size]  # a tail that scores nothing is not forwarded

    def run(budget: int) -> BranchLogprobs:
        some = [branches[k] for k in live]
        lps: list[torch.Tensor] = [torch.zeros(0)] * len(branches)
        for k, lp in zip(
            live, _run_pieces(model, trace, some, plan_pieces(some, budget, shape, overhead_cells), chunk, flex)
        ):
            lps[k] = lp
        return _collect(labels, lps, len(exit_points), n_tails)

    floor = shape.forward_bytes(1, trace.cache.get_seq_length())
    return halve_on_oom(run, memory_bytes, floor, trace.counter)[0]


def _rows(piece: Piece, branches: list[Branch], device: torch.device) -> tuple[list[int], list[int], BranchRows]:
    """The piece's token ids, positions and query rows."""
    ids, pos, item, local, prefix = [], [], [], [], []
    for k, a, b in piece.items:
        br = branches[k]
        ids += br.ids[a:b]
        pos += range(br.prefix_len + a, br.prefix_len + b)
        item += [k] * (b - a)
        local += range(a, b)
        prefix += [br.prefix_len] * (b - a)
    tensor = lambda x: torch.tensor(x, device=device)  # noqa: E731
    return ids, pos, BranchRows(tensor(prefix), tensor(item), tensor(local), piece.limit, piece.items[0][1])


def _run_pieces(
    model: Any, trace: TraceScores, branches: list[Branch], pieces: list[Piece], chunk: int, flex: bool = False
) -> list[torch.Tensor]:
    base, head = model.get_decoder(), model.get_output_embeddings()
    device, dtype = head.weight.device, head.weight.dtype
    parts: list[list[torch.Tensor]] = [[] for _ in branches]
    cache = None
    for piece in pieces:
        if not piece.items[0][1]:  # a new piece (not a continued branch): a cache over its prefix
            cache = _prefix_cache(trace, piece.limit, model.config)
        ids, pos, rows = _rows(piece, branches, device)
        if flex:
            with flex_attention_on(model):
                hidden = _forward(base, ids, pos, flex_mask(rows), cache)
        else:
            hidden = _forward(base, ids, pos, dense_mask(rows, model, dtype), cache)
        # scored rows: branch position l predicts token l + 1, read where that token is not context
        scored, targets, owners = [], [], []
        start = 0
        for k, a, b in piece.items:
            br = branches[k]
            rows = [r for r in range(a, min(b, len(br.ids) - 1)) if br.labels[r + 1] != CONTEXT]
            scored += [start + r - a for r in rows]
            targets += [br.ids[r + 1] for r in rows]
            owners += [k] * len(rows)
            start += b - a
        _, lp = head_stats(head, hidden[scored], torch.tensor(targets, device=device), chunk, entropy=False)
        owners_t = torch.tensor(owners)
        for k, _, _ in piece.items:
            parts[k].append(lp[owners_t == k])
        trace.counter.branch += len(ids)
    return [torch.cat(p) if p else torch.zeros(0) for p in parts]


def _forward(base: Any, ids: list[int], pos: list[int], mask: Any, cache: DynamicCache | None) -> torch.Tensor:
    device = base.get_input_embeddings().weight.device
    return base(
        input_ids=torch.tensor(ids, device=device)[None],
        position_ids=torch.tensor(pos, device=device)[None],
        attention_mask=mask,
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state[0]


_OVERHEAD: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
DEFAULT_OVERHEAD_CELLS = 1 << 16  # used while a measurement fails for want of memory (not cached)


@torch.no_grad()
def forward_overhead_cells(model: Any, repeat: int = 3) -> int:
    """The fixed cost of one dense branch forward, in attention cells (F/C), measured once per
    model on this machine: F is the time of a 1-token forward, C the time one more attended cell
    adds (a 1/8-length branch over a near vs a far prefix of a random trace of ≤ 512 tokens). It
    decides when branches share a forward (``branch_plan``); it differs between CPUs and GPUs, so
    it is measured, never assumed. A measurement that runs out of memory gives
    ``DEFAULT_OVERHEAD_CELLS`` and is tried again next time."""
    if model in _OVERHEAD:
        return _OVERHEAD[model]
    n = max(16, min(512, getattr(model.config, "max_position_embeddings", 512) // 2))
    q = n // 8
    ids = torch.randint(0, model.config.vocab_size, (n + q,), generator=torch.Generator().manual_seed(0)).tolist()
    sync = torch.cuda.synchronize if _on_cuda(model) else lambda: None

    def seconds(trace: TraceScores, prefix: int, length: int) -> float:
        branch = Branch(0, prefix, ids[n : n + length], [CONTEXT] + [U] * (length - 1))
        best = float("inf")
        for _ in range(repeat):
            sync()
            t = time.perf_counter()
            _run_pieces(model, trace, [branch], [Piece([(0, 0, length)], prefix)], chunk=q)
            sync()
            best = min(best, time.perf_counter() - t)
        return best

    try:
        trace = score_trace(model, ids[:1], ids[1:n], chunk=n, stats=False, forward_chunk=n)
        fixed = seconds(trace, 1, 2)
        per_cell = max(seconds(trace, n, q) - seconds(trace, 1, q), 1e-12) / (q * (n - 1))
    except RuntimeError as e:
        if not is_oom(e):
            raise
        return DEFAULT_OVERHEAD_CELLS
    _OVERHEAD[model] = int(min(max(fixed / per_cell, 1024), 1 << 26))
    return _OVERHEAD[model]


def _on_cuda(model: Any) -> bool:
    return model.get_output_embeddings().weight.device.type == "cuda"


@torch.no_grad()
def branch_logprobs_reference(
    model: Any,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    exit_points: Sequence[int],
    tails: Sequence[Sequence[Tail]],
    counter: TokenCounter | None = None,
) -> BranchLogprobs:
    """Plain per-exit-point, per-tail recomputation of ``x ⊕ o[:e_t] ⊕ tail`` (the tests' reference)."""
    n_tails = _tails_per_exit(tails, len(exit_points))
    device = model.get_output_embeddings().weight.device
    labels, out = [], []
    for t, e in enumerate(exit_points):
        for tail in tails[t]:
            ids = torch.tensor([*prompt_ids, *completion_ids[:e], *tail.ids], device=device)
            n, scored = len(tail.ids), np.asarray(tail.labels, dtype=np.int64) != CONTEXT
            logits = model(input_ids=ids[None], logits_to_keep=n + 1).logits[0, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[ids.numel() - n :, None]).squeeze(-1)
            out.append(lp[torch.from_numpy(scored).to(device)])
            labels.append(np.asarray(tail.labels, dtype=np.int64)[scored])
            if counter is not None:
                counter.trace += len(prompt_ids) + e
                counter.branch += n
    return _collect(labels, out, len(exit_points), n_tails)


def importance_weights(log_u: np.ndarray, log_y: np.ndarray) -> np.ndarray:
    """w_i = p(u_i, y_i | s_t) / q with the uniform proposal q = 1/N (last axis = pairs)."""
    n = log_u.shape[-1]
    return np.exp(log_u + log_y + np.log(n))


def exit_values(
    bl: BranchLogprobs, utilities: Sequence[float], space: str, shares: Sequence[float] | None = None
) -> np.ndarray:
    """v̂ per exit point in ``space``: ``log`` (log Σ_i s_i U_i p_i, via logsumexp), ``prob``
    (Σ_i s_i U_i p_i) or ``mean_token_prob`` (Σ_i s_i U_i · mean token probability of tail i, over
    Σ_i s_i). One utility U_i per tail; ``shares`` s_i: the tail's share of its pair (1/S for each of
    a reference's S suffixes; default 1 each).

    With no tail of positive utility, ``log`` gives −inf and the others 0.
    """
    if space not in VALUE_SPACES:
        raise ValueError(f"value space {space!r} not in {VALUE_SPACES}")
    u = np.asarray(utilities, dtype=np.float64)
    s = np.ones_like(u) if shares is None else np.asarray(shares, dtype=np.float64)
    if u.size == 0:
        return np.full(bl.log_u.shape[0], -np.inf if space == "log" else 0.0)
    if space == "mean_token_prob":
        return (bl.mean_token_prob * u * s).sum(axis=-1) / s.sum()
    with np.errstate(divide="ignore"):
        terms = bl.log_u + bl.log_y + np.log(u * s)
        top = np.max(terms, axis=-1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        log_v = np.log(np.exp(terms - top).sum(axis=-1)) + top[..., 0]
    return log_v if space == "log" else np.exp(log_v)
