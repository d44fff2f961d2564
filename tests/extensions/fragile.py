"""A task whose checker misbehaves on purpose (``task.name: tests.extensions.fragile``): the answer
``crash`` kills the verifier's process, ``hang`` never returns, ``raise`` raises, and ``nan``,
``-inf``, ``0.3``, ``no`` and ``yes`` are returned as they are (a float, or a string), not as a bool;
other answers are compared as the base task compares them."""

from __future__ import annotations

import os
import time

from rredcot.common.config import DataConfig
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task

NOT_BOOLS: dict[str, object] = {"nan": float("nan"), "-inf": float("-inf"), "0.3": 0.3, "no": "no", "yes": "yes"}


@TASKS.register("fragile")
class Fragile(Task):
    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return [Problem(id=f"f-{n}", problem=f"Say {n}.", solution=f"Answer: {n}", answer=str(n)) for n in range(9)]

    def answers_match(self, predicted: str, gold: str) -> bool:  # type: ignore[override]  # misbehaves
        if predicted == "crash":
            os._exit(3)
        if predicted == "hang":
            time.sleep(3600)
        if predicted == "raise":
            raise ArithmeticError("the checker failed")
        if predicted in NOT_BOOLS:
            return NOT_BOOLS[predicted]
        return super().answers_match(predicted, gold)
