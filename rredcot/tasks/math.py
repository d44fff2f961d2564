"""``math``: competition-style problems from a dataset, answers checked by math-verify.

Rows come from ``data.source`` / ``data.path`` (jsonl, parquet, Hugging Face datasets) with the
column conventions of Numina-CoT and open-rs (``tasks.data``). The final answer is the last
``Answer: ...`` line of a completion (markdown emphasis around it dropped), else its last
``\\boxed{}``; it matches the gold answer when math-verify finds them equivalent (``1/2`` = ``0.5`` =
``\\frac{1}{2}``; words after a number are units: ``20 dollars`` = ``20``).
"""

from __future__ import annotations

import re

from rredcot.common.config import DataConfig
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem, last_boxed, load_rows
from rredcot.tasks.task import Task, answer_line

# a number, then plain words to the end (``20 dollars``, ``3/4 square feet``); the first word has two
# letters or more, so ``2 x`` stays algebra
_UNITS = re.compile(r"(.*[\d})\]])\s+([A-Za-z]{2,}(?:\s+[A-Za-z]+)*)")


def _as_math(answer: str) -> str:
    """``answer`` as math-verify should read it: in ``$…$`` (else ``(3, 4)`` is read as its last
    number), and units after a number as ``\\text{}`` (else ``20 dollars`` is a product of letters)."""
    if "\\boxed" in answer or answer.startswith("$"):
        return answer
    units = _UNITS.fullmatch(answer)
    return f"${units[1]} \\text{{{units[2]}}}$" if units else f"${answer}$"


class MathVerified(Task):
    """Answers on an ``Answer:`` line or in ``\\boxed{}``, compared by math-verify."""

    instruction = "Solve the problem. Show your steps, then give the final line as 'Answer: <number>'."
    example = Problem(id="example", problem="What is 7 * 8?", solution="7 * 8 = 56.\nAnswer: 56", answer="56")

    def extract_answer(self, completion: str) -> str | None:
        found = answer_line(completion)
        return found if found is not None else last_boxed(completion)

    def answers_match(self, predicted: str, gold: str) -> bool:
        from math_verify import parse, verify

        return bool(verify(parse(_as_math(gold)), parse(_as_math(predicted))))


@TASKS.register("math")
class Math(MathVerified):
    """Problems read from the configured dataset."""

    reads_dataset = True

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return load_rows(data)

    def first_problems(self, data: DataConfig, seed: int, n: int) -> list[Problem]:
        return load_rows(data, limit=n)
