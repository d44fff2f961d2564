"""A completion's lines, read from its tokens' texts: where its content ends (before trailing end
tokens), where its answer line starts, the token spans of its lines of working, the one a task's
slip checker names (the ``oracle`` method, the slip study, the run report) and σ's mass on each."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from rredcot.redistributor.segmentation import thinking_span, token_texts
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task


def content_end(ids: Sequence[int], end_ids: Collection[int]) -> int:
    """The length of ``ids`` without its trailing end tokens (``end_ids``: EOS, end of turn)."""
    n = len(ids)
    while n and ids[n - 1] in end_ids:
        n -= 1
    return n


def content_texts(tok: Any, ids: Sequence[int]) -> list[str]:
    """Each token's text of a completion, less its trailing end tokens (the tokenizer's special ids)."""
    return token_texts(tok, ids[: content_end(ids, frozenset(tok.all_special_ids))])


def answer_line_start(texts: Sequence[str], template: str) -> int:
    """The index of the first token of the last line that starts with ``template`` (leading spaces
    allowed); ``len(texts)`` when no line does (or the template is blank)."""
    head = template.strip()
    text = "".join(texts)
    if not head:
        return len(texts)
    at = max((m for m in _line_starts(text) if text[m:].lstrip(" \t").startswith(head)), default=None)
    if at is None:
        return len(texts)
    off = np.cumsum([0, *(len(t) for t in texts)])
    return int(np.searchsorted(off, at, side="right")) - 1


def _line_starts(text: str) -> list[int]:
    return [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text))]


def working_lines(texts: Sequence[str], think_start: str, think_end: str, template: str) -> list[tuple[int, int]]:
    """Token spans of the non-blank lines of the working: the thinking span, or without tags the
    completion up to its answer line; a line runs to the token that ends it (its newline included)."""
    lo, hi, has_think = thinking_span(texts, think_start, think_end)
    if not has_think:
        hi = answer_line_start(texts, template)
    spans, start = [], lo
    for j in range(lo, hi):
        if "\n" in texts[j] or j == hi - 1:
            if "".join(texts[start : j + 1]).strip():
                spans.append((start, j + 1))
            start = j + 1
    return spans


def line_texts(texts: Sequence[str], spans: Sequence[tuple[int, int]]) -> list[str]:
    """Each span's text, stripped: the lines a slip checker reads (``Task.first_slip``)."""
    return ["".join(texts[a:b]).strip() for a, b in spans]


def slipped_line(
    task: Task, problem: Problem, texts: Sequence[str], think_start: str, think_end: str
) -> tuple[list[tuple[int, int]], int | None]:
    """The token spans of a trace's working lines (``texts``: its content's token texts) and the index
    of the first wrong one the task's checker names; None when it names none of them (the working is
    right, or only steps are missing)."""
    spans = working_lines(texts, think_start, think_end, task.answer_template)
    slip = task.first_slip(problem, line_texts(texts, spans))
    return spans, slip if slip is not None and slip < len(spans) else None


def line_mass(sigma: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """σ's mass on each span."""
    return np.array([float(np.sum(sigma[a:b], dtype=np.float64)) for a, b in spans])


def top_share(mass: np.ndarray, line: int) -> float:
    """1/k when ``line`` is one of the k lines of most mass (ties share the hit), else 0."""
    top = np.flatnonzero(mass == mass.max())
    return 1.0 / len(top) if line in top else 0.0
