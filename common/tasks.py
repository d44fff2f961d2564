"""Synthetic arithmetic problems with step-by-step reference solutions (tests and the CPU demo).

Families: ``mul`` (a × b), ``add`` (a + b) and ``chain`` (``chain_steps`` operations applied left
to right, e.g. ``(7 + 5) × 3 - 4``). Every solution ends with the line ``Answer: N``, the format
the prompts ask for and the verifier reads.
"""

from __future__ import annotations

import numpy as np

from rredcot.common.config import DataConfig
from rredcot.common.data import Problem

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_problem(index: int, rng: np.random.Generator, cfg: DataConfig) -> Problem:
    lo, hi = cfg.operand_min, cfg.operand_max
    draw = lambda: int(rng.integers(lo, hi + 1))
    if cfg.task == "mul":
        ops = ["*"]
    elif cfg.task == "add":
        ops = ["+"]
    else:
        ops = [str(rng.choice(list(_OPS))) for _ in range(cfg.chain_steps)]
    operands = [draw() for _ in range(len(ops) + 1)]
    expr, value, steps = str(operands[0]), operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = _OPS[op](value, b)
        steps.append(f"{value} {op} {b} = {new}.")
        expr = f"({expr}) {op} {b}" if i else f"{expr} {op} {b}"
        value = new
    problem = f"What is {expr}?"
    solution = "\n".join(steps) + f"\nAnswer: {value}"
    return Problem(id=f"{cfg.task}-{index}", problem=problem, solution=solution, answer=str(value))


def synthetic_problems(cfg: DataConfig, seed: int = 0) -> list[Problem]:
    """``cfg.size`` distinct problems, deterministic in (seed, cfg)."""
    rng = np.random.default_rng([seed, 7919])
    seen: set[str] = set()
    out: list[Problem] = []
    misses = 0  # small operand ranges have fewer distinct problems than cfg.size
    while len(out) < cfg.size and misses < 2000:
        p = make_problem(len(out), rng, cfg)
        if p.problem in seen:
            misses += 1
            continue
        seen.add(p.problem)
        out.append(p)
        misses = 0
    return out
