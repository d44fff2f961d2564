"""How the exit-point branches are grouped into forwards over the trace KV.

A forward of ``q`` branch tokens attends over ``limit`` trace positions (the longest prefix among
its branches) plus its own ``q`` tokens. Under a dense mask every one of those q·(limit + q) cells
is computed, although branch b needs only n_b·(p_b + n_b) of them; the rest is *waste*. Two
things bound a forward:

- its peak memory (``ModelShape.forward_bytes``) stays within the byte budget
  (``credit.scorer.values_memory_mb``), whatever the trace length;
- a branch joins the forward before it only while the waste it adds costs less than a forward of
  its own would (``overhead_cells``: the fixed cost of one forward, in attention cells, measured per
  model by ``values.forward_overhead_cells``). Block-sparse (flex) attention computes no waste, so
  there only memory splits forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLEX_BLOCK = 128  # torch flex attention's block size: the kernel holds one block of scores per query row


@dataclass
class Branch:
    exit_index: int
    prefix_len: int  # trace positions the branch may attend to (P + e_t, or one less with an anchor)
    ids: list[int]  # the tail, after the trace's last prefix token (the anchor) when the tail's first token is scored
    labels: list[int]  # per id: references.CONTEXT (not scored; the first always is), U or Y

    @property
    def useful_cells(self) -> int:
        """Attention cells the branch needs: its tokens over its prefix and itself."""
        return len(self.ids) * (self.prefix_len + len(self.ids))


@dataclass(frozen=True)
class ModelShape:
    """What the peak memory of a branch forward depends on (from the model config)."""

    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    dtype_bytes: int
    mask_bytes: int  # a boolean mask (sdpa) or an additive float one (eager); 0 for flex
    sparse: bool = False  # block-sparse flex attention: no q·kv mask or score cells

    @classmethod
    def of(cls, model: Any, sparse: bool = False) -> ModelShape:
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        eager = (getattr(c, "_attn_implementation", None) or "eager") == "eager"
        return cls(
            c.num_attention_heads,
            getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim,
            c.hidden_size,
            c.intermediate_size,
            next(model.parameters()).element_size(),
            0 if sparse else 4 if eager else 1,
            sparse,
        )

    def forward_bytes(self, q: int, kv: int) -> int:
        """Peak bytes of one forward of ``q`` query tokens over ``kv`` key positions: the mask and
        the attention scores (q·kv cells; for flex one block of scores per row and the block
        table), one layer's keys and values (the cached prefix is joined to the new ones per layer,
        then dropped), and the MLP activations."""
        if self.sparse:
            blocks = (q // FLEX_BLOCK + 1) * (kv // FLEX_BLOCK + 1)
            cells = q * FLEX_BLOCK * 4 * self.heads + 8 * blocks
        else:
            cells = q * kv * (self.mask_bytes + 4 * self.heads)
        layer_kv = 2 * kv * self.kv_heads * self.head_dim * self.dtype_bytes
        return cells + layer_kv + q * (4 * self.hidden + 3 * self.intermediate) * self.dtype_bytes

    def waste(self, q: int, limit: int, useful: int) -> int:
        """Cells a forward of ``q`` tokens over ``limit`` trace positions computes beyond ``useful``."""
        return 0 if self.sparse else q * (limit + q) - useful


@dataclass
class Piece:
    """One branch forward: tokens [a, b) of each listed branch (k, a, b). A branch too long for the
    budget alone is split into pieces of one item each; a piece with a > 0 continues the previous
    one on its cache."""

    items: list[tuple[int, int, int]]
    limit: int  # trace positions attended: the largest prefix among its branches
    useful: int = 0  # cells its whole branches need (``Branch.useful_cells``)

    @property
    def q(self) -> int:
        return sum(hi - lo for _, lo, hi in self.items)


def plan_pieces(branches: list[Branch], budget: int, shape: ModelShape, overhead_cells: int) -> list[Piece]:
    """Consecutive branches per forward while ``shape.forward_bytes`` stays within ``budget`` and
    each joining branch adds at most ``overhead_cells`` of waste."""
    pieces: list[Piece] = []
    for k, b in enumerate(branches):
        n, last = len(b.ids), pieces[-1] if pieces else None
        if last is not None and last.items[-1][1] == 0:  # a piece of whole branches: can it take this one?
            q, limit, useful = last.q + n, max(last.limit, b.prefix_len), last.useful + b.useful_cells
            added = shape.waste(q, limit, useful) - shape.waste(last.q, last.limit, last.useful)
            if shape.forward_bytes(q, limit + q) <= budget and added <= overhead_cells:
                last.items.append((k, 0, n))
                last.limit, last.useful = limit, useful
                continue
        if shape.forward_bytes(n, b.prefix_len + n) <= budget:
            pieces.append(Piece([(k, 0, n)], b.prefix_len, b.useful_cells))
            continue
        kv = b.prefix_len + n  # split: the largest chunk whose forward fits (at least one token)
        per_token = shape.forward_bytes(1, kv) - shape.forward_bytes(0, kv)
        c = max(1, (budget - shape.forward_bytes(0, kv)) // per_token)
        pieces += [Piece([(k, a, min(a + c, n))], b.prefix_len) for a in range(0, n, c)]
    return pieces
