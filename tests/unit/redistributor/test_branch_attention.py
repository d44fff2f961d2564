"""Branch masks under compilation: the mask function must not specialise on each forward's trace
prefix, or every exit would compile flex attention again (on CUDA; checked here with torch's
compile counter on CPU, the same compile settings and mask function)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from rredcot.redistributor import branch_attention
from rredcot.redistributor.branch_attention import BranchRows


def _rows(q: int, limit: int, earlier: int) -> BranchRows:
    r = torch.arange(q)
    return BranchRows(torch.full((q,), limit), r // 16, r % 16, limit, earlier)


def test_new_exit_prefixes_and_lengths_do_not_compile_again(monkeypatch: pytest.MonkeyPatch):
    """The module's own mask builder (``flex_mask``) and attention function (``_flex_attention``), with
    its compile settings, compiled here as on CUDA but counted by torch's compile counter: ten forwards
    with new prefixes, carried-over tokens and lengths compile each function at most twice (static,
    then dynamic). The old mask function (Python ints, no dynamic shapes) took 6 compiles here, and the
    old wiring (a new compiled mask builder per call) 16."""
    torch._dynamo.reset()
    counter, made = CompileCounter(), {}

    def compiled(fn, device):
        if fn.__name__ not in made:
            made[fn.__name__] = torch.compile(fn, backend=counter, **branch_attention.FLEX_COMPILE)
        return made[fn.__name__]

    monkeypatch.setattr(branch_attention, "compiled", compiled)
    for i in range(10):
        q = 16 + 8 * i
        rows = _rows(q, 128 + 64 * i, (0, 16, 0, 32, 8)[i % 5])
        query, key = torch.randn(1, 2, q, 16), torch.randn(1, 2, rows.kv_len, 16)
        out, _ = branch_attention._flex_attention(None, query, key, key, branch_attention.flex_mask(rows))
        assert out.shape == (1, q, 2, 16)
    assert set(made) == {"create_block_mask", "flex_attention"} and counter.frame_count <= 4


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
