"""Attention masks for a forward of exit-point branches over the trace KV.

A forward's keys are ``limit`` trace positions, then ``earlier`` tokens of a branch continued from
the previous forward (a branch chunked for the budget), then the forward's own ``q`` tokens. Query
row r (branch ``item[r]``, token ``local[r]`` of it) may see trace positions below ``prefix[r]``,
all of ``earlier``, and the tokens of its own branch up to itself.

- ``dense``: a [q, limit + earlier + q] mask in the form the attention implementation reads (sdpa:
  boolean; eager *adds* it to the scores, so 0 / −inf). Every cell is computed.
- ``flex``: a block-sparse ``BlockMask`` run by torch's flex attention (compiled on CUDA), which
  skips the blocks no row may see, and never holds a q × kv mask or score matrix. On other devices
  flex runs uncompiled, which materialises the scores: correct, for tests, not for long traces.
  The compiled mask function reads ``limit`` and ``earlier`` from a tensor, not from Python ints:
  compiled code specialises on the ints it reads, so each new exit prefix would compile again, and
  after torch's recompile limit flex would run uncompiled on a 25k-token trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

BRANCH_ATTENTION = ("auto", "dense", "flex")
_FLEX_NAME = "rredcot_branch_flex"


@dataclass
class BranchRows:
    """The query rows of one forward (tensors [q] on the model's device)."""

    prefix: torch.Tensor  # trace positions each row may see
    item: torch.Tensor  # the branch a row belongs to
    local: torch.Tensor  # the row's token index within its branch
    limit: int
    earlier: int
    bounds: torch.Tensor = field(init=False)  # [limit, limit + earlier], what the mask function reads

    def __post_init__(self) -> None:
        self.bounds = torch.tensor([self.limit, self.limit + self.earlier], device=self.prefix.device)

    @property
    def kv_len(self) -> int:
        return self.limit + self.earlier + self.prefix.numel()

    def allowed(self, kv: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """May query ``row`` see key position ``kv`` (broadcasting index tensors)."""
        limit, own_start = self.bounds[0], self.bounds[1]
        own = (kv - own_start).clamp(min=0)
        sees_own = (self.item[own] == self.item[row]) & (self.local[own] <= self.local[row])
        return torch.where(kv < limit, kv < self.prefix[row], (kv < own_start) | sees_own)


def attention_impl(model: Any) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


def resolve(requested: str, model: Any) -> str:
    """``dense`` or ``flex`` for ``credit.scorer.branch_attention`` on this model: ``auto`` is flex on a
    CUDA model (when torch has flex attention), dense elsewhere."""
    if requested not in BRANCH_ATTENTION:
        raise ValueError(f"branch attention {requested!r} not in {BRANCH_ATTENTION}")
    if requested != "auto":
        return requested
    on_cuda = model.get_output_embeddings().weight.device.type == "cuda"
    return "flex" if on_cuda and _has_flex() else "dense"


def _has_flex() -> bool:
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def dense_mask(rows: BranchRows, model: Any, dtype: torch.dtype) -> torch.Tensor:
    """The 4D mask as the model's attention implementation reads it (sdpa or eager)."""
    device = rows.prefix.device
    q = rows.prefix.numel()
    allowed = rows.allowed(torch.arange(rows.kv_len, device=device)[None, :], torch.arange(q, device=device)[:, None])
    impl = attention_impl(model)
    if impl == "sdpa":
        return allowed[None, None]
    if impl == "eager":
        additive = torch.zeros(allowed.shape, dtype=dtype, device=device)
        return additive.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
    raise ValueError(f"exit values need sdpa or eager attention (the 4D branch mask); the scorer uses {impl!r}")


def flex_mask(rows: BranchRows) -> Any:
    """A ``BlockMask`` for the rows (its mask function is compiled on CUDA, never a dense q × kv)."""
    from torch.nn.attention.flex_attention import create_block_mask

    device = rows.prefix.device
    build = compiled(create_block_mask, device)
    return build(lambda b, h, row, kv: rows.allowed(kv, row), None, None, rows.prefix.numel(), rows.kv_len, device)


FLEX_COMPILE = {"dynamic": True}  # the query and key lengths change with every forward
_compiled: dict[str, Any] = {}


def compiled(fn: Any, device: torch.device) -> Any:
    """``fn`` compiled once per process (``FLEX_COMPILE``) on CUDA; as it is elsewhere."""
    if device.type != "cuda":
        return fn
    if fn.__name__ not in _compiled:
        _compiled[fn.__name__] = torch.compile(fn, **FLEX_COMPILE)
    return _compiled[fn.__name__]


def _flex_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: flex attention over the branch ``BlockMask``."""
    from torch.nn.attention.flex_attention import flex_attention

    gqa = query.shape[1] != key.shape[1]
    out = compiled(flex_attention, query.device)(
        query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=gqa
    )
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def flex_attention_on(model: Any) -> Iterator[None]:
    """Run the model's attention layers through ``_flex_attention`` inside the block."""
    from transformers import AttentionInterface

    AttentionInterface.register(_FLEX_NAME, _flex_attention)
    before = model.config._attn_implementation
    model.config._attn_implementation = _FLEX_NAME
    try:
        yield
    finally:
        model.config._attn_implementation = before
