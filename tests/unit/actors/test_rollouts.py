"""Verified rollout groups: a thought the chat template opened must be closed before an answer counts."""

from __future__ import annotations

import pytest

from rredcot.actors.engine import Completion, GroupOutput
from rredcot.actors.rollouts import rollout_group
from rredcot.common.config import load_config
from rredcot.tasks.data import Problem
from rredcot.tasks.task import build_task
from rredcot.tasks.verifier import Verifier

PROBLEM = Problem("p0", "What is 6 * 7?", "6 * 7 = 42.\nAnswer: 42", "42")


@pytest.fixture(scope="module")
def verifier():
    with Verifier.from_config(load_config("tests", [])) as v:
        yield v


def _verdicts(prompt: str, completions: list[str], tokenizer, verifier) -> list[str]:
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    outs = [Completion(encode(c), [0.0] * len(encode(c)), [(0, 0)], "stop") for c in completions]
    group = GroupOutput("g0", encode(prompt), outs, 0)
    record = rollout_group(group, PROBLEM, 0, "run", build_task(verifier.spec), tokenizer, verifier)
    return [s.verdict for s in record.samples]


def test_an_answer_in_a_thought_the_prompt_opened_and_never_closed_is_no_answer(qwen_tok, verifier):
    """DeepSeek-R1-Distill style: the template ends the prompt with <think>, so a completion holds
    only the closing tag. One that never closes it (stopped early) has only thinking: no answer."""
    opened = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    closed, unclosed = "6 * 7 = 42\n</think>\nAnswer: 42", "6 * 7 = 42\nAnswer: 42"
    assert _verdicts(opened, [closed, unclosed], qwen_tok, verifier) == ["correct", "no_answer"]
    plain = "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n"  # no thinking: the whole text
    assert _verdicts(plain, [unclosed], qwen_tok, verifier) == ["correct"]
