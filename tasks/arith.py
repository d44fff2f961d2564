"""``arith``: generated arithmetic problems with step-by-step reference solutions (tests, CPU demo).

Families (``task.settings.op``): ``mul`` (a × b), ``add`` (a + b) and ``chain`` (``chain_steps``
operations applied left to right, e.g. ``(7 + 5) × 3 - 4``, one line of working each: the credit
study's task, docs/study.md). Every solution ends with the line ``Answer: N``; answers are checked
like ``math``'s (math-verify).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rredcot.common.config import Config, ConfigError, DataConfig, bounded, choice
from rredcot.common.data import Problem
from rredcot.common.registry import TASKS
from rredcot.common.task import check_eval_fits
from rredcot.tasks.math import MathVerified

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass
class ArithSettings:
    op: str = choice("mul", "mul", "add", "chain")
    operand_min: int = bounded(2, 0)
    operand_max: int = bounded(12, 1)
    chain_steps: int = bounded(2, 1, 8)  # operations per problem for op=chain
    size: int = bounded(2000, 1)  # distinct problems generated (fewer if the operand range has fewer)


def make_problem(index: int, rng: np.random.Generator, s: ArithSettings) -> Problem:
    draw = lambda: int(rng.integers(s.operand_min, s.operand_max + 1))
    if s.op == "mul":
        ops = ["*"]
    elif s.op == "add":
        ops = ["+"]
    else:
        ops = [str(rng.choice(list(_OPS))) for _ in range(s.chain_steps)]
    operands = [draw() for _ in range(len(ops) + 1)]
    expr, value, steps = str(operands[0]), operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = _OPS[op](value, b)
        steps.append(f"{value} {op} {b} = {new}.")
        expr = f"({expr}) {op} {b}" if i else f"{expr} {op} {b}"
        value = new
    solution = "\n".join(steps) + f"\nAnswer: {value}"
    return Problem(id=f"{s.op}-{index}", problem=f"What is {expr}?", solution=solution, answer=str(value))


def generate(s: ArithSettings, seed: int) -> list[Problem]:
    """``s.size`` distinct problems, deterministic in (seed, settings)."""
    rng = np.random.default_rng([seed, 7919])
    seen: set[str] = set()
    out: list[Problem] = []
    misses = 0  # small operand ranges have fewer distinct problems than s.size
    while len(out) < s.size and misses < 2000:
        p = make_problem(len(out), rng, s)
        if p.problem in seen:
            misses += 1
            continue
        seen.add(p.problem)
        out.append(p)
        misses = 0
    return out


@TASKS.register("arith")
class Arith(MathVerified):
    Settings = ArithSettings

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return generate(self.settings, seed)

    @property
    def example(self) -> Problem | None:  # type: ignore[override]
        """The one-shot example in the family's own format: ``chain`` shows its lines of working (an
        example drawn apart from the problems); ``mul`` and ``add`` 7 * 8."""
        if self.settings.op == "chain":
            return make_problem(-1, np.random.default_rng([1, 7919]), self.settings)
        return MathVerified.example

    def check(self, cfg: Config) -> None:
        s = self.settings
        if s.operand_min > s.operand_max:
            raise ConfigError(
                f"task.settings.operand_min = {s.operand_min} is not allowed; expected <= "
                f"task.settings.operand_max ({s.operand_max})"
            )
        check_eval_fits(cfg, self.settings.size)
