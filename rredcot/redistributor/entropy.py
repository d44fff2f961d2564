"""One forward pass of the scorer over a trace: per-token entropy and log-prob, chunked.

The base model runs over the trace in position chunks with a KV cache; the LM head is applied
chunk by chunk to the hidden states, so [L, V] logits never exist for a long L. The KV cache of
the whole trace is kept: the exit-point branches (``values.py``) attend to it instead of
recomputing any prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from transformers import DynamicCache


@dataclass
class TokenCounter:
    """Tokens fed through the scorer (trace and branch tokens), for the ≤ 1.05× ideal check."""

    trace: int = 0
    branch: int = 0
    oom_retries: int = 0  # computations redone with half the budget after running out of memory

    @property
    def total(self) -> int:
        return self.trace + self.branch


@dataclass
class TraceScores:
    """Scorer outputs for ``prompt ⊕ completion``; entropy/logprob are per completion token."""

    prompt_len: int
    entropy: torch.Tensor  # float32 [L]
    logprob: torch.Tensor  # float32 [L], log p(o_j | x, o_<j)
    cache: DynamicCache | None  # KV of the whole trace (None when not kept), batch row ``row``
    counter: TokenCounter = field(default_factory=TokenCounter)  # trace: padded width forwarded
    row: int = 0


T = TypeVar("T")


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is a failed allocation (CUDA or CPU)."""
    text = str(e)
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def halve_on_oom(run: Callable[[int], T], budget: int, floor: int, counter: TokenCounter) -> tuple[T, int]:
    """``run(budget)``, redone with half the budget after each failed allocation while the budget is
    above ``floor`` (``counter.oom_retries`` counts the retries); returns the result and the budget
    that gave it. Every other error, and a failed allocation at ``floor``, propagates."""
    while True:
        try:
            return run(budget), budget
        except RuntimeError as e:
            if not is_oom(e) or budget <= floor:
                raise
        budget //= 2
        counter.oom_retries += 1


def head_stats(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, chunk: int, entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy (zeros when ``entropy`` is False) and log p(target) for each row of ``hidden`` [n, d],
    ``chunk`` rows at a time."""
    ents, lps = [], []
    for i in range(0, hidden.shape[0], chunk):
        logits = head(hidden[i : i + chunk]).float()
        logz = torch.logsumexp(logits, dim=-1)
        if entropy:
            ents.append(logz - (torch.softmax(logits, dim=-1) * logits).sum(-1))
        else:
            ents.append(torch.zeros_like(logz))
        lps.append(logits.gather(-1, targets[i : i + chunk, None]).squeeze(-1) - logz)
    if not ents:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(ents), torch.cat(lps)


@torch.no_grad()
def score_traces(
    model: Any,
    seqs: Sequence[tuple[Sequence[int], Sequence[int]]],
    chunk: int,
    keep_cache: bool = True,
    stats: bool = True,
    forward_chunk: int | None = None,
) -> list[TraceScores]:
    """Forward several ``(prompt, completion)`` traces once, as one right-padded batch (a prompt that
    every trace shares is forwarded once).

    Each forward holds at most ``forward_chunk`` tokens (default ``chunk``) over the batch; the LM
    head takes ``chunk`` rows at a time. Padding sits after each row's tokens, so causal attention
    keeps the rows exact. Token j of a completion is predicted from the hidden state at position
    P + j − 1: every prompt must hold at least one token. ``stats=False`` only fills the KV cache
    (entropy and logprob come back empty). The traces share one cache (``TraceScores.row``).
    """
    if any(not p for p, _ in seqs):
        raise ValueError("the prompt must hold at least one token (it predicts the first completion token)")
    base, head = model.get_decoder(), model.get_output_embeddings()
    device = head.weight.device
    rows = [[*p, *c] for p, c in seqs]
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
    cache = DynamicCache(config=model.config)
    ents: list[list[torch.Tensor]] = [[] for _ in rows]
    lps: list[list[torch.Tensor]] = [[] for _ in rows]
    budget = forward_chunk or chunk
    # A group's traces share their prompt: forward it once (all but its last token, which predicts
    # each row's own first completion token) and copy that KV to every row.
    shared = len(rows) > 1 and all(p == seqs[0][0] for p, _ in seqs)
    first = len(seqs[0][0]) - 1 if shared else 0  # positions forwarded once, for every row
    for start in range(0, first, budget):
        piece = ids[:1, start : min(start + budget, first)]
        pos = torch.arange(start, start + piece.shape[1], device=device)[None]
        base(input_ids=piece, position_ids=pos, past_key_values=cache, use_cache=True)
    if first:
        cache.batch_repeat_interleave(len(rows))
    step = max(1, budget // len(rows))
    for start in range(first, width, step):
        piece = ids[:, start : start + step]
        pos = torch.arange(start, start + piece.shape[1], device=device).expand_as(piece)
        hidden = base(input_ids=piece, position_ids=pos, past_key_values=cache, use_cache=True).last_hidden_state
        for b, ((p, _), r) in enumerate(zip(seqs, rows)):
            # rows whose next token is a completion token: positions p-1 .. n-2
            lo, hi = max(len(p) - 1, start), min(len(r) - 1, start + piece.shape[1])
            if stats and lo < hi:
                e, lp = head_stats(head, hidden[b, lo - start : hi - start], ids[b, lo + 1 : hi + 1], chunk)
                ents[b].append(e)
                lps[b].append(lp)
    empty = torch.zeros(0, dtype=torch.float32, device=device)
    return [
        TraceScores(
            prompt_len=len(p),
            entropy=torch.cat(ents[b]) if ents[b] else empty,
            logprob=torch.cat(lps[b]) if lps[b] else empty,
            cache=cache if keep_cache else None,
            counter=TokenCounter(trace=width - (first if b else 0)),
            row=b,  # the shared prompt counted once
        )
        for b, (p, _) in enumerate(seqs)
    ]


def score_trace(
    model: Any,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    chunk: int,
    keep_cache: bool = True,
    stats: bool = True,
    forward_chunk: int | None = None,
) -> TraceScores:
    """``score_traces`` for one trace."""
    return score_traces(model, [(prompt_ids, completion_ids)], chunk, keep_cache, stats, forward_chunk)[0]
