"""A task every completion solves (``task.name: tests.extensions.always_right``): whatever a tiny
random model writes is a correct answer, so a test can see what the run does with solved groups
(dynamic sampling's drops, ``generation.retire_solved``) on a real engine and verifier."""

from __future__ import annotations

from rredcot.common.config import DataConfig
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task


@TASKS.register("always_right")
class AlwaysRight(Task):
    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return [Problem(id=f"r-{n}", problem=f"Say {n}.", solution=f"Answer: {n}", answer=str(n)) for n in range(6)]

    def extract_answer(self, completion: str) -> str | None:
        return completion or "(empty)"

    def answers_match(self, predicted: str, gold: str) -> bool:
        return True
