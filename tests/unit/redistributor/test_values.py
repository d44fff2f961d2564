"""Exit-point values: the IS estimator by hand, and the fast (KV-cache + 4D mask) path against the
plain per-exit recomputation on random tiny models."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.redistributor.branch_attention import resolve
from rredcot.redistributor.branch_plan import Branch, ModelShape, plan_pieces
from rredcot.redistributor.entropy import TokenCounter, score_trace, score_traces
from rredcot.redistributor.references import CONTEXT, Tail, U, Y
from rredcot.redistributor.values import (
    DEFAULT_OVERHEAD_CELLS,
    BranchLogprobs,
    branch_logprobs_fast,
    branch_logprobs_reference,
    exit_values,
    forward_overhead_cells,
    importance_weights,
)


def _tails(refs, exit_ids, exits, shape: str = "solution") -> list[list[Tail]]:
    """The same tails at every exit: exit ⊕ u ⊕ y (``solution``: the first token is context) or
    u ⊕ exit ⊕ y (``suffix``: the first token is scored, so the branch gets an anchor)."""
    if shape == "solution":
        tails = [Tail.of([(exit_ids, CONTEXT), (u, U), (y, Y)]) for u, y in refs]
    else:
        tails = [Tail.of([(u, U), (exit_ids, CONTEXT), (y, Y)], 1 / len(refs)) for u, y in refs]
    return [tails] * len(exits)


def _hand_pairs() -> BranchLogprobs:
    # p(u1)=0.5, p(y1|u1)=0.6 -> p=0.3 ; p(u2)=0.2, p(y2|u2)=0.4 -> p=0.08
    log_u = np.log([[0.5, 0.2]])
    log_y = np.log([[0.6, 0.4]])
    return BranchLogprobs(log_u, log_y, np.array([[0.7, 0.1]]))


def test_is_estimator_by_hand() -> None:
    bl = _hand_pairs()
    # uniform proposal q = 0.5: importance weights 0.3/0.5 = 0.6 and 0.08/0.5 = 0.16
    np.testing.assert_allclose(importance_weights(bl.log_u, bl.log_y), [[0.6, 0.16]])
    # (1/N) Σ w_i U_i = 0.5 * (0.6 * 1 + 0.16 * 0) = 0.3
    np.testing.assert_allclose(exit_values(bl, [1.0, 0.0], "prob"), [0.3])
    np.testing.assert_allclose(exit_values(bl, [1.0, 0.0], "log"), [np.log(0.3)])
    np.testing.assert_allclose(exit_values(bl, [1.0, 1.0], "prob"), [0.38])
    np.testing.assert_allclose(exit_values(bl, [1.0, 0.0], "mean_token_prob"), [0.35])


def test_values_without_positive_utility() -> None:
    bl = _hand_pairs()
    assert exit_values(bl, [0.0, 0.0], "log")[0] == -np.inf
    assert exit_values(bl, [0.0, 0.0], "prob")[0] == 0.0
    empty = BranchLogprobs(np.zeros((3, 0)), np.zeros((3, 0)), np.zeros((3, 0)))
    assert list(exit_values(empty, [], "log")) == [-np.inf] * 3
    with pytest.raises(ValueError, match="value space"):
        exit_values(bl, [1.0, 1.0], "logit")


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    n_exits=st.integers(1, 4),
    n_pairs=st.integers(1, 4),
    base=st.sampled_from([0.0, -1000.0, -1010.5]),
)
def test_exit_values_match_high_precision_brute_force(data, n_exits, n_pairs, base) -> None:
    """v̂(s_t) = Σ_i p(u_i | s_t) p(y_i | u_i, s_t) U_i summed in 50-digit arithmetic (mpmath): ``log``
    is log v̂ (−inf when v̂ = 0: every utility 0 or every pair impossible), ``prob`` is v̂ = e^{log v̂}
    (0 in float64 below e^−745, where log space still resolves it), ``mean_token_prob`` is
    (1/N) Σ_i U_i · mtp_i. log p(u_i) around −1000 (every e^{log p} underflows) and 0, utilities 0,
    1 or anything ≥ 0."""

    def table(elements) -> np.ndarray:  # [T, N]
        cells = data.draw(st.lists(elements, min_size=n_exits * n_pairs, max_size=n_exits * n_pairs))
        return np.array(cells, dtype=np.float64).reshape(n_exits, n_pairs)

    log_u = table(st.one_of(st.floats(-40, 0).map(lambda x: base + x), st.just(-math.inf)))
    log_y, mtp = table(st.floats(-20, 0)), table(st.floats(0, 1))
    utilities = data.draw(
        st.lists(st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 3)), min_size=n_pairs, max_size=n_pairs)
    )
    bl = BranchLogprobs(log_u, log_y, mtp)
    log_v, prob, mean_tp = (exit_values(bl, utilities, space) for space in ("log", "prob", "mean_token_prob"))
    with mpmath.workdps(50):
        for t in range(n_exits):
            v = mpmath.fsum(mpmath.exp(mpmath.mpf(log_u[t, i]) + log_y[t, i]) * utilities[i] for i in range(n_pairs))
            if v == 0:
                assert log_v[t] == -math.inf and prob[t] == 0
            else:
                assert log_v[t] == pytest.approx(float(mpmath.log(v)), rel=1e-13, abs=1e-9)
                assert prob[t] == pytest.approx(float(v), rel=1e-9, abs=1e-310)
            ref_mtp = mpmath.fsum(mpmath.mpf(mtp[t, i]) * utilities[i] for i in range(n_pairs)) / n_pairs
            assert mean_tp[t] == pytest.approx(float(ref_mtp), rel=1e-12, abs=1e-300)
    np.testing.assert_allclose(prob, np.exp(log_v), rtol=1e-15, atol=0)
    assert log_v.shape == prob.shape == mean_tp.shape == (n_exits,)


def test_branch_logprobs_are_sums_and_mean_token_prob_of_one_forward(make_lm) -> None:
    """For each (exit point t, pair i): one plain forward of ``prompt ⊕ o[:e_t] ⊕ exit ⊕ u_i ⊕ y_i``,
    log p of each scored token read off by hand: log_u = Σ over u_i's tokens, log_y = Σ over y_i's,
    mean_token_prob = the mean of their probabilities (not of their log-probs; 1 for a pair with no
    token), for the fast path and the reference path alike."""
    model = make_lm("qwen3", 7)
    prompt, comp, exit_ids = [5, 17, 3], [40, 41, 42, 43, 44, 45, 46], [9, 8]
    exits, refs = [0, 3, 7], [([11, 12, 13], [14]), ([21], []), ([], [])]
    expected = {name: np.zeros((3, 3)) for name in ("log_u", "log_y", "mtp")}
    with torch.no_grad():
        for t, e in enumerate(exits):
            for i, (u, y) in enumerate(refs):
                seq = [*prompt, *comp[:e], *exit_ids, *u, *y]
                start = len(prompt) + e + len(exit_ids)  # position of u's first token
                rows = len(seq) - start + 1  # those from start - 1 on: each predicts the next token
                logp = model(torch.tensor([seq]), logits_to_keep=rows).logits[0].double().log_softmax(-1)
                lp = [float(logp[p - start, seq[p]]) for p in range(start, len(seq))]
                expected["log_u"][t, i] = sum(lp[: len(u)])
                expected["log_y"][t, i] = sum(lp[len(u) :])
                expected["mtp"][t, i] = np.mean(np.exp(lp)) if lp else 1.0
    trace = score_trace(model, prompt, comp, chunk=4)
    for bl in (
        branch_logprobs_fast(model, trace, exits, _tails(refs, exit_ids, exits), prompt + comp, 1 << 30),
        branch_logprobs_reference(model, prompt, comp, exits, _tails(refs, exit_ids, exits)),
    ):
        np.testing.assert_allclose(bl.log_u, expected["log_u"], atol=1e-4, rtol=0)
        np.testing.assert_allclose(bl.log_y, expected["log_y"], atol=1e-4, rtol=0)
        np.testing.assert_allclose(bl.mean_token_prob, expected["mtp"], atol=1e-6, rtol=1e-4)


def _random_case(seed: int, p: int, n: int, k: int, n_refs: int, vocab: int = 512):
    g = torch.Generator().manual_seed(seed)
    r = lambda m: torch.randint(0, vocab, (m,), generator=g).tolist()  # noqa: E731
    exits = sorted({0, n, *torch.randint(1, n, (k - 1,), generator=g).tolist()})
    refs = [
        (r(int(torch.randint(1, 7, (1,), generator=g))), r(int(torch.randint(1, 4, (1,), generator=g))))
        for _ in range(n_refs)
    ]
    return r(p), r(n), exits, refs, r(3)


@pytest.mark.parametrize("shape", ["solution", "suffix"])
@pytest.mark.parametrize("attention", ["dense", "flex"])
@pytest.mark.parametrize(
    "arch,seed,n,k,n_refs,budget,overhead",
    [
        ("qwen3", 0, 40, 3, 1, 1 << 30, 1 << 30),  # every branch in one forward
        ("qwen3", 1, 97, 8, 2, 600_000, 1 << 30),  # a few branches per forward (memory)
        ("qwen3", 1, 97, 8, 2, 1 << 30, 200),  # a few branches per forward (waste)
        ("qwen2", 2, 150, 12, 3, 160_000, 1 << 30),  # about one branch per forward
        ("qwen3", 3, 12, 1, 2, 1, 1 << 30),  # every branch in one-token chunks on its own cache
    ],
)
def test_fast_matches_reference(make_lm, arch, seed, n, k, n_refs, budget, overhead, attention, shape) -> None:
    """Dense (sdpa) and block-sparse flex (uncompiled on CPU) masks give the reference's values, for
    tails that start with context and for tails whose first token is scored (an anchor before it)."""
    model = make_lm(arch, seed)
    prompt, comp, exits, refs, exit_ids = _random_case(seed, 5, n, k, n_refs)
    trace = score_trace(model, prompt, comp, chunk=16)
    tails = _tails(refs, exit_ids, exits, shape)
    fast = branch_logprobs_fast(
        model, trace, exits, tails, prompt + comp, budget, chunk=7, attention=attention, overhead_cells=overhead
    )
    ref = branch_logprobs_reference(model, prompt, comp, exits, tails)
    for a, b in [(fast.log_u, ref.log_u), (fast.log_y, ref.log_y), (fast.mean_token_prob, ref.mean_token_prob)]:
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert trace.cache.get_seq_length() == len(prompt) + len(comp)  # branch KV dropped
    anchors = shape == "suffix"  # one token per branch: the prefix's last, forwarded again
    branch = sum(len(exit_ids) + len(u) + len(y) + anchors for u, y in refs) * len(exits)
    assert trace.counter.total == len(prompt) + len(comp) + branch


def test_trace_entropy_and_logprob_match_full_logits(make_lm) -> None:
    model = make_lm("qwen3", 4)
    prompt, comp, *_ = _random_case(4, 3, 50, 2, 1)
    trace = score_trace(model, prompt, comp, chunk=8)
    logp = model(torch.tensor([prompt + comp]), logits_to_keep=len(comp) + 1).logits[0, :-1].log_softmax(-1)
    ent = -(logp.exp() * logp).sum(-1)
    lp = logp.gather(-1, torch.tensor(comp)[:, None])[:, 0]
    torch.testing.assert_close(trace.entropy, ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.logprob, lp, atol=1e-5, rtol=0)


def test_fast_values_change_with_prefix(make_lm) -> None:
    """Branches really see their own prefix: different exit points give different log-probs."""
    model = make_lm("qwen3", 5)
    prompt, comp, _, refs, exit_ids = _random_case(5, 4, 60, 2, 1)
    trace = score_trace(model, prompt, comp, chunk=64)
    tails = _tails(refs, exit_ids, [0, 30, 60])
    fast = branch_logprobs_fast(model, trace, [0, 30, 60], tails, prompt + comp, memory_bytes=4096)
    assert len(set(np.round(fast.log_u[:, 0], 6))) == 3


def test_degenerate_trace_inputs(make_lm) -> None:
    model = make_lm("qwen3", 6)
    empty = score_trace(model, [1, 2], [], chunk=8)
    assert empty.entropy.numel() == 0 and empty.counter.total == 2
    with pytest.raises(ValueError, match="prompt"):
        score_trace(model, [], [1, 2], chunk=8)
    with pytest.raises(ValueError, match="as many tails"):
        branch_logprobs_fast(model, empty, [0], [], [1, 2], memory_bytes=64)
    no_refs = branch_logprobs_fast(model, empty, [0], [[]], [1, 2], memory_bytes=64)
    assert no_refs.log_u.shape == (1, 0)
    nothing_scored = branch_logprobs_fast(model, empty, [0], [[Tail.of([([9], CONTEXT)])]], [1, 2], 64)
    assert (nothing_scored.log_u, nothing_scored.mean_token_prob) == (0.0, 1.0) and empty.counter.branch == 0
    counter = TokenCounter()
    branch_logprobs_reference(model, [1, 2], [3, 4], [0, 2], _tails([([5], [6])], [9], [0, 2]), counter)
    assert counter.trace == 2 + 4 and counter.branch == 2 * 3


def test_batched_traces_match_single_traces(make_lm) -> None:
    """Right-padded batches (rows of different lengths) give each row's own entropies and branches."""
    model = make_lm("qwen3", 7)
    cases = [_random_case(10 + i, 3 + i, n, 3, 2) for i, n in enumerate([30, 55, 12])]
    seqs = [(p, c) for p, c, *_ in cases]
    batched = score_traces(model, seqs, chunk=8, forward_chunk=48)  # 16 positions per forward
    for (prompt, comp, exits, refs, exit_ids), trace in zip(cases, batched):
        single = score_trace(model, prompt, comp, chunk=64)
        torch.testing.assert_close(trace.entropy, single.entropy, atol=1e-5, rtol=0)
        torch.testing.assert_close(trace.logprob, single.logprob, atol=1e-5, rtol=0)
        fast = branch_logprobs_fast(model, trace, exits, _tails(refs, exit_ids, exits), prompt + comp, 40)
        ref = branch_logprobs_reference(model, prompt, comp, exits, _tails(refs, exit_ids, exits))
        np.testing.assert_allclose(fast.log_u, ref.log_u, atol=1e-5, rtol=0)
        np.testing.assert_allclose(fast.log_y, ref.log_y, atol=1e-5, rtol=0)
    assert {t.row for t in batched} == {0, 1, 2}
    assert batched[0].counter.trace == max(len(p) + len(c) for p, c in seqs)  # padded width forwarded


@pytest.mark.parametrize("prompt_len", [1, 2, 21])
def test_shared_prompt_is_forwarded_once_and_changes_nothing(make_lm, prompt_len) -> None:
    """A group's traces share one prompt: it is forwarded once, and every row's entropies, log-probs
    and branch values still equal those of the trace scored alone."""
    model = make_lm("qwen3", 3)
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(0, 512, (prompt_len,), generator=g).tolist()
    comps = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (9, 17, 4)]
    batched = score_traces(model, [(prompt, c) for c in comps], chunk=8, forward_chunk=24)
    for comp, trace in zip(comps, batched):
        single = score_trace(model, prompt, comp, chunk=64)
        torch.testing.assert_close(trace.entropy, single.entropy, atol=1e-5, rtol=0)
        torch.testing.assert_close(trace.logprob, single.logprob, atol=1e-5, rtol=0)
        exits = [0, len(comp) // 2, len(comp)]
        tails = _tails([([5, 6], [7])], [9], exits, "suffix")
        fast = branch_logprobs_fast(model, trace, exits, tails, prompt + comp, memory_bytes=40)
        ref = branch_logprobs_reference(model, prompt, comp, exits, tails)
        np.testing.assert_allclose(fast.log_u, ref.log_u, atol=1e-5, rtol=0)
        np.testing.assert_allclose(fast.log_y, ref.log_y, atol=1e-5, rtol=0)
    width = prompt_len + max(map(len, comps))
    shared = prompt_len - 1
    assert sum(t.counter.trace for t in batched) == shared + 3 * (width - shared)  # the prompt counted once


def test_fast_matches_reference_under_eager_attention(make_lm) -> None:
    """Issue 13.8: eager attention adds the mask to the scores; a boolean mask put exit values off
    by up to 0.14 nats here. The mask follows the attention implementation now."""
    model = make_lm("qwen3", 1)
    model.set_attn_implementation("eager")
    prompt, comp, exits, refs, exit_ids = _random_case(1, 5, 60, 4, 2)
    trace = score_trace(model, prompt, comp, chunk=16)
    tails = _tails(refs, exit_ids, exits)
    for budget in (1 << 30, 1):
        fast = branch_logprobs_fast(model, trace, exits, tails, prompt + comp, memory_bytes=budget)
        ref = branch_logprobs_reference(model, prompt, comp, exits, tails)
        np.testing.assert_allclose(fast.log_u, ref.log_u, atol=1e-5, rtol=0)
        np.testing.assert_allclose(fast.log_y, ref.log_y, atol=1e-5, rtol=0)
    model.config._attn_implementation = "flash_attention_2"  # what a GPU scorer could be set to
    with pytest.raises(ValueError, match="sdpa or eager attention.*flash_attention_2"):
        branch_logprobs_fast(model, trace, exits, tails, prompt + comp, memory_bytes=1 << 30, attention="dense")


SHAPE = ModelShape(heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=128, dtype_bytes=4, mask_bytes=1)
FLEX_SHAPE = ModelShape(
    heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=128, dtype_bytes=4, mask_bytes=0, sparse=True
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 5000), st.integers(1, 300)), min_size=1, max_size=30),
    st.integers(1, 1 << 28),
    st.integers(0, 1 << 22),
    st.booleans(),
)
def test_plan_stays_within_the_budget_and_covers_every_token_once(spec, budget, overhead, sparse) -> None:
    """Issue 13.3: a forward's peak is bounded by the byte budget whatever the trace length (a lone
    token over a long prefix is the only exception); every branch token is forwarded exactly once,
    in order, and a chunked branch is alone in its pieces. A branch joined a dense forward only if
    the waste it added was at most ``overhead`` cells, and when it started a forward of its own, the
    forward before could not take it (memory or waste)."""
    shape = FLEX_SHAPE if sparse else SHAPE
    branches = [
        Branch(t, prefix, list(range(n)), [CONTEXT] + [U] * (n - 1)) for t, (prefix, n) in enumerate(sorted(spec))
    ]
    pieces = plan_pieces(branches, budget, shape, overhead)
    seen: dict[int, list[int]] = {}
    for piece in pieces:
        q = sum(b - a for _, a, b in piece.items)
        assert piece.limit == max(branches[k].prefix_len for k, _, _ in piece.items)
        earlier = piece.items[0][1]
        assert shape.forward_bytes(q, piece.limit + earlier + q) <= budget or q == 1
        assert earlier == 0 or len(piece.items) == 1
        for k, a, b in piece.items:
            assert seen.get(k, [0])[-1] == a  # continues where the branch's last piece ended
            seen.setdefault(k, [0]).append(b)
        for j in range(1, len(piece.items)):  # each join added at most `overhead` cells of waste
            before, with_j = (_cells(branches, piece.items[:i], shape) for i in (j, j + 1))
            assert with_j - before <= overhead
    for prev, nxt in zip(pieces, pieces[1:]):  # a new forward only when the previous one could not take it
        if prev.items[-1][1] == 0 and nxt.items[0][1] == 0 and nxt.items[0][2] == len(branches[nxt.items[0][0]].ids):
            joined = [*prev.items, nxt.items[0]]
            q = sum(b - a for _, a, b in joined)
            limit = max(branches[k].prefix_len for k, _, _ in joined)
            added = _cells(branches, joined, shape) - _cells(branches, prev.items, shape)
            assert shape.forward_bytes(q, limit + q) > budget or added > overhead
    assert {k: v[-1] for k, v in seen.items()} == {k: len(b.ids) for k, b in enumerate(branches)}


def _cells(branches: list[Branch], items: list, shape: ModelShape) -> int:
    """Wasted cells of a dense forward of whole branches, recomputed from scratch (0 for flex)."""
    q = sum(b - a for _, a, b in items)
    limit = max(branches[k].prefix_len for k, _, _ in items)
    need = sum(len(branches[k].ids) * (branches[k].prefix_len + len(branches[k].ids)) for k, _, _ in items)
    return 0 if shape.sparse else q * (limit + q) - need


def test_waste_rule_by_hand() -> None:
    """Two 10-token branches over prefixes 100 and 200: together they compute 20·(200 + 20) = 4400
    cells for 10·110 + 10·210 = 3200 needed, 1200 wasted; apart, none. They share a forward iff one
    forward costs more than 1200 cells; flex computes no waste and always joins them."""
    labels = [CONTEXT] + [U] * 9
    branches = [Branch(0, 100, list(range(10)), labels), Branch(1, 200, list(range(10)), labels)]
    assert [len(p.items) for p in plan_pieces(branches, 1 << 30, SHAPE, 1200)] == [2]
    assert [len(p.items) for p in plan_pieces(branches, 1 << 30, SHAPE, 1199)] == [1, 1]
    assert [len(p.items) for p in plan_pieces(branches, 1 << 30, FLEX_SHAPE, 0)] == [2]


def test_overhead_is_measured_once_per_model(make_lm) -> None:
    """The fixed cost of a forward, in attention cells, is measured on this machine (a positive,
    finite number within the clamp) and cached for the model; a fresh model measures again."""
    model = make_lm("qwen3", 8)
    cells = forward_overhead_cells(model)
    assert 1024 <= cells <= 1 << 26
    assert forward_overhead_cells(model) == cells  # cached: the same value, not a second timing
    assert resolve("auto", model) == "dense"  # a CPU scorer
    with pytest.raises(ValueError, match="branch attention 'sparse'"):
        resolve("sparse", model)


def test_failed_allocation_retries_with_a_smaller_budget(make_lm) -> None:
    """Issue 13.3: an allocation failure halves the budget and redoes the values (never a dead
    letter); the result equals the reference."""
    model = make_lm("qwen3", 2)
    prompt, comp, exits, refs, exit_ids = _random_case(2, 5, 80, 6, 2)
    trace = score_trace(model, prompt, comp, chunk=16)

    def refuse_large(module, args, kwargs):  # the allocator refusing forwards of more than 20 tokens
        if kwargs["input_ids"].shape[1] > 20:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    hook = model.get_decoder().register_forward_pre_hook(refuse_large, with_kwargs=True)
    try:
        tails = _tails(refs, exit_ids, exits)
        fast = branch_logprobs_fast(model, trace, exits, tails, prompt + comp, 1 << 30, overhead_cells=1 << 30)
        assert forward_overhead_cells(model) == DEFAULT_OVERHEAD_CELLS  # its own forwards refused too
    finally:
        hook.remove()
    assert forward_overhead_cells(model) != DEFAULT_OVERHEAD_CELLS  # not cached: measured once memory allows
    ref = branch_logprobs_reference(model, prompt, comp, exits, tails)
    np.testing.assert_allclose(fast.log_u, ref.log_u, atol=1e-5, rtol=0)
    assert trace.counter.oom_retries >= 2
