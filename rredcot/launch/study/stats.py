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
    """Mean with its 95% interval; ``n`` values counted, ``excluded`` undefined ones, ``groups`` the
    clusters the interval treats as independent (0: every value is its own)."""

    mean: float
    low: float
    high: float
    n: int
    excluded: int
    groups: int = 0

    def __str__(self) -> str:
        if not self.n:
            return f"n/a (0 of {self.excluded})"
        unit = f", {self.groups} groups" if self.groups else ""
        return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n={self.n}{unit})"


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean of the finite values with a 95% Student-t interval (every value independent)."""
    return clustered_interval(values, range(len(values)), grouped=False)


def clustered_interval(values: Sequence[float], clusters: Sequence[object], grouped: bool = True) -> Interval:
    """Mean of the finite values with a cluster-robust 95% interval: values of one cluster (the
    traces of one group share a prompt and a policy sample) are not independent, so the variance of
    the mean is G/(G−1) · Σ_g (Σ_{i∈g} (x_i − x̄))² / n², with a t quantile on G − 1 degrees of freedom.
    With one value per cluster this is the usual Student-t interval."""
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v)
    ok, labels = v[keep], [c for c, k in zip(clusters, keep, strict=True) if k]
    n, excluded = int(ok.size), int(v.size - ok.size)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0, excluded)
    m = float(ok.mean())
    sums: dict[object, float] = {}
    for c, x in zip(labels, ok - m, strict=True):
        sums[c] = sums.get(c, 0.0) + float(x)
    g = len(sums)
    if g < 2:
        return Interval(m, m, m, n, excluded, g if grouped else 0)
    var = g / (g - 1) * sum(x * x for x in sums.values()) / n**2
    half = float(stats.t.ppf(0.975, g - 1) * np.sqrt(var))
    return Interval(m, m - half, m + half, n, excluded, g if grouped else 0)


def paired_interval(a: Sequence[float], b: Sequence[float], clusters: Sequence[object]) -> Interval:
    """The mean per-item difference a − b over items where both are finite, clustered as
    ``clustered_interval``."""
    return clustered_interval(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), clusters)


def split_half_reliability(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An MC estimate's two halves: the means of the first and the second half of each exit's
    continuations ([T, M] → two [T]), disjoint and equally noisy (M // 2 each; an odd last one is
    left out)."""
    half = rewards.shape[1] // 2
    return rewards[:, :half].mean(axis=1), rewards[:, half : 2 * half].mean(axis=1)


def noise_ceiling(half_agreement: float) -> float:
    """The correlation a method that knew the true segment rewards would reach against the full-M
    MC estimate, from the agreement r of two independent M/2 halves: Spearman–Brown gives the
    reliability of the full estimate, R = 2r / (1 + r), and a perfect method correlates √R with it.
    NaN for r ≤ 0 (the halves do not agree: no ceiling to speak of)."""
    if not np.isfinite(half_agreement) or half_agreement <= 0:
        return float("nan")
    return float(np.sqrt(2 * half_agreement / (1 + half_agreement)))


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


@dataclass(frozen=True)
class ChangeVariance:
    """A paired held-out change (after − before, per problem) and its per-problem variance split in
    two: ``noise``, what the ``samples`` samples a problem gets add to each of its two accuracies,
    and ``problems``, the spread of the problems' true changes (what more samples cannot remove)."""

    change: float
    total: float
    noise: float
    samples: int

    @property
    def problems(self) -> float:
        return max(self.total - self.noise, 0.0)


def change_variance(before: Sequence[float], after: Sequence[float], samples: int) -> ChangeVariance:
    """The split of ``ChangeVariance`` from per-problem accuracies, each a mean of ``samples`` 0/1
    rewards: a problem's sampling variance p(1−p)/k, estimated without bias by p̂(1−p̂)/(k−1)."""
    b, a = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    noise = (b * (1 - b) + a * (1 - a)) / (samples - 1)
    d = a - b
    return ChangeVariance(float(d.mean()), float(d.var(ddof=1)), float(noise.mean()), samples)


def change_resolution(v: ChangeVariance, problems: int, samples: int) -> tuple[float, float]:
    """(half-width of the 95% interval, chance that it lies above 0) of a paired change as large as
    ``v.change``, measured on ``problems`` problems with ``samples`` samples each (normal
    approximation: the noise scales with 1/samples, the whole with 1/problems)."""
    se = float(np.sqrt((v.problems + v.noise * v.samples / samples) / problems))
    if se == 0:  # every problem changed alike, without noise
        return 0.0, float(v.change > 0)
    return 1.96 * se, float(stats.norm.cdf(v.change / se - 1.96))
