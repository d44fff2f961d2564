"""What the scorer reads from a record's ids, by hand on the real Qwen3 tokenizer and a tiny model."""

from __future__ import annotations

import pytest

from rredcot.common.config import ScorerConfig
from rredcot.common.records import RecordError
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.scorer import Scorer
from tests.factories import rollout_group

VOCAB = 151_669  # the tiny Qwen3's, the tokenizer's


@pytest.fixture(scope="module")
def scorer(qwen_tok) -> Scorer:
    return Scorer(build_tiny_model("qwen3"), qwen_tok, ScorerConfig().exit_string)


@pytest.mark.parametrize(
    ("where", "value", "name"),
    [
        (lambda g: g.prompt_ids, -1, "prompt_ids"),
        (lambda g: g.samples[2].completion_ids, VOCAB, r"samples\[2\].completion_ids"),
        (lambda g: g.ref_solution_ids[0], VOCAB + 50, r"ref_solution_ids\[0\]"),
        (lambda g: g.ref_answer_ids[0], -7, r"ref_answer_ids\[0\]"),
    ],
)
def test_ids_outside_the_vocabulary_are_the_records_fault(scorer, where, value, name) -> None:
    group = rollout_group()
    scorer.check_ids(group)  # every id in [0, VOCAB)
    where(group)[1] = value
    with pytest.raises(
        RecordError, match=rf"^{name} holds token id {value}, outside the scorer's vocabulary \[0, {VOCAB}\)"
    ):
        scorer.check_ids(group)


def test_content_end_and_an_opened_thought(scorer, qwen_tok) -> None:
    enc = lambda t: qwen_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert scorer.content_end(enc("Answer<|im_end|><|endoftext|>")) == 1  # every trailing end token
    assert scorer.content_end(enc("<|im_end|>Answer")) == 2 and scorer.content_end([]) == 0
    assert scorer.opens_thought(enc("<|im_start|>assistant\n<think>\n"))  # DeepSeek-R1-Distill's template
    assert not scorer.opens_thought(enc("<|im_start|>assistant\n"))
