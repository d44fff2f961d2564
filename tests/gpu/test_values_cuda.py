"""Exit values on a CUDA scorer: the fast path (dense 4D branch mask, or compiled block-sparse flex
attention, on the trace KV; memory-budgeted forwards) equals the per-exit recomputation, in fp32
(needs only torch and transformers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.entropy import score_trace
from rredcot.redistributor.references import CONTEXT, Tail, U, Y
from rredcot.redistributor.values import branch_logprobs_fast, branch_logprobs_reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _case(seed: int, n: int, refs: int, ref_len: int) -> tuple:
    """A tiny CUDA scorer, a random prompt of 9 tokens, a completion of ``n`` and the tails of
    ``refs`` references: exit ⊕ u ⊕ y, and u ⊕ exit ⊕ y (an anchored branch: its first token scored)."""
    model = build_tiny_model("qwen3", seed=0, vocab_size=512).to("cuda")
    g = torch.Generator().manual_seed(seed)
    prompt, comp = torch.randint(0, 512, (9,), generator=g).tolist(), torch.randint(0, 512, (n,), generator=g).tolist()
    us = [torch.randint(0, 512, (ref_len,), generator=g).tolist() for _ in range(refs)]
    tails = [Tail.of([([1, 2], CONTEXT), (u, U), ([7, 8], Y)]) for u in us]
    tails += [Tail.of([(u, U), ([1, 2], CONTEXT), ([7, 8], Y)], 0.5) for u in us]
    return model, prompt, comp, tails


@pytest.mark.parametrize("attention", ["dense", "flex"])
@pytest.mark.parametrize("budget", [1 << 30, 200_000])  # one forward; several forwards and chunked branches
def test_fast_values_match_reference_on_cuda(budget, attention) -> None:
    model, prompt, comp, tails = _case(0, 300, 3, 40)
    exits = [0, 50, 120, 200, 300]
    trace = score_trace(model, prompt, comp, chunk=64)
    per_exit = [tails] * len(exits)
    fast = branch_logprobs_fast(model, trace, exits, per_exit, prompt + comp, memory_bytes=budget, attention=attention)
    ref = branch_logprobs_reference(model, prompt, comp, exits, per_exit)
    np.testing.assert_allclose(fast.log_u, ref.log_u, atol=1e-3, rtol=0)  # fp32 sums of 40 log-probs
    np.testing.assert_allclose(fast.log_y, ref.log_y, atol=1e-4, rtol=0)


def test_auto_picks_flex_on_cuda() -> None:
    from rredcot.redistributor.branch_attention import resolve

    assert resolve("auto", build_tiny_model("qwen3", seed=0, vocab_size=512).to("cuda")) == "flex"


def test_compiled_flex_does_not_compile_again_for_new_exits() -> None:
    """After a warm-up trace, other exits (new trace prefixes, new lengths) reuse the compiled mask
    builder and flex attention: a compile per exit would pass torch's recompile limit and fall back to
    uncompiled flex, which materialises the scores."""
    from torch._dynamo.utils import counters

    model, prompt, comp, tails = _case(1, 600, 2, 30)
    trace = score_trace(model, prompt, comp, chunk=64)
    for exits in ([0, 100, 200], [50, 150, 250]):  # warm-up: static, then dynamic shapes
        branch_logprobs_fast(model, trace, exits, [tails] * len(exits), prompt + comp, 200_000, attention="flex")
    graphs = counters["stats"]["unique_graphs"]
    for exits in ([33, 333, 444], [77, 377, 511, 590]):
        branch_logprobs_fast(model, trace, exits, [tails] * len(exits), prompt + comp, 200_000, attention="flex")
    assert counters["stats"]["unique_graphs"] == graphs
