"""A task from outside rredcot (``task.name: tests.extensions.double``): "What is twice N?".

The worked example of docs/extending.md. It generates its problems, keeps the base class's
``Answer: ...`` reading and reference split, and checks answers itself (exact integers, no
math-verify).
"""

from __future__ import annotations

from dataclasses import dataclass

from rredcot.common.config import DataConfig, bounded
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task


@dataclass
class DoubleSettings:
    largest: int = bounded(30, 1, 10**6)  # N runs over 1..largest


@TASKS.register("double")
class Double(Task):
    Settings = DoubleSettings
    instruction = "Solve the problem. Show your steps, then give the final line as 'Answer: <number>'."
    example = Problem(id="example", problem="What is twice 7?", solution="7 * 2 = 14.\nAnswer: 14", answer="14")

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return [
            Problem(
                id=f"double-{n}",
                problem=f"What is twice {n}?",
                solution=f"{n} * 2 = {2 * n}.\nAnswer: {2 * n}",
                answer=str(2 * n),
            )
            for n in range(1, self.settings.largest + 1)
        ]

    def answers_match(self, predicted: str, gold: str) -> bool:
        return predicted.strip().lstrip("+").isdigit() and int(predicted) == int(gold)
