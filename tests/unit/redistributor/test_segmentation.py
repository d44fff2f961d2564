"""Segmentation: hand-worked merge and partition cases, properties (hypothesis), degenerate inputs,
and realistic reasoning text through the real Qwen3 tokenizer."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rredcot.common.config import SegmentationConfig
from rredcot.redistributor.segmentation import (
    greedy_merge,
    keyword_boundaries,
    linear_partition,
    segment,
    thinking_span,
    token_texts,
)

KW = SegmentationConfig().keywords
REASONING = (
    "<think>\nOkay, let's compute 12*7. First, 10*7 = 70. Then 2*7 = 14. So the total is 84.\n"
    "Wait, let me double-check: 12*7 = 84. Hmm, yes. Nowhere did I slip.\n\n"
    "Alternatively, 7*12 = 7*10 + 7*2 = 84. Therefore 84.\n</think>\n\nThe answer is \\boxed{84}."
)


def test_merge_sequence_by_hand() -> None:
    ent = np.array([1, 5, 2, 2, 8, 1, 1, 6], dtype=float)
    lens = np.full(8, 5)
    # pair totals: (0,1)=6 (1,2)=7 (2,3)=4 (3,4)=10 (4,5)=9 (5,6)=2 (6,7)=7
    # 1) (5,6)=2 -> [1,5,2,2,8,2,6]; new pairs (4,56)=10, (56,7)=8
    # 2) (2,3)=4 -> [1,5,4,8,2,6];   new pairs (1,23)=9, (23,4)=12
    # 3) (0,1)=6 -> [6,4,8,2,6];     new pair (01,23)=10
    # 4) (56,7)=8 -> [6,4,8,8]: four pieces = K, stop. Segments start at pieces 0, 2, 4, 5.
    assert greedy_merge(ent, lens, k=4, min_len=4) == [0, 2, 4, 5]
    assert greedy_merge(ent, lens, k=8, min_len=4) == list(range(8))
    assert greedy_merge(ent, lens, k=1, min_len=4) == [0]


def test_min_length_merges_only_short_pieces() -> None:
    # no K cap: piece 1 (1 token) is short; its pairs (0,1)=4 and (1,2)=5 -> merge (0,1)
    assert greedy_merge(np.array([3.0, 1.0, 4.0]), np.array([5, 1, 5]), k=None, min_len=4) == [0, 2]
    assert greedy_merge(np.array([3.0, 1.0, 4.0]), np.array([5, 5, 5]), k=None, min_len=4) == [0, 1, 2]


def _naive_merge(ent: list[float], lens: list[int], k: int | None, min_len: int) -> list[int]:
    """O(P²) re-statement of the merge rule: lowest total entropy pair (leftmost on ties)."""
    segs = [[i, e, n] for i, (e, n) in enumerate(zip(ent, lens))]  # [start piece, entropy, length]

    def merge_best(ok) -> bool:
        cands = [(segs[j][1] + segs[j + 1][1], j) for j in range(len(segs) - 1) if ok(j)]
        if not cands:
            return False
        _, j = min(cands)
        segs[j][1] += segs[j + 1][1]
        segs[j][2] += segs[j + 1][2]
        del segs[j + 1]
        return True

    while k is not None and len(segs) > k and merge_best(lambda j: True):
        pass
    short = lambda j: segs[j][2] < min_len or segs[j + 1][2] < min_len  # noqa: E731
    while any(s[2] < min_len for s in segs) and len(segs) > 1 and merge_best(short):
        pass
    return [s[0] for s in segs]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(1, 6)), min_size=1, max_size=14),
    st.one_of(st.none(), st.integers(1, 8)),
    st.integers(1, 8),
)
def test_greedy_merge_matches_naive(pieces, k, min_len) -> None:
    ent = [float(e) for e, _ in pieces]  # integers: ties are exact, both break them leftmost
    lens = [n for _, n in pieces]
    assert greedy_merge(np.array(ent), np.array(lens), k, min_len) == _naive_merge(ent, lens, k, min_len)


def _brute_max(ent: np.ndarray, k: int) -> float:
    n = len(ent)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = [0, *cuts, n]
        best = min(best, max(ent[a:b].sum() for a, b in zip(edges[:-1], edges[1:])))
    return best


def test_linear_partition_by_hand() -> None:
    starts = linear_partition(np.array([1, 5, 2, 2, 8, 2, 6], dtype=float), 3)
    # the optimum of the largest group is 10 ([1,5,2,2] cannot be split further with 3 groups, and
    # any group with 8 plus a neighbour of 2+ reaches 10); greedy fills left under that threshold:
    # [1,5,2,2]=10 | [8,2]=10 | [6]
    assert starts == [0, 4, 6]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(0, 10), st.just(0.0), st.just(1e-5)), min_size=1, max_size=9), st.integers(1, 9))
@example([0.0] * 5 + [1.1123976066280337, 1e-05, 4.0], 1)  # summation-order rounding (found by hypothesis)
def test_linear_partition_is_optimal(ent: list[float], k: int) -> None:
    e = np.array(ent)
    starts = linear_partition(e, k)
    assert len(starts) == min(k, len(e)) and starts[0] == 0 and starts == sorted(set(starts))
    edges = [*starts, len(e)]
    got = max(e[a:b].sum() for a, b in zip(edges[:-1], edges[1:]))
    assert got <= _brute_max(e, min(k, len(e))) * (1 + 1e-8) + 1e-8


PIECES = [
    "\n",
    "\n\n",
    " ",
    ".",
    ",",
    " the",
    " value",
    "x",
    " =",
    " 3",
    " Wait",
    " So",
    "So",
    " But",
    "Hmm",
    " Let",
    " me",
    " check",
    "?",
    " Now",
    "here",
    "<think>",
    "</think>",
    " 42",
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(PIECES), max_size=80),
    st.data(),
    st.integers(1, 8),
    st.integers(1, 5),
    st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()),
)
def test_segment_properties(texts, data, k, min_len, switches) -> None:
    ent = np.array(
        data.draw(st.lists(st.one_of(st.floats(0, 8), st.just(float("nan"))), min_size=len(texts), max_size=len(texts)))
    )
    split, merge, stop, homog = switches
    cfg = SegmentationConfig(
        segments=k, min_segment_tokens=min_len, split_keywords=split, merge=merge, stop_at_k=stop, homogenise=homog
    )
    seg = segment(texts, ent, cfg, "<think>", "</think>")
    lo, hi = seg.span
    e = seg.exit_points.tolist()
    assert 0 <= lo <= hi <= len(texts)
    assert e[0] == lo and e[-1] == hi  # segments cover the span ...
    assert all(a < b for a, b in zip(e[:-1], e[1:]))  # ... exactly once
    if split:
        assert set(e[1:-1]) <= set(seg.candidates.tolist())
    if stop and (merge or homog):
        assert seg.n_segments <= k
    if merge or homog:  # every segment holds min_segment_tokens, unless there is only one
        assert seg.n_segments <= 1 or min(b - a for a, b in zip(e[:-1], e[1:])) >= min_len
    if not seg.has_think:
        assert (lo, hi) == (0, len(texts))


def test_homogenising_keeps_the_minimum_length() -> None:
    """The partition alone re-cut the merged segments into [0, 10, 11, 12]: two 1-token segments."""
    lines = ["a\n"] * 12  # a keyword boundary before every token
    ent = np.array([1, 1, 0, 0, 0, 0, 0, 0, 2, 1, 5, 1], dtype=float)
    cfg = SegmentationConfig(segments=4, min_segment_tokens=2)
    exits = segment(lines, ent, cfg, "<think>", "</think>").exit_points.tolist()
    assert exits[0] == 0 and exits[-1] == 12 and len(exits) - 1 <= 4
    assert min(np.diff(exits)) >= 2, exits


def test_degenerate_segmentations() -> None:
    cfg = SegmentationConfig()
    empty = segment([], np.zeros(0), cfg, "<think>", "</think>")
    assert empty.span == (0, 0) and empty.exit_points.tolist() == [0] and empty.n_segments == 0
    one = segment(["Hi"], np.array([1.0]), cfg, "<think>", "</think>")
    assert one.exit_points.tolist() == [0, 1]
    flat = segment(["a", " b", " c"], np.array([np.nan, 1, 2]), cfg, "<think>", "</think>")
    assert flat.exit_points.tolist() == [0, 3] and flat.candidates.size == 0  # no keyword boundary
    shut = segment(["<think>", "</think>", "42"], np.ones(3), cfg, "<think>", "</think>")
    assert shut.span == (1, 1) and shut.n_segments == 0  # empty thinking


def test_thinking_span_variants() -> None:
    full = ["<think>", "\n", "a", ".", "</think>", "\n", "b"]
    assert thinking_span(full, "<think>", "</think>") == (1, 4, True)
    truncated = full[:4]  # length-truncated: no closing tag, thinking runs to the end
    assert thinking_span(truncated, "<think>", "</think>") == (1, 4, True)
    opened_in_prompt = full[1:]  # the chat template put <think> in the prompt
    assert thinking_span(opened_in_prompt, "<think>", "</think>") == (0, 3, True)
    assert thinking_span(["a", "b"], "<think>", "</think>") == (0, 2, False)


def test_keywords_on_real_qwen_tokens(qwen_tok) -> None:
    ids = qwen_tok(REASONING)["input_ids"]
    texts = token_texts(qwen_tok, ids)
    assert "".join(texts) == REASONING
    lo, hi, has = thinking_span(texts, "<think>", "</think>")
    assert has and texts[lo - 1] == "<think>" and texts[hi] == "</think>"
    starts = [texts[j].strip() for j in keyword_boundaries(texts, lo, hi, KW)]
    # "let me" after a comma and "Nowhere" are not boundaries; line starts always are
    assert starts == ["Okay", "First", "Then", "So", "Wait", "Hmm", "Alternatively", "Therefore"]
    seg = segment(texts, np.ones(len(ids)), SegmentationConfig(segments=3, min_segment_tokens=1), "<think>", "</think>")
    assert seg.n_segments == 3
    pieces = ["".join(texts[a:b]) for a, b in zip(seg.exit_points[:-1], seg.exit_points[1:])]
    assert "".join(pieces) == "".join(texts[lo:hi])
    assert all(p.lstrip().split(",")[0].split(" ")[0] in {"Okay", *KW} for p in pieces[1:])


@pytest.mark.parametrize("n_lines", [1, 400])
def test_segment_long_trace_with_real_tokenizer(qwen_tok, n_lines: int) -> None:
    body = "".join(f"Step {i}: x = {i}*3. Wait, check it. So x is {3 * i}.\n" for i in range(n_lines))
    ids = qwen_tok("<think>\n" + body + "</think>\n\n42")["input_ids"]
    texts = token_texts(qwen_tok, ids)
    rng = np.random.default_rng(0)
    cfg = SegmentationConfig(segments=40, min_segment_tokens=1)
    seg = segment(texts, rng.random(len(ids)), cfg, "<think>", "</think>")
    assert seg.n_segments == min(40, len(seg.candidates) + 1)
    assert texts[seg.exit_points[-1]] == "</think>"


def test_token_texts_are_each_tokens_own_decoding_across_calls(qwen_tok) -> None:
    """The cached texts equal decoding each token alone, for repeated ids, ids seen in an earlier
    call, special tokens and an empty trace."""
    rng = np.random.default_rng(0)
    first = rng.integers(0, len(qwen_tok), 300).tolist() + qwen_tok("<think>\nWait, 7 × 8 = 56")["input_ids"]
    second = first[::3] + rng.integers(0, len(qwen_tok), 50).tolist() + [qwen_tok.eos_token_id] * 3
    for ids in (first, second, []):
        assert token_texts(qwen_tok, ids) == [qwen_tok.decode([i], skip_special_tokens=False) for i in ids]


def test_token_texts_of_a_tokenizer_without_weak_references() -> None:
    """A tokenizer object that takes no weak reference (``__slots__``) is decoded each time, not refused."""

    class Slotted:
        __slots__ = ()

        def batch_decode(self, seqs: list[list[int]], skip_special_tokens: bool) -> list[str]:
            return [f"<{s[0]}>" for s in seqs]

    assert token_texts(Slotted(), [3, 1, 3]) == ["<3>", "<1>", "<3>"]
