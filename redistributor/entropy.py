"""One forward pass of the scorer over a trace: per-token entropy and log-prob, chunked.

The base model runs over the trace in position chunks with a KV cache; the LM head is applied
chunk by chunk to the hidden states, so [L, V] logits never exist for a long L. The KV cache of
the whole trace is kept: the exit-point branches (``values.py``) attend to it instead of
recomputing any prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache


@dataclass
class TokenCounter:
    """Tokens fed through the scorer (trace and branch tokens), for the ≤ 1.05× ideal check."""

    trace: int = 0
    branch: int = 0

    @property
    def total(self) -> int:
        return self.trace + self.branch


@dataclass
class TraceScores:
    """Scorer outputs for ``prompt ⊕ completion``; entropy/logprob are per completion token."""

    prompt_len: int
    entropy: torch.Tensor  # float32 [L]
    logprob: torch.Tensor  # float32 [L], log p(o_j | x, o_<j)
    cache: DynamicCache | None  # KV of the whole trace (None when not kept)
    counter: TokenCounter = field(default_factory=TokenCounter)


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
def score_trace(
    model: Any, prompt_ids: list[int], completion_ids: list[int], chunk: int, keep_cache: bool = True,
    stats: bool = True, forward_chunk: int | None = None,
) -> TraceScores:
    """Forward ``prompt ⊕ completion`` once, ``forward_chunk`` positions per forward (default
    ``chunk``) and ``chunk`` rows per LM-head call.

    Token j of the completion is predicted from the hidden state at position P + j − 1, so the
    prompt must hold at least one token. ``stats=False`` only fills the KV cache (no LM head:
    entropy and logprob come back empty).
    """
    if not prompt_ids:
        raise ValueError("the prompt must hold at least one token (it predicts the first completion token)")
    base, head = model.get_decoder(), model.get_output_embeddings()
    device = head.weight.device
    ids = torch.tensor(list(prompt_ids) + list(completion_ids), dtype=torch.long, device=device)
    p, n = len(prompt_ids), ids.numel()
    cache = DynamicCache(config=model.config)
    ents, lps = [], []
    step = forward_chunk or chunk
    for start in range(0, n, step):
        piece = ids[start : start + step]
        pos = torch.arange(start, start + piece.numel(), device=device)
        hidden = base(
            input_ids=piece[None], position_ids=pos[None], past_key_values=cache, use_cache=True
        ).last_hidden_state[0]
        # rows whose next token is a completion token: positions p-1 .. n-2
        lo, hi = max(p - 1, start), min(n - 1, start + piece.numel())
        if stats and lo < hi:
            e, lp = head_stats(head, hidden[lo - start : hi - start], ids[lo + 1 : hi + 1], chunk)
            ents.append(e)
            lps.append(lp)
    empty = torch.zeros(0, dtype=torch.float32, device=device)
    return TraceScores(
        prompt_len=p,
        entropy=torch.cat(ents) if ents else empty,
        logprob=torch.cat(lps) if lps else empty,
        cache=cache if keep_cache else None,
        counter=TokenCounter(trace=n),
    )
