"""The chain family of ``arith`` (``op: chain``): operations applied left to right, one line of working
each, and the checker that names a trace's first wrong line (the credit study's ground truth,
docs/study.md).

Two layouts of the question: ``nested`` (``What is ((7 + 5) * 3) - 4?``, up to 8 steps reads well)
and ``steps`` (``Start with 7.`` then ``Step 1: + 5`` … one per line, so a 16-step chain is as easy
to read as a 2-step one; its lines of working say which step they take: ``Step 1: 7 + 5 = 12.``).
A line of working is written in one of ``PHRASINGS`` (the same step in other words), so two samples
of one prompt that phrase a line differently part there, even when both are right. With
``value_max`` every step keeps the running value in [0, value_max] (small numbers however long the
chain).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache

import numpy as np

from rredcot.tasks.data import Problem

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
COMMUTATIVE = frozenset("+*")
WORDS = {"+": "plus", "-": "minus", "*": "times"}
LAYOUTS = ("nested", "steps")
# the same step in other words; {a} op {b} is the step, {c} its result
PHRASINGS = ("{a} {op} {b} = {c}.", "{a} {word} {b} is {c}.", "{a} {op} {b} gives {c}.")
_N = r"(-?\d+)"
_LABEL = r"(?:Step (\d+): )?"
_READ = (  # one pattern per phrasing: (label, a, op, b, c)
    re.compile(rf"{_LABEL}{_N} ?([-+*]) ?{_N} ?= ?{_N}\.?"),
    re.compile(rf"{_LABEL}{_N} (plus|minus|times) {_N} is {_N}\.?"),
    re.compile(rf"{_LABEL}{_N} ([-+*]) {_N} gives {_N}\.?"),
)
_SYMBOL = {word: op for op, word in WORDS.items()} | {op: op for op in OPS}
_NESTED_TOKENS = re.compile(r"\d+|[-+*]")
_START = re.compile(r"Start with (\d+)\.")
_STEP_ASKED = re.compile(r"Step \d+: ([-+*]) (\d+)")

Draw = tuple[tuple[str, ...], tuple[int, ...]]  # one problem: its operations and its operands


def draw_bounded(rng: np.random.Generator, steps: int, lo: int, hi: int, value_max: int) -> Draw:
    """A chain whose running value stays in [0, value_max]: the start from [lo, min(hi, value_max)],
    then each step's operation uniformly among those that some operand in [lo, hi] keeps in range,
    and its operand uniformly among those."""
    value = int(rng.integers(lo, min(hi, value_max) + 1))
    ops, operands = [], [value]
    for _ in range(steps):
        allowed = {op: [b for b in range(lo, hi + 1) if 0 <= f(value, b) <= value_max] for op, f in OPS.items()}
        op = str(rng.choice([o for o, bs in allowed.items() if bs]))
        b = int(rng.choice(allowed[op]))
        ops.append(op)
        operands.append(b)
        value = OPS[op](value, b)
    return tuple(ops), tuple(operands)


@cache
def count_bounded(steps: int, lo: int, hi: int, value_max: int, merge_commutative: bool = False) -> int:
    """How many chains ``draw_bounded`` can make (paths over the values in [0, value_max]); with
    ``merge_commutative``, a first step ``a op b`` and ``b op a`` of a commutative op count once (the
    nested layout's ``key``: ``7 + 5`` is ``5 + 7``)."""
    firsts: dict[tuple[str, int, int], int] = {}  # the first step's (op, a, b) -> its value
    for a in range(lo, min(hi, value_max) + 1):
        for op, f in OPS.items():
            for b in range(lo, hi + 1):
                if 0 <= f(a, b) <= value_max:
                    pair = sorted((a, b)) if merge_commutative and op in COMMUTATIVE else (a, b)
                    firsts[(op, *pair)] = f(a, b)
    paths = np.zeros(value_max + 1, dtype=object)
    for value in firsts.values():
        paths[value] += 1
    for _ in range(steps - 1):
        nxt = np.zeros_like(paths)
        for v in np.flatnonzero(paths):
            for f in OPS.values():
                for b in range(lo, hi + 1):
                    if 0 <= f(int(v), b) <= value_max:
                        nxt[f(int(v), b)] += paths[v]
        paths = nxt
    return int(paths.sum())


def question(ops: Sequence[str], operands: Sequence[int], layout: str) -> str:
    """The problem's text in ``layout`` (``LAYOUTS``)."""
    if layout == "steps":
        asked = "".join(f"Step {i + 1}: {op} {b}\n" for i, (op, b) in enumerate(zip(ops, operands[1:])))
        return f"Start with {operands[0]}.\n{asked}What is the result?"
    expr = str(operands[0])
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        expr = f"({expr}) {op} {b}" if i else f"{expr} {op} {b}"
    return f"What is {expr}?"


def parse_chain(problem: Problem) -> Draw:
    """A chain problem's operations and operands, read back from its question (either layout)."""
    start = _START.match(problem.problem)
    if start:
        asked = _STEP_ASKED.findall(problem.problem)
        return tuple(op for op, _ in asked), (int(start[1]), *(int(b) for _, b in asked))
    tokens = _NESTED_TOKENS.findall(problem.problem)
    return tuple(tokens[1::2]), tuple(int(t) for t in tokens[0::2])


def step_line(i: int, a: int, op: str, b: int, c: int, phrasing: int = 0, labelled: bool = False) -> str:
    """Line ``i`` of working, ``a op b = c`` in ``PHRASINGS[phrasing]``; ``labelled``: ``Step i+1: …``."""
    text = PHRASINGS[phrasing].format(a=a, op=op, word=WORDS[op], b=b, c=c)
    return f"Step {i + 1}: {text}" if labelled else text


def chain_lines(
    ops: Sequence[str],
    operands: Sequence[int],
    slip_at: int | None = None,
    delta: int = 0,
    phrasings: Sequence[int] | None = None,
    labelled: bool = False,
) -> tuple[list[str], int]:
    """The lines of working of a problem and the value they end at; with ``slip_at`` = j, line j's
    result is off by ``delta`` and every later line works on from the slip (what a chain looks like
    when one step goes wrong). ``phrasings``: each line's ``PHRASINGS`` index (default 0)."""
    value, lines = operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = OPS[op](value, b) + (delta if i == slip_at else 0)
        lines.append(step_line(i, value, op, b, new, phrasings[i] if phrasings else 0, labelled))
        value = new
    return lines, value


def read_step(line: str) -> tuple[int | None, int, str, int, int] | None:
    """(step label or None, a, op, b, c) of a line of working in any phrasing; None if it is none."""
    for pattern in _READ:
        m = pattern.fullmatch(line.strip())
        if m:
            return (int(m[1]) if m[1] else None), int(m[2]), _SYMBOL[m[3]], int(m[4]), int(m[5])
    return None


def first_slip(problem: Problem, lines: Sequence[str]) -> int | None:
    """The index of the first working line that is not the chain's next step done right, the step
    taken from the trace's own previous result (so lines that carry a slip forward are no new slip):
    a line that is no step in any phrasing, a step label that is not its own, the wrong operation or
    operand, or a wrong result. ``len(lines)`` when every line is right but steps are missing; None
    when every step is there and right (a wrong answer then lies in the answer line, not the working)."""
    ops, operands = parse_chain(problem)
    value = operands[0]
    for i, line in enumerate(lines):
        step = read_step(line) if i < len(ops) else None
        if step is None:
            return i
        label, a, op, b, c = step
        if label not in (None, i + 1) or (a, op, b) != (value, ops[i], operands[i + 1]) or c != OPS[op](a, b):
            return i
        value = c
    return len(lines) if len(lines) < len(ops) else None


def checked_steps(lines: Sequence[str]) -> list[tuple[str, bool]]:
    """Each line of working that reads as a step: its operation and whether its result is right from
    its own operands (a slip carried forward is no new error; a line that is no step is left out)."""
    read = [read_step(line) for line in lines]
    return [(op, c == OPS[op](a, b)) for _, a, op, b, c in filter(None, read)]
