"""The value constructs: what each branch tail holds, token by token, written out from text with the
real Qwen3 tokenizer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rredcot.common.config import SegmentationConfig
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.references import (
    CONTEXT,
    Construct,
    Tail,
    U,
    Y,
    nearest_starts,
    split_pair,
    suffix_starts,
    tails,
)
from rredcot.redistributor.scorer import Scorer

STEPS = "2 - 1 = 1.\n1 * 4 = 4.\n4 * 3 = 12.\n"
ANSWER = "Answer: 12"


@pytest.fixture(scope="module")
def scorer(qwen_tok) -> Scorer:
    return Scorer(build_tiny_model("qwen3", seed=0), qwen_tok, "\n</think>\n\n")


def _enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _tail(tok, *parts: tuple[str, int], share: float = 1.0) -> Tail:
    return Tail.of([(_enc(tok, text), label) for text, label in parts], share)


def test_a_pair_splits_at_its_answer_template_with_suffixes_at_line_starts(scorer, qwen_tok) -> None:
    (c,) = scorer.constructs([(_enc(qwen_tok, STEPS), _enc(qwen_tok, ANSWER))], SegmentationConfig().keywords, 8)
    assert list(c.steps) == _enc(qwen_tok, STEPS)
    assert list(c.template) == _enc(qwen_tok, "Answer: ") and list(c.answer) == _enc(qwen_tok, "12")
    starts = [len(_enc(qwen_tok, STEPS[:i])) for i in (0, STEPS.index("1 *"), STEPS.index("4 *"), len(STEPS))]
    assert list(c.starts) == starts  # every line start, and the empty suffix


def test_suffix_tails_continue_the_reference_then_answer(scorer, qwen_tok) -> None:
    """After a line end the exit string loses its leading newline ("</think>\\n\\n", never a blank
    line); inside a line it is whole. Template tokens are context; each suffix has share 1/4."""
    (c,) = scorer.constructs([(_enc(qwen_tok, STEPS), _enc(qwen_tok, ANSWER))], SegmentationConfig().keywords, 8)
    lines = STEPS.splitlines(keepends=True)
    expected = [
        _tail(
            qwen_tok, ("".join(lines[j:]), U), ("</think>\n\n", CONTEXT), ("Answer: ", CONTEXT), ("12", Y), share=0.25
        )
        for j in range(3)
    ]
    for after_line_end, exit_text in ((True, "</think>\n\n"), (False, "\n</think>\n\n")):
        last = _tail(qwen_tok, (exit_text, CONTEXT), ("Answer: ", CONTEXT), ("12", Y), share=0.25)
        assert tails([c], "suffix", scorer.tail_text, after_line_end) == [*expected, last]


@pytest.mark.parametrize("after_line_end", [True, False])
def test_solution_and_answer_tails(scorer, qwen_tok, after_line_end) -> None:
    (c,) = scorer.constructs([(_enc(qwen_tok, STEPS), _enc(qwen_tok, ANSWER))], SegmentationConfig().keywords, 8)
    exit_text = "</think>\n\n" if after_line_end else "\n</think>\n\n"
    solution = _tail(qwen_tok, (exit_text, CONTEXT), (STEPS, U), ("Answer: ", CONTEXT), ("12", Y))
    answer = _tail(qwen_tok, (exit_text, CONTEXT), ("Answer: ", CONTEXT), ("12", Y))
    assert tails([c], "solution", scorer.tail_text, after_line_end) == [solution]
    assert tails([c], "answer", scorer.tail_text, after_line_end) == [answer]


def test_a_newline_exit_string_vanishes_after_a_line_end(qwen_tok) -> None:
    scorer = Scorer(build_tiny_model("qwen3", seed=0), qwen_tok, "\n")
    (c,) = scorer.constructs([(_enc(qwen_tok, STEPS), _enc(qwen_tok, ANSWER))], SegmentationConfig().keywords, 8)
    answer_only = tails([c], "answer", scorer.tail_text, True)
    assert answer_only == [_tail(qwen_tok, ("Answer: ", CONTEXT), ("12", Y))]
    assert tails([c], "answer", scorer.tail_text, False)[0].ids[0] == _enc(qwen_tok, "\n")[0]


def test_a_pair_without_the_template_is_all_answer_and_an_empty_one_is_none(scorer, qwen_tok) -> None:
    """A group reference's answer part written without ``Answer:`` has no template to leave unscored:
    the whole of it is what the answer construct scores. An empty pair scores nothing: no reference."""
    ids = _enc(qwen_tok, "It is 84")
    (c,) = scorer.constructs([(ids, []), ([], [])], SegmentationConfig().keywords, 8)
    assert c == Construct((), (0,), (), tuple(ids))
    assert tails([c], "answer", scorer.tail_text, True) == [
        Tail.of([(scorer.tail_text.bare_exit_ids, CONTEXT), (ids, Y)])
    ]
    assert split_pair([], [], "Answer: ", [], 8) is None


def test_the_template_is_found_whatever_the_tokenizer_merged_after_it(qwen_tok) -> None:
    """``Answer:`` then one token holding the space and the number: the answer token is scored."""
    texts, ids = ["x", ".\n", "Answer", ":", " 12"], [1, 2, 3, 4, 5]
    assert split_pair(ids, texts, "Answer: ", [2], 8) == Construct((1, 2), (0, 2), (3, 4), (5,))


@given(
    st.lists(st.integers(-5, 60), max_size=40),
    st.integers(0, 50),
    st.integers(2, 12),
)
def test_suffix_starts_keep_both_ends_and_respect_the_cap(bounds, length, cap) -> None:
    starts = suffix_starts(bounds, length, cap)
    inner = sorted({b for b in bounds if 0 < b < length})
    assert starts[0] == 0 and list(starts) == sorted(set(starts))
    if length:
        assert starts[-1] == length and len(starts) == min(cap, len(inner) + 2)
        assert set(starts) <= {0, length, *inner}
    else:
        assert starts == (0,)


def test_nearest_starts_by_hand() -> None:
    starts = (0, 10, 20, 40)  # relative 0, 0.25, 0.5, 1
    assert nearest_starts(starts, 40, 0.0, 2) == (0, 10)
    assert nearest_starts(starts, 40, 0.6, 2) == (10, 20)  # |0.25 − 0.6| = 0.35 < |1 − 0.6| = 0.4
    assert nearest_starts(starts, 40, 0.75, 1) == (20,)  # a tie (0.5 and 1 both 0.25 away): the earlier
    assert nearest_starts(starts, 40, 1.0, 3) == (10, 20, 40)
    assert nearest_starts(starts, 40, 0.3, 0) == starts == nearest_starts(starts, 40, 0.3, 9)


@given(st.lists(st.integers(0, 60), min_size=1, max_size=12, unique=True), st.floats(0, 1), st.integers(1, 14))
def test_nearest_starts_keep_the_closest_in_order(starts, at, width) -> None:
    starts, length = tuple(sorted(starts)), max(starts) or 1
    kept = nearest_starts(starts, length, at, width)
    assert list(kept) == sorted(kept) and set(kept) <= set(starts) and len(kept) == min(width, len(starts))
    far = max(abs(k / length - at) for k in kept)
    assert all(abs(j / length - at) >= far - 1e-12 for j in set(starts) - set(kept))


def test_a_suffix_window_scores_the_starts_nearest_the_exit_each_of_share_one_over_w(scorer, qwen_tok) -> None:
    (c,) = scorer.constructs([(_enc(qwen_tok, STEPS), _enc(qwen_tok, ANSWER))], SegmentationConfig().keywords, 8)
    every = tails([c], "suffix", scorer.tail_text, True)  # 4 starts: 0, line 2, line 3, the end
    early = tails([c], "suffix", scorer.tail_text, True, at=0.0, window=2)
    late = tails([c], "suffix", scorer.tail_text, True, at=1.0, window=2)
    assert [t.ids for t in early] == [t.ids for t in every[:2]] and {t.share for t in early} == {0.5}
    assert [t.ids for t in late] == [t.ids for t in every[2:]] and {t.share for t in late} == {0.5}
