"""Variable-length attention for packed rows: causal within each sample, never across samples.

A packed row concatenates whole samples; ``sample_bounds`` (the row offsets where samples start,
then the row's end) comes down to every attention layer as a forward keyword. Each sample runs its
own causal sdpa with no mask, so attention costs Σ Lᵢ² instead of the row width² that a
block-diagonal mask costs, and sdpa can take its flash kernel (CPU and GPU). Transformers builds
no mask for an attention name it does not know, so:

- packed rows (``sample_bounds`` given): one causal sdpa per sample;
- one sample per row, right-padded (``sample_bounds`` absent): one causal sdpa over the row: the
  padding comes after every real token, so no real token sees it and the padding mask is not needed;
- an explicit 4D mask (the shared-prompt layout): sdpa with that mask, one block per group when
  ``sample_bounds`` gives the groups' bounds (the mask is block-diagonal: the row's width² mask
  costs Σ unitᵢ² instead; 23% of a CPU demo step before).
"""

from __future__ import annotations

from itertools import pairwise

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

VARLEN_ATTENTION = "rredcot_varlen"


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sample_bounds: tuple[int, ...] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention output ``[B, L, H, D]`` for ``query`` ``[B, H, L, D]`` (one row when ``sample_bounds``)."""
    if sample_bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # split, not sliced: the backward of n slices allocates n full-size zero gradients, a split's one
    sizes = [b - a for a, b in pairwise(sample_bounds)]
    parts = [
        sdpa_attention_forward(
            module, q, k, v, None if attention_mask is None else attention_mask[..., a:b, a:b], **kwargs
        )[0]
        for q, k, v, (a, b) in zip(
            query.split(sizes, dim=2),
            key.split(sizes, dim=2),
            value.split(sizes, dim=2),
            pairwise(sample_bounds),
            strict=True,
        )
    ]
    return torch.cat(parts, dim=1), None


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)


def use_varlen_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch ``model`` (a transformers model) to the varlen attention; returns it."""
    model.set_attn_implementation(VARLEN_ATTENTION)
    return model
