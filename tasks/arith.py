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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rredcot.common.config import COUNT_MAX, PROBLEMS_MAX, Config, ConfigError, DataConfig, bounded, choice
from rredcot.common.registry import TASKS
from rredcot.tasks.data import Problem
from rredcot.tasks.math import MathVerified
from rredcot.tasks.task import check_eval_fits

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_FAMILY_OP = {"mul": "*", "add": "+"}
_COMMUTATIVE = {"+", "*"}
_PROBLEM_STREAM = 7919  # problems: default_rng([seed, 7919])
_EXAMPLE_STREAM = [0, 7907]  # chain's one-shot example: not [seed, 7919], so never a problem stream
_MINUS = "\u2212"  # the unicode minus sign, as some models write it
_INTEGER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)")  # 56, -5, 1,024
_STEP = re.compile(r"(-?\d+) ?([-+*]) ?(-?\d+) ?= ?(-?\d+)\.?")  # one line of chain working

Draw = tuple[tuple[str, ...], tuple[int, ...]]  # one problem: its operations and its operands


@dataclass
class ArithSettings:
    op: str = choice("mul", "mul", "add", "chain")
    operand_min: int = bounded(2, 0, COUNT_MAX)
    operand_max: int = bounded(12, 1, COUNT_MAX)
    chain_steps: int = bounded(2, 1, 8)  # operations per problem for op=chain
    think: bool = False  # solutions (and the one-shot example) write their working inside <think> tags
    size: int = bounded(2000, 1, PROBLEMS_MAX)  # distinct problems generated (fewer if the settings make fewer)


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


def chain_lines(
    ops: Sequence[str], operands: Sequence[int], slip_at: int | None = None, delta: int = 0
) -> tuple[list[str], int]:
    """The lines of working ``a op b = c.`` of a problem and the value they end at; with
    ``slip_at`` = j, line j's result is off by ``delta`` and every later line works on from the slip
    (what a chain looks like when one step goes wrong)."""
    value, lines = operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = _OPS[op](value, b) + (delta if i == slip_at else 0)
        lines.append(f"{value} {op} {b} = {new}.")
        value = new
    return lines, value


def solution_text(lines: Sequence[str], value: int, think: bool) -> str:
    """The lines of working and the answer line; inside ``<think>`` tags with ``think``."""
    body = "\n".join(lines)
    return f"<think>\n{body}\n</think>\n\nAnswer: {value}" if think else f"{body}\nAnswer: {value}"


def make_problem(problem_id: str, ops: tuple[str, ...], operands: tuple[int, ...], think: bool = False) -> Problem:
    expr = str(operands[0])
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        expr = f"({expr}) {op} {b}" if i else f"{expr} {op} {b}"
    lines, value = chain_lines(ops, operands)
    return Problem(
        id=problem_id, problem=f"What is {expr}?", solution=solution_text(lines, value, think), answer=str(value)
    )


def parse_chain(problem: Problem) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A chain problem's operations and operands, read back from its question."""
    tokens = re.findall(r"\d+|[-+*]", problem.problem)
    return tuple(tokens[1::2]), tuple(int(t) for t in tokens[0::2])


def first_slip(problem: Problem, lines: Sequence[str]) -> int | None:
    """The index of the first working line that is not the chain's next step done right, the step
    taken from the trace's own previous result (so lines that carry a slip forward are no new slip):
    a line that does not read ``a op b = c.``, the wrong operation or operand, or a wrong result.
    ``len(lines)`` when every line is right but steps are missing; None when every step is there and
    right (a wrong answer then lies in the answer line, not the working)."""
    ops, operands = parse_chain(problem)
    value = operands[0]
    for i, line in enumerate(lines):
        m = _STEP.fullmatch(line.strip())
        if i >= len(ops) or m is None:
            return i
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        if (a, op, b) != (value, ops[i], operands[i + 1]) or c != _OPS[op](a, b):
            return i
        value = c
    return len(lines) if len(lines) < len(ops) else None


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
            out.append(make_problem(f"{s.op}-{len(out)}", ops, operands, s.think))
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
        return make_problem("example", *example_draw(self.settings), self.settings.think)

    def reference(self, problem: Problem) -> tuple[str, str]:
        """(u, y) as ``Task.reference``; with ``think`` u is the working inside the tags (a branch
        continues the thinking with it, then closes the thought: docs/credit.md)."""
        u, y = super().reference(problem)
        if self.settings.think:
            u = u.removeprefix("<think>\n").split("\n</think>")[0] + "\n"
        return u, y

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
