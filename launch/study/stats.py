"""Rank agreement of a credit method with Monte Carlo, per trace and over traces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


def rank_agreement(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """(Spearman ρ, Kendall τ-b) of two series; NaN where either is constant or shorter than 3
    (no ranking to agree on)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return float("nan"), float("nan")
    return float(stats.spearmanr(x, y).statistic), float(stats.kendalltau(x, y).statistic)


@dataclass(frozen=True)
class Interval:
    """Mean over traces with its 95% t-interval; ``n`` traces counted, ``excluded`` undefined ones."""

    mean: float
    low: float
    high: float
    n: int
    excluded: int

    def __str__(self) -> str:
        if not self.n:
            return f"n/a (0 of {self.excluded})"
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n={self.n})"


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean of the finite values with a 95% Student-t interval (traces are the unit)."""
    v = np.asarray(values, dtype=np.float64)
    ok = v[np.isfinite(v)]
    n, excluded = int(ok.size), int(v.size - ok.size)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, excluded)
    m = float(ok.mean())
    if n == 1:
        return Interval(m, m, m, 1, excluded)
    half = float(stats.t.ppf(0.975, n - 1) * ok.std(ddof=1) / np.sqrt(n))
    return Interval(m, m - half, m + half, n, excluded)


def subsample_std(rewards: np.ndarray, m: int) -> float:
    """Empirical std of an M-continuation mean estimated with ``m`` continuations: the M rewards of
    each exit ([T, M]) are cut into M // m disjoint groups of m; the std of the group means across
    groups, averaged over exits (NaN when fewer than two groups fit)."""
    t, total = rewards.shape
    groups = total // m
    if groups < 2:
        return float("nan")
    means = rewards[:, : groups * m].reshape(t, groups, m).mean(axis=2)
    return float(means.std(axis=1, ddof=1).mean())
