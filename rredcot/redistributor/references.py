"""What the branches at an exit point score: the value constructs of ``credit.settings.rredcot.reference``.

A branch appended after the trace prefix ``x ⊕ o[:e_t]`` is a *tail* of tokens, each labelled
``U`` (a reference step, summed into log p(u)), ``Y`` (the answer, summed into log p(y)) or
``CONTEXT`` (teacher-forced, never scored: the exit string, the task's answer template such as
``Answer: ``). For a reference pair (u, y) whose y starts with the template τ (y = τ ⊕ a):

- ``solution`` (PR-style): exit ⊕ u ⊕ τ ⊕ a — restate the whole reference after the exit;
- ``answer``: exit ⊕ τ ⊕ a — answer now;
- ``suffix``: u[j:] ⊕ exit ⊕ τ ⊕ a for every step boundary j of u (line and keyword starts, 0 and
  |u| included; at most ``credit.settings.rredcot.max_suffixes``, evenly spread): continue the reference from
  wherever the trace stands, then stop thinking and answer. The pair's weight is shared by its
  suffixes (1/S each), so v̂(s_t) = Σ_i (1/S_i) Σ_j p(u_i[j:] ⊕ a_i | s_t): a uniform prior over
  where in reference i the trace stands (docs/credit.md). With ``credit.settings.rredcot.suffix_window``
  W > 0 the prior narrows to the W starts nearest the exit's relative position in the trace
  (``nearest_starts``: a trace 40% through is most likely 40% through the reference), each of share
  1/W: S/W times fewer branch forwards.

Two rules keep a branch a state the policy visits: the exit string loses its leading newlines
after text that already ended a line (no blank line the policy never writes), and template tokens
are context, never scored as if they were the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONTEXT, U, Y = -1, 0, 1
CONSTRUCTS = ("solution", "answer", "suffix")

Pair = tuple[Sequence[int], Sequence[int]]


@dataclass(frozen=True)
class Tail:
    """A branch's tokens after the exit point, each with its label, and its share of its pair in v̂."""

    ids: tuple[int, ...]
    labels: tuple[int, ...]
    share: float = 1.0

    @classmethod
    def of(cls, parts: Sequence[tuple[Sequence[int], int]], share: float = 1.0) -> Tail:
        """Concatenate (ids, label) parts."""
        ids = tuple(int(i) for p, _ in parts for i in p)
        return cls(ids, tuple(label for p, label in parts for _ in p), share)


@dataclass(frozen=True)
class TailText:
    """What the tails depend on beyond the pairs: the exit string's ids in full and without its
    leading newlines, and whether a token's text ends a line."""

    exit_ids: tuple[int, ...]
    bare_exit_ids: tuple[int, ...]
    ends_line: Callable[[int], bool]

    def exit(self, after_line_end: bool) -> tuple[int, ...]:
        """The exit string's ids: without its leading newlines after text that ended a line."""
        return self.bare_exit_ids if after_line_end else self.exit_ids


@dataclass(frozen=True)
class Construct:
    """A pair split for the branches: its steps u, the suffix starts in u, the template τ and the
    answer a (y = τ ⊕ a)."""

    steps: tuple[int, ...]
    starts: tuple[int, ...]
    template: tuple[int, ...]
    answer: tuple[int, ...]


def suffix_starts(boundaries: Sequence[int], length: int, cap: int) -> tuple[int, ...]:
    """0, the step ``boundaries`` strictly inside (0, length), and ``length``; at most ``cap``
    of them (≥ 2 when length > 0), spread evenly and always keeping 0 and ``length``."""
    inner = sorted({int(b) for b in boundaries if 0 < b < length})
    every = [0, *inner, length] if length else [0]
    if len(every) <= cap:
        return tuple(every)
    keep = np.unique(np.round(np.linspace(0, len(every) - 1, max(cap, 2))).astype(int))
    return tuple(every[i] for i in keep)


def nearest_starts(starts: Sequence[int], length: int, at: float, width: int) -> tuple[int, ...]:
    """The ``width`` suffix ``starts`` (token offsets in steps of ``length`` tokens) nearest the
    relative position ``at`` ∈ [0, 1], in their order; ties go to the earlier start; all of them
    when ``width`` ≥ their number or ``width`` ≤ 0."""
    if width <= 0 or width >= len(starts):
        return tuple(starts)
    rel = np.asarray(starts, dtype=np.float64) / max(length, 1)
    keep = np.sort(np.argsort(np.abs(rel - at), kind="stable")[:width])
    return tuple(int(starts[i]) for i in keep)


def split_pair(
    ids: Sequence[int], texts: Sequence[str], template: str, boundaries: Sequence[int], cap: int
) -> Construct | None:
    """A pair's tokens u ⊕ y (``texts``: each token's text) split at the last ``template`` into
    steps, template and answer; suffix starts from the step ``boundaries`` (token indices). Without
    the template the whole pair is the answer (nothing to continue, nothing to leave unscored).
    None for an empty pair: it scores nothing, so it is no reference."""
    ids = tuple(int(i) for i in ids)
    if not ids:
        return None
    text = "".join(texts)
    head = template.strip()
    at = text.rfind(head) if head else -1
    if at < 0:
        return Construct((), (0,), (), ids)
    off = np.concatenate([[0], np.cumsum([len(t) for t in texts])])
    lo = int(np.searchsorted(off, at, side="right")) - 1  # the token holding the template's first character
    hi = int(np.searchsorted(off, at + len(head), side="left"))  # the first token after it
    while hi < len(ids) and not texts[hi].strip():  # and the whitespace after it (``Answer: ``)
        hi += 1
    steps = ids[:lo]
    return Construct(steps, suffix_starts(boundaries, len(steps), cap), ids[lo:hi], ids[hi:])


def tails(
    pairs: Sequence[Construct],
    construct: str,
    text: TailText,
    prefix_ends_line: bool,
    at: float = 0.0,
    window: int = 0,
) -> list[Tail]:
    """The tails of every pair at an exit whose prefix ends a line (``prefix_ends_line``) or not, in
    pair order (a ``suffix`` pair contributes one tail per start, each of share 1/S; with ``window``
    W > 0, one per start of the W nearest the exit's relative position ``at``, each of share 1/W)."""
    if construct not in CONSTRUCTS:
        raise ValueError(f"credit.settings.rredcot.reference {construct!r} not in {CONSTRUCTS}")
    out: list[Tail] = []
    for p in pairs:
        answer = [(p.template, CONTEXT), (p.answer, Y)]
        if construct == "suffix":
            starts = nearest_starts(p.starts, len(p.steps), at, window)
            for j in starts:
                rest = p.steps[j:]
                exit_ids = text.exit(text.ends_line(rest[-1]) if rest else prefix_ends_line)
                out.append(Tail.of([(rest, U), (exit_ids, CONTEXT), *answer], 1.0 / len(starts)))
            continue
        steps = p.steps if construct == "solution" or not p.answer else ()  # no answer: the steps are it
        out.append(Tail.of([(text.exit(prefix_ends_line), CONTEXT), (steps, U), *answer]))
    return out
