"""Reading an answer: only after the thinking, never from a thought left open; in linear time."""

from __future__ import annotations

import subprocess
import sys

from rredcot.common.config import TaskConfig
from rredcot.tasks.task import answer_line, answer_text, build_task

MATH = build_task(TaskConfig("math"))
REVISED = "<think>\nSo the answer is: 12, hmm wait.\nActually 13.\n</think>\n\nThe result is \\boxed{13}."
TRUNCATED = "<think>\nLet me guess the answer: 84\nWait, check"


def _read(completion: str, think: tuple[str, str] = ("<think>", "</think>")) -> str | None:
    text = answer_text(completion, *think)
    return None if text is None else MATH.extract_answer(text)


def test_the_answer_is_read_after_the_thinking() -> None:
    """A guess inside the thinking is no answer: the whole completion gave '12, hmm wait' for the
    first and 84 (reward 1) for a truncated trace."""
    assert _read(REVISED) == "13" and MATH.extract_answer(REVISED) == "12, hmm wait"
    assert _read(TRUNCATED) is None and MATH.extract_answer(TRUNCATED) == "84"


def test_answer_text_by_hand() -> None:
    assert answer_text("<think>a</think>\nAnswer: 5", "<think>", "</think>") == "\nAnswer: 5"
    assert answer_text("Answer: 5", "<think>", "</think>") == "Answer: 5"  # no tags: the whole completion
    assert answer_text("x\n</think>Answer: 5", "<think>", "</think>") == "Answer: 5"  # the prompt opened it
    assert answer_text("<think>a</think>b<think>c", "<think>", "</think>") is None  # reopened, never closed
    assert answer_text("<think>a", "<think>", "</think>") is None
    assert answer_text("<think>a</think>", "<think>", "</think>") == ""  # closed, then nothing
    # the model's own tags (model.think_start / think_end), not the default ones
    assert _read("<r>Answer: 1</r>Answer: 2", ("<r>", "</r>")) == "2"
    assert _read("<r>Answer: 1", ("<r>", "</r>")) is None


SPACES = """
from rredcot.tasks.task import answer_line
print(answer_line("answer" + " " * 1_000_000 + "?"), answer_line("The answer is" + " " * 1_000_000 + "= 42"))
"""


def test_answer_line_is_linear_in_a_whitespace_run() -> None:
    """``answer\\s*(?:is)?\\s*[:=]`` backtracked quadratically on a run of spaces followed by no colon
    (16k spaces: 1.2 s; this million: over an hour), in the generator outside the verifier's
    timeout. The child must finish well within the limit and read both lines right."""
    out = subprocess.run([sys.executable, "-c", SPACES], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "42"]
    assert answer_line("The answer is  :  7.") == "7" and answer_line("answeris=3") == "3"


def test_answer_line_drops_markdown_emphasis() -> None:
    assert answer_line("Answer: **56**") == "56" and answer_line("**Answer:** 56") == "56"
    assert answer_line("Answer: __56__.") == "56" and answer_line("Answer: *56*") == "56"
    assert answer_line("Answer: **56.**") == "56" and answer_line("answer: **3/4**") == "3/4"


def test_an_answer_line_without_a_letter_or_digit_leaves_the_box() -> None:
    """``**Final Answer:**`` over a displayed box read as the answer ``**``, a bare ``Final Answer:``
    as an empty one: the ``\\boxed{}`` fallback was never reached and the right answer scored 0."""
    assert answer_line("**Final Answer:**\n\\[\n\\boxed{42}\n\\]") is None
    assert answer_line("Final Answer: \n\\boxed{42}") is None and answer_line("Answer: $ ** $") is None
    assert MATH.extract_answer("**Final Answer:**\n\\[\n\\boxed{42}\n\\]") == "42"
    assert MATH.extract_answer("Final Answer: \n\\boxed{42}") == "42"
    assert answer_line("Answer: x") == "x" and answer_line("Answer: (B)") == "(B)"
