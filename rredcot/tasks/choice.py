"""``choice``: generated multiple-choice questions whose answer is a letter, not a number.

"Which of these numbers is the largest (or smallest)?" with ``options`` lettered choices. The
answer is read from the last ``Answer: ...`` line as the last of the question's option letters
standing alone there (``C``, ``(C)``, ``C) 30``, ``c``; a capital one preferred: ``I think it is
B`` and ``A is smaller, so B`` give B) and must equal the gold letter. It shows the task interface
on a non-numeric answer: no math-verify involved.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

import numpy as np

from rredcot.common.config import COUNT_MAX, PROBLEMS_MAX, Config, DataConfig, bounded
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task, answer_line, check_eval_fits

_LETTER = re.compile(r"\b([A-Za-z])\b")  # a letter standing alone: C, (C), C) 30, c


@dataclass
class ChoiceSettings:
    options: int = bounded(4, 2, 8)  # choices per question
    value_max: int = bounded(99, 9, COUNT_MAX)  # choices are distinct integers in [0, value_max]
    size: int = bounded(2000, 1, PROBLEMS_MAX)


def make_question(index: int, rng: np.random.Generator, s: ChoiceSettings) -> Problem:
    values = [int(v) for v in rng.choice(s.value_max + 1, size=s.options, replace=False)]
    largest = bool(rng.integers(2))
    best = max(values) if largest else min(values)
    letters = string.ascii_uppercase[: s.options]
    gold = letters[values.index(best)]
    which = "largest" if largest else "smallest"
    lines = [f"{letter}) {v}" for letter, v in zip(letters, values)]
    solution = f"The choices are {', '.join(map(str, values))}. The {which} is {best}, choice {gold}.\nAnswer: {gold}"
    question = f"Which of these numbers is the {which}?\n" + "\n".join(lines)
    return Problem(id=f"choice-{index}", problem=question, solution=solution, answer=gold)


@TASKS.register("choice")
class Choice(Task):
    Settings = ChoiceSettings
    instruction = "Answer the question. Think briefly, then give the final line as 'Answer: <letter>'."
    example = Problem(
        id="example",
        problem="Which of these numbers is the largest?\nA) 4\nB) 17\nC) 9",
        solution="The choices are 4, 17, 9. The largest is 17, choice B.\nAnswer: B",
        answer="B",
    )

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        rng = np.random.default_rng([seed, 104729])
        return [make_question(i, rng, self.settings) for i in range(self.settings.size)]

    def check(self, cfg: Config) -> None:
        check_eval_fits(cfg, self.settings.size)

    def extract_answer(self, completion: str) -> str | None:
        """The last option letter standing alone on the answer line, in capitals; a capital one is
        preferred, so the article in ``B is a bigger number`` is not option A."""
        options = string.ascii_uppercase[: self.settings.options]
        found = [c for c in _LETTER.findall(answer_line(completion) or "") if c.upper() in options]
        capitals = [c for c in found if c.isupper()]
        return (capitals or found)[-1].upper() if found else None
