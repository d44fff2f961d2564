"""``arith``: generated arithmetic problems with step-by-step reference solutions (tests, CPU demo).

Families (``task.settings.op``): ``mul`` (a × b), ``add`` (a + b) and ``chain`` (``chain_steps``
operations applied left to right, e.g. ``(7 + 5) × 3 - 4``, one line of working each: the credit
study's task, docs/study.md). Every solution ends with the line ``Answer: N``; an answer is right
when it is that integer written as a number (``56``, ``**56**``, ``$56$``, ``1,024``), never an
expression (``7 * 8``: the question copied). ``a × b`` and ``b × a`` are one problem (``key``), so the
held-out split shares none with training, and the prompt's example is none of the problems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from rredcot.common.config import Config, ConfigError, DataConfig, bounded, choice
from rredcot.common.data import Problem
from rredcot.common.registry import TASKS
from rredcot.common.task import check_eval_fits
from rredcot.tasks.math import MathVerified

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_FAMILY_OP = {"mul": "*", "add": "+"}
_COMMUTATIVE = {"+", "*"}
_PROBLEM_STREAM = 7919  # problems: default_rng([seed, 7919])
_EXAMPLE_STREAM = [0, 7907]  # chain's one-shot example: not [seed, 7919], so never a problem stream
_MINUS = "\u2212"  # the unicode minus sign, as some models write it
_INTEGER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)")  # 56, -5, 1,024

Draw = tuple[tuple[str, ...], tuple[int, ...]]  # one problem: its operations and its operands


@dataclass
class ArithSettings:
    op: str = choice("mul", "mul", "add", "chain")
    operand_min: int = bounded(2, 0)
    operand_max: int = bounded(12, 1)
    chain_steps: int = bounded(2, 1, 8)  # operations per problem for op=chain
    size: int = bounded(2000, 1)  # distinct problems generated (fewer if the settings make fewer)


def draw(rng: np.random.Generator, s: ArithSettings) -> Draw:
    """One problem of ``s``'s family: its operations, then its operands, drawn from ``rng``."""
    chain = s.op == "chain"
    ops = tuple(str(rng.choice(list(_OPS))) for _ in range(s.chain_steps)) if chain else (_FAMILY_OP[s.op],)
    return ops, tuple(int(rng.integers(s.operand_min, s.operand_max + 1)) for _ in range(len(ops) + 1))


def key(ops: tuple[str, ...], operands: tuple[int, ...]) -> Draw:
    """What makes two problems one: a commutative first operation's operands in order, so
    ``a × b`` and ``b × a`` (or ``(a + b) - c`` and ``(b + a) - c``) are the same problem."""
    if ops[0] in _COMMUTATIVE:
        operands = (*sorted(operands[:2]), *operands[2:])
    return ops, operands


def example_draw(s: ArithSettings) -> Draw:
    """The one-shot example: ``chain`` draws one in its own format from a stream of its own; ``mul``
    and ``add`` show 7 * 8."""
    if s.op == "chain":
        return draw(np.random.default_rng(_EXAMPLE_STREAM), s)
    return ("*",), (7, 8)


def distinct_problems(s: ArithSettings) -> int:
    """How many different problems (``key``s) ``s`` can make, less the one-shot example's."""
    n = s.operand_max - s.operand_min + 1
    first_pairs = {"+": n * (n + 1) // 2, "*": n * (n + 1) // 2, "-": n * n}  # a commutative pair counts once
    if s.op == "chain":
        space = sum(first_pairs.values()) * (3 * n) ** (s.chain_steps - 1)
    else:
        space = first_pairs[_FAMILY_OP[s.op]]
    ops, operands = example_draw(s)
    family = len(ops) == s.chain_steps if s.op == "chain" else ops == (_FAMILY_OP[s.op],)
    example_is_one = family and all(s.operand_min <= v <= s.operand_max for v in operands)
    return space - int(example_is_one)


def make_problem(problem_id: str, ops: tuple[str, ...], operands: tuple[int, ...]) -> Problem:
    expr, value, steps = str(operands[0]), operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = _OPS[op](value, b)
        steps.append(f"{value} {op} {b} = {new}.")
        expr = f"({expr}) {op} {b}" if i else f"{expr} {op} {b}"
        value = new
    solution = "\n".join(steps) + f"\nAnswer: {value}"
    return Problem(id=problem_id, problem=f"What is {expr}?", solution=solution, answer=str(value))


def generate(s: ArithSettings, seed: int) -> list[Problem]:
    """``s.size`` problems (all ``distinct_problems`` if fewer), no two with one ``key`` and none the
    one-shot example's, deterministic in (seed, settings)."""
    rng = np.random.default_rng([seed, _PROBLEM_STREAM])
    seen = {key(*example_draw(s))}
    out: list[Problem] = []
    wanted = min(s.size, distinct_problems(s))
    while len(out) < wanted:
        ops, operands = draw(rng, s)
        if key(ops, operands) not in seen:
            seen.add(key(ops, operands))
            out.append(make_problem(f"{s.op}-{len(out)}", ops, operands))
    return out


def as_integer(answer: str) -> int | None:
    """The integer an answer states as a literal (``56``, ``$-5$``, ``1,024``, ``\u22123``), else None:
    an expression (``7 * 8``) is no answer, or copying the question would score."""
    found = _INTEGER.fullmatch(answer.strip().rstrip(".").strip(" $*").rstrip("."))
    return int(found[0].replace(",", "").replace(_MINUS, "-")) if found else None


@TASKS.register("arith")
class Arith(MathVerified):
    Settings = ArithSettings

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return generate(self.settings, seed)

    @property
    def example(self) -> Problem | None:  # type: ignore[override]
        """The one-shot example in the family's own format (``example_draw``), never a problem."""
        return make_problem("example", *example_draw(self.settings))

    def answers_match(self, predicted: str, gold: str) -> bool:
        """Equal integers, the prediction written as a number (``as_integer``)."""
        found = as_integer(predicted)
        return found is not None and found == as_integer(gold)

    def check(self, cfg: Config) -> None:
        s = self.settings
        if s.operand_min > s.operand_max:
            raise ConfigError(
                f"task.settings.operand_min = {s.operand_min} is not allowed; expected <= "
                f"task.settings.operand_max ({s.operand_max})"
            )
        check_eval_fits(cfg, s.size, distinct_problems(s))
