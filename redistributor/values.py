"""Exit-point values, importance-sampled over the reference pairs ("PR-style").

At exit point t the scorer reads, teacher-forced after ``x ⊕ o[:e_t] ⊕ exit``, log p(u_i | s_t)
and log p(y_i | u_i, s_t) for every reference pair (u_i, y_i). With a uniform proposal q = 1/N,
v̂(s_t) = (1/N) Σ_i [p(u_i, y_i | s_t) / q] · U(y_i) = Σ_i p(u_i, y_i | s_t) · U(y_i).

Two ways to get the log-probs, equal up to float rounding:
- ``branch_logprobs_fast``: the trace's KV cache from ``score_trace`` is reused; the branches of
  consecutive exit points go in as one extra sequence whose 4D mask lets branch (t, i) see the
  first P + e_t trace positions and itself only. Each forward runs on views of the trace KV (never
  copied or modified) and holds as many branches as fit a memory budget in bytes (mask and score
  cells, one layer's keys, activations), so its peak is bounded whatever the trace length; a branch
  too long for the budget alone is forwarded in chunks on its own cache.
- ``branch_logprobs_reference``: one full forward per (exit point, pair), recomputing the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rredcot.redistributor.entropy import TokenCounter, TraceScores, head_stats

VALUE_SPACES = ("log", "prob", "mean_token_prob")


@dataclass
class BranchLogprobs:
    """Per exit point t and reference pair i (arrays [T, N])."""

    log_u: np.ndarray  # Σ log p(u_i tokens | s_t ⊕ exit)
    log_y: np.ndarray  # Σ log p(y_i tokens | s_t ⊕ exit ⊕ u_i)
    mean_token_prob: np.ndarray  # mean over the u_i ⊕ y_i tokens of p(token | ...)


@dataclass
class Branch:
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
) -> list[Branch]:
    if not exit_ids:
        raise ValueError("the exit string must tokenise to at least one token")
    return [
        Branch(t, prompt_len + int(e), [*exit_ids, *u, *y], len(exit_ids), len(u))
        for t, e in enumerate(exit_points)
        for u, y in refs
    ]


def _collect(branches: list[Branch], lps: list[torch.Tensor], n_exits: int, n_refs: int) -> BranchLogprobs:
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


@dataclass(frozen=True)
class ModelShape:
    """What the peak memory of a branch forward depends on (from the model config)."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    dtype_bytes: int
    mask_bytes: int  # a boolean mask (sdpa) or an additive float one (eager)

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        c = model.config
        dtype_bytes = next(model.parameters()).element_size()
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        eager = _attention(model) == "eager"
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return cls(
            c.num_attention_heads,
            kv_heads,
            head_dim,
            c.hidden_size,
            c.intermediate_size,
            dtype_bytes,
            4 if eager else 1,
        )

    def forward_bytes(self, q: int, kv: int) -> int:
        """Peak bytes of one forward of ``q`` query tokens over ``kv`` key positions: the mask and
        the attention scores (q·kv cells), one layer's keys and values (the cached prefix is joined
        to the new ones per layer, then dropped), and the MLP activations."""
        cells = q * kv * (self.mask_bytes + 4 * self.heads)
        layer_kv = 2 * kv * self.kv_heads * self.head_dim * self.dtype_bytes
        return cells + layer_kv + q * (4 * self.hidden + 3 * self.intermediate) * self.dtype_bytes


def _attention(model: Any) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


@dataclass
class _Piece:
    """One branch forward: tokens [a, b) of each listed branch (k, a, b). A branch too long for the
    budget alone is split into pieces of one item each; a piece with a > 0 continues the previous
    one on its cache."""

    items: list[tuple[int, int, int]]
    limit: int  # trace positions attended: the largest prefix among its branches


def plan_pieces(branches: list[Branch], budget: int, shape: ModelShape) -> list[_Piece]:
    """Consecutive branches per forward while ``shape.forward_bytes`` stays within ``budget``."""
    pieces: list[_Piece] = []
    for k, b in enumerate(branches):
        n, last = len(b.ids), pieces[-1] if pieces else None
        if last is not None and last.items[-1][1] == 0:  # a piece of whole branches: can it take this one?
            q = sum(hi - lo for _, lo, hi in last.items) + n
            limit = max(last.limit, b.prefix_len)
            if shape.forward_bytes(q, limit + q) <= budget:
                last.items.append((k, 0, n))
                last.limit = limit
                continue
        if shape.forward_bytes(n, b.prefix_len + n) <= budget:
            pieces.append(_Piece([(k, 0, n)], b.prefix_len))
            continue
        kv = b.prefix_len + n  # split: the largest chunk whose forward fits (at least one token)
        per_token = shape.forward_bytes(1, kv) - shape.forward_bytes(0, kv)
        c = max(1, (budget - shape.forward_bytes(0, kv)) // per_token)
        pieces += [_Piece([(k, a, min(a + c, n))], b.prefix_len) for a in range(0, n, c)]
    return pieces


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


def _mask(allowed: torch.Tensor, model: Any, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask in the form the attention implementation reads: sdpa takes a boolean mask;
    eager *adds* the mask to the scores, so it needs 0 / −inf (a boolean one is off by nats)."""
    impl = _attention(model)
    if impl == "sdpa":
        return allowed[None, None]
    if impl == "eager":
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
    raise ValueError(f"exit values need sdpa or eager attention (the 4D branch mask); the scorer uses {impl!r}")


def _is_oom(e: Exception) -> bool:
    text = str(e)
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


@torch.no_grad()
def branch_logprobs_fast(
    model: Any,
    trace: TraceScores,
    exit_points: Sequence[int],
    refs: Sequence[tuple[Sequence[int], Sequence[int]]],
    exit_ids: Sequence[int],
    memory_bytes: int,
    chunk: int = 1024,
) -> BranchLogprobs:
    """Branch log-probs on top of the cached trace (``trace.cache`` must hold the whole trace).

    Each forward's peak (``ModelShape.forward_bytes``) stays within ``memory_bytes``, whatever the
    trace length; a failed allocation retries the whole computation with half the budget.
    """
    if trace.cache is None:
        raise ValueError("branch_logprobs_fast needs the trace KV cache (score_trace(keep_cache=True))")
    branches = _branches(trace.prompt_len, exit_points, refs, exit_ids)
    shape, budget = ModelShape.of(model), memory_bytes
    while True:
        try:
            out = _run_pieces(model, trace, branches, plan_pieces(branches, budget, shape), chunk)
            return _collect(branches, out, len(exit_points), len(refs))
        except RuntimeError as e:
            if not _is_oom(e) or budget <= shape.forward_bytes(1, trace.cache.get_seq_length()):
                raise
            budget //= 2
            trace.counter.oom_retries += 1


def _run_pieces(
    model: Any, trace: TraceScores, branches: list[Branch], pieces: list[_Piece], chunk: int
) -> list[torch.Tensor]:
    base, head = model.get_decoder(), model.get_output_embeddings()
    device, dtype = head.weight.device, head.weight.dtype
    parts: list[list[torch.Tensor]] = [[] for _ in branches]
    cache = None
    for piece in pieces:
        earlier = piece.items[0][1]  # tokens of a continued branch already in the cache
        if not earlier:
            cache = _prefix_cache(trace, piece.limit, model.config)
        ids, pos, item, local, prefix = [], [], [], [], []
        for k, a, b in piece.items:
            br = branches[k]
            ids += br.ids[a:b]
            pos += range(br.prefix_len + a, br.prefix_len + b)
            item += [k] * (b - a)
            local += range(a, b)
            prefix += [br.prefix_len] * (b - a)
        item_t, local_t = torch.tensor(item, device=device), torch.tensor(local, device=device)
        sees_trace = torch.arange(piece.limit, device=device)[None, :] < torch.tensor(prefix, device=device)[:, None]
        sees_earlier = torch.ones((len(ids), earlier), dtype=torch.bool, device=device)
        sees_piece = (item_t[:, None] == item_t[None, :]) & (local_t[None, :] <= local_t[:, None])
        allowed = torch.cat([sees_trace, sees_earlier, sees_piece], dim=1)
        hidden = base(
            input_ids=torch.tensor(ids, device=device)[None],
            position_ids=torch.tensor(pos, device=device)[None],
            attention_mask=_mask(allowed, model, dtype),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state[0]
        # scored rows: branch position l (n_exit-1 <= l <= n-2) predicts token l+1
        rows, targets, owners = [], [], []
        start = 0
        for k, a, b in piece.items:
            br = branches[k]
            lo, hi = max(a, br.n_exit - 1), min(b, len(br.ids) - 1)
            rows += range(start + lo - a, start + hi - a)
            targets += br.ids[lo + 1 : hi + 1]
            owners += [k] * max(hi - lo, 0)
            start += b - a
        _, lp = head_stats(head, hidden[rows], torch.tensor(targets, device=device), chunk, entropy=False)
        owners_t = torch.tensor(owners)
        for k, _, _ in piece.items:
            parts[k].append(lp[owners_t == k])
        trace.counter.branch += len(ids)
    return [torch.cat(p) if p else torch.zeros(0) for p in parts]


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
