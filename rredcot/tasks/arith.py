"""``arith``: generated arithmetic problems with step-by-step reference solutions (tests, CPU demo).

Families (``task.settings.op``): ``mul`` (a × b), ``add`` (a + b) and ``chain`` (``chain_steps``
operations applied left to right, e.g. ``(7 + 5) × 3 - 4``, one line of working each: the credit
study's task, docs/study.md; its layouts, phrasings and checker are ``rredcot/tasks/chain.py``). Every
solution ends with the line ``Answer: N``; an answer is right when it is that integer written as a
number (``56``, ``**56**``, ``$56$``, ``1,024``), never an expression (``7 * 8``: the question
copied). ``a × b`` and ``b × a`` are one problem (``key``), so the held-out split shares none with
training, and the prompt's example is none of the problems.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rredcot.common.config import COUNT_MAX, PROBLEMS_MAX, Config, ConfigError, DataConfig, bounded, choice
from rredcot.common.registry import TASKS
from rredcot.tasks.chain import (
    COMMUTATIVE,
    LAYOUTS,
    OPS,
    PHRASINGS,
    Draw,
    chain_lines,
    checked_steps,
    count_bounded,
    draw_bounded,
    first_slip,
    question,
)
from rredcot.tasks.data import Problem
from rredcot.tasks.math import MathVerified
from rredcot.tasks.task import check_eval_fits

_FAMILY_OP = {"mul": "*", "add": "+"}
_PROBLEM_STREAM = 7919  # problems: default_rng([seed, 7919])
_PHRASING_STREAM = 7927  # the phrasing of each line of a reference solution: default_rng([seed, 7927])
_EXAMPLE_STREAM = [0, 7907]  # chain's one-shot example: not [seed, 7919], so never a problem stream
_MINUS = "\u2212"  # the unicode minus sign, as some models write it
_INTEGER = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)")  # 56, -5, 1,024


@dataclass
class ArithSettings:
    op: str = choice("mul", "mul", "add", "chain")
    operand_min: int = bounded(2, 0, COUNT_MAX)
    operand_max: int = bounded(12, 1, COUNT_MAX)
    chain_steps: int = bounded(2, 1, 16)  # operations per problem for op=chain
    layout: str = choice("nested", *LAYOUTS)  # op=chain: the question's layout (rredcot/tasks/chain.py)
    phrasings: int = bounded(1, 1, len(PHRASINGS))  # op=chain: reference lines phrased in the first N ways
    value_max: int = bounded(0, 0, COUNT_MAX)  # op=chain: keep the running value in [0, value_max] (0: any)
    think: bool = False  # solutions (and the one-shot example) write their working inside <think> tags
    size: int = bounded(2000, 1, PROBLEMS_MAX)  # distinct problems generated (fewer if the settings make fewer)


def draw(rng: np.random.Generator, s: ArithSettings) -> Draw:
    """One problem of ``s``'s family: its operations, then its operands, drawn from ``rng``."""
    if s.op == "chain" and s.value_max:
        return draw_bounded(rng, s.chain_steps, s.operand_min, s.operand_max, s.value_max)
    chain = s.op == "chain"
    ops = tuple(str(rng.choice(list(OPS))) for _ in range(s.chain_steps)) if chain else (_FAMILY_OP[s.op],)
    return ops, tuple(int(rng.integers(s.operand_min, s.operand_max + 1)) for _ in range(len(ops) + 1))


def key(ops: tuple[str, ...], operands: tuple[int, ...], layout: str = "nested") -> Draw:
    """What makes two problems one: a commutative first operation's operands in order, so
    ``a × b`` and ``b × a`` (or ``(a + b) - c`` and ``(b + a) - c``) are the same problem; a
    ``steps`` question names its start, so it has no twin."""
    if ops[0] in COMMUTATIVE and layout == "nested":
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
    if s.op == "chain" and s.value_max:
        space = count_bounded(s.chain_steps, s.operand_min, s.operand_max, s.value_max, s.layout == "nested")
    elif s.op == "chain":
        first = sum(first_pairs.values()) if s.layout == "nested" else 3 * n * n
        space = first * (3 * n) ** (s.chain_steps - 1)
    else:
        space = first_pairs[_FAMILY_OP[s.op]]
    ops, operands = example_draw(s)
    family = len(ops) == s.chain_steps if s.op == "chain" else ops == (_FAMILY_OP[s.op],)
    in_range = all(s.operand_min <= v <= s.operand_max for v in operands)
    return space - int(family and in_range)


def solution_text(lines: Sequence[str], value: int, think: bool) -> str:
    """The lines of working and the answer line; inside ``<think>`` tags with ``think``."""
    body = "\n".join(lines)
    return f"<think>\n{body}\n</think>\n\nAnswer: {value}" if think else f"{body}\nAnswer: {value}"


def make_problem(
    problem_id: str,
    ops: tuple[str, ...],
    operands: tuple[int, ...],
    think: bool = False,
    layout: str = "nested",
    phrasings: Sequence[int] | None = None,
) -> Problem:
    """A problem and its reference solution (each line in ``phrasings``' phrasing, default the first)."""
    lines, value = chain_lines(ops, operands, phrasings=phrasings, labelled=layout == "steps")
    return Problem(
        id=problem_id,
        problem=question(ops, operands, layout),
        solution=solution_text(lines, value, think),
        answer=str(value),
    )


def generate(s: ArithSettings, seed: int) -> list[Problem]:
    """``s.size`` problems (all ``distinct_problems`` if fewer), no two with one ``key`` and none the
    one-shot example's, deterministic in (seed, settings); with ``phrasings`` > 1 each line of a
    reference solution is phrased in one of the first ``phrasings`` ways (its own stream)."""
    rng = np.random.default_rng([seed, _PROBLEM_STREAM])
    words = np.random.default_rng([seed, _PHRASING_STREAM])
    seen = {key(*example_draw(s), s.layout)}
    out: list[Problem] = []
    wanted = min(s.size, distinct_problems(s))
    while len(out) < wanted:
        ops, operands = draw(rng, s)
        if key(ops, operands, s.layout) not in seen:
            seen.add(key(ops, operands, s.layout))
            phrasings = words.integers(0, s.phrasings, len(ops)).tolist() if s.phrasings > 1 else None
            out.append(make_problem(f"{s.op}-{len(out)}", ops, operands, s.think, s.layout, phrasings))
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
        s = self.settings
        return make_problem("example", *example_draw(s), s.think, s.layout)

    def reference(self, problem: Problem) -> tuple[str, str]:
        """(u, y) as ``Task.reference``; with ``think`` u is the working inside the tags (a branch
        continues the thinking with it, then closes the thought: docs/credit.md)."""
        u, y = super().reference(problem)
        if self.settings.think:
            u = u.removeprefix("<think>\n").split("\n</think>")[0] + "\n"
        return u, y

    @property
    def checks_slips(self) -> bool:
        """A chain's lines of working are checked step by step (``first_slip``)."""
        return self.settings.op == "chain"

    def first_slip(self, problem: Problem, lines: Sequence[str]) -> int | None:
        return first_slip(problem, lines)

    def checked_steps(self, lines: Sequence[str]) -> list[tuple[str, bool]]:
        return checked_steps(lines)

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
        if s.op != "chain" and (s.layout, s.phrasings, s.value_max) != ("nested", 1, 0):
            raise ConfigError(
                f"task.settings.op = {s.op!r}: task.settings.layout, phrasings and value_max shape chains only; "
                "expected op=chain, or their defaults (nested, 1, 0)"
            )
        if s.value_max and s.value_max < s.operand_min:
            raise ConfigError(
                f"task.settings.value_max = {s.value_max} is not allowed; expected 0 (any value) or >= "
                f"task.settings.operand_min ({s.operand_min}), the smallest start"
            )
        check_eval_fits(cfg, s.size, distinct_problems(s))
