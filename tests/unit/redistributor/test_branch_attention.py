"""Branch masks under compilation: the mask function must not specialise on each forward's trace
prefix, or every exit would compile flex attention again (on CUDA; checked here with torch's
compile counter on CPU, the same compile settings and mask function)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from rredcot.redistributor.branch_attention import FLEX_COMPILE, BranchRows


def _rows(q: int, limit: int, earlier: int) -> BranchRows:
    r = torch.arange(q)
    return BranchRows(torch.full((q,), limit), r // 16, r % 16, limit, earlier)


def test_new_exit_prefixes_and_lengths_do_not_compile_again():
    torch._dynamo.reset()
    counter = CompileCounter()
    build = torch.compile(create_block_mask, backend=counter, **FLEX_COMPILE)
    attend = torch.compile(flex_attention, backend=counter, **FLEX_COMPILE)
    for q, limit, earlier in [(32, 256, 0), (48, 384, 16), (64, 512, 0), (80, 640, 32), (96, 768, 0), (112, 896, 8)]:
        rows = _rows(q, limit, earlier)
        mask = build(lambda b, h, row, kv, rows=rows: rows.allowed(kv, row), None, None, q, rows.kv_len, "cpu")
        k = torch.randn(1, 2, rows.kv_len, 16)
        out = attend(torch.randn(1, 2, q, 16), k, k, block_mask=mask)
        assert out.shape == (1, 2, q, 16)
    assert counter.frame_count <= 4  # the mask builder and the attention, each at most once more


@pytest.mark.parametrize(("limit", "earlier"), [(5, 0), (3, 2)])
def test_allowed_hand_case(limit, earlier):
    """Rows: two branches of two tokens; keys: ``limit`` trace positions, ``earlier`` carried-over
    tokens, then the rows themselves. Row r sees the trace below prefix[r], all earlier tokens, and
    its own branch up to itself."""
    rows = BranchRows(
        torch.tensor([2, 2, 4, 4]), torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]), limit, earlier
    )
    got = rows.allowed(torch.arange(rows.kv_len)[None, :], torch.arange(4)[:, None]).int().tolist()
    trace = [[int(k < p) for k in range(limit)] for p in (2, 2, 4, 4)]
    own = [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert got == [t + [1] * earlier + o for t, o in zip(trace, own, strict=True)]
