"""Intervals of held-out accuracies: a mean with its 95% interval, treating problems as the unit
(samples of one problem are correlated), and the paired change between two evaluations of the same
problems. Plain arithmetic on evaluation records: the report and the curves read them without the
evaluator's engine."""

from __future__ import annotations

import math
from typing import Any


def mean_ci(
    values: list[float],
    z: float = 1.96,
    clip: tuple[float, float] | None = (0.0, 1.0),
) -> tuple[float, float, float]:
    """(mean, low, high) of a normal-approximation interval, clipped to ``clip`` (accuracies: [0, 1]);
    a single value has a zero-width one."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    m = sum(values) / n
    if n == 1:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    if clip is None:
        return m, m - half, m + half
    return m, max(clip[0], m - half), min(clip[1], m + half)


def paired_change(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """Mean change of per-problem accuracy on the same problems, with its 95% interval.

    Problem difficulty cancels in the differences, so this interval is much tighter than the gap
    between two independent intervals: the honest test of "did training help on held-out data".
    """
    return mean_ci([a - b for b, a in zip(before, after, strict=True)], clip=None)


def drawn_alike(first: dict[str, Any], last: dict[str, Any]) -> bool:
    """Whether two evaluation records (``EvalResult.as_dict``) both drew each problem's samples from
    its own seed (``logging.eval_same_draws``), so their paired change compares the same draws."""
    return bool(first.get("same_draws") and last.get("same_draws"))
