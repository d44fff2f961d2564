"""The study's rank agreement, intervals over traces, MC subsampling and the paired held-out change's
variance split, against hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from rredcot.launch.study.stats import (
    change_resolution,
    change_variance,
    clustered_interval,
    mean_interval,
    noise_ceiling,
    paired_interval,
    rank_agreement,
    split_half_reliability,
    subsample_std,
)


def test_rank_agreement_by_hand() -> None:
    assert rank_agreement([1, 2, 3, 4], [10, 20, 30, 40]) == (1.0, 1.0)
    assert rank_agreement([1, 2, 3, 4], [4, 3, 2, 1]) == (-1.0, -1.0)
    # one swapped pair of 4: Spearman 1 - 6·(1+1)/(4·15) = 0.8; Kendall (5 - 1)/6
    rho, tau = rank_agreement([1, 2, 3, 4], [1, 3, 2, 4])
    assert rho == pytest.approx(0.8) and tau == pytest.approx(4 / 6)


@pytest.mark.parametrize("a,b", [([1, 1, 1], [1, 2, 3]), ([1, 2], [2, 1]), ([1, 2, 3], [0, np.inf, 1])])
def test_rank_agreement_is_undefined_without_a_ranking(a, b) -> None:
    """A constant series (e.g. MC values all 1), fewer than 3 points or a non-finite value: NaN."""
    assert all(math.isnan(x) for x in rank_agreement(a, b))


def test_mean_interval_by_hand() -> None:
    """Values 0.2, 0.4, 0.6 (and one NaN excluded): mean 0.4, sd 0.2, t(0.975, 2) = 4.3027."""
    iv = mean_interval([0.2, 0.4, float("nan"), 0.6])
    half = 4.302652729911275 * 0.2 / math.sqrt(3)
    assert iv.mean == pytest.approx(0.4) and iv.n == 3 and iv.excluded == 1
    assert (iv.low, iv.high) == (pytest.approx(0.4 - half), pytest.approx(0.4 + half))
    assert mean_interval([float("nan")]).n == 0 and "n/a" in str(mean_interval([float("nan")]))


def test_subsample_std_by_hand() -> None:
    """One exit, rewards 1 1 0 0: two disjoint pairs have means 1 and 0 (std 0.707); four single
    continuations 1 1 0 0 have std 0.577; one group of four gives no spread (NaN)."""
    r = np.array([[1.0, 1.0, 0.0, 0.0]])
    assert subsample_std(r, 2) == pytest.approx(math.sqrt(0.5))
    assert subsample_std(r, 1) == pytest.approx(np.std([1, 1, 0, 0], ddof=1))
    assert math.isnan(subsample_std(r, 4))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=40))
def test_interval_contains_its_mean(values) -> None:
    iv = mean_interval(values)
    assert iv.low <= iv.mean + 1e-12 and iv.mean <= iv.high + 1e-12 and iv.n == len(values)


def test_clustered_interval_by_hand() -> None:
    """[1, 2 | 3, 6]: mean 3, deviations −2, −1 | 0, 3, cluster sums −3 and 3; variance of the mean
    2/1 · (9 + 9) / 4² = 2.25, so half-width t(0.975, 1 df) · 1.5 = 12.706 · 1.5."""
    iv = clustered_interval([1.0, 2.0, 3.0, 6.0, float("nan")], ["a", "a", "b", "b", "b"])
    half = 12.7062047 * 1.5
    assert (iv.mean, iv.n, iv.excluded, iv.groups) == (3.0, 4, 1, 2)
    assert iv.low == pytest.approx(3 - half, rel=1e-6) and iv.high == pytest.approx(3 + half, rel=1e-6)
    assert "2 groups" in str(iv)


@given(st.lists(st.floats(-10, 10), min_size=2, max_size=30))
def test_one_value_per_cluster_is_the_plain_t_interval(values) -> None:
    a, b = clustered_interval(values, list(range(len(values)))), mean_interval(values)
    assert (a.low, a.high) == pytest.approx((b.low, b.high), rel=1e-9, abs=1e-12)


def test_clustering_widens_the_interval_of_correlated_values() -> None:
    """Eight values, four pairs of equal ones: as independent they claim n = 8; as four clusters the
    interval is that of the four pair means (t on 3 df), wider."""
    values = [0.1, 0.1, 0.5, 0.5, -0.2, -0.2, 0.9, 0.9]
    plain, clustered = mean_interval(values), clustered_interval(values, [0, 0, 1, 1, 2, 2, 3, 3])
    pairs = mean_interval([0.1, 0.5, -0.2, 0.9])
    assert clustered.high - clustered.low > plain.high - plain.low
    assert (clustered.low, clustered.high) == pytest.approx((pairs.low, pairs.high), rel=1e-9)


def test_paired_interval_is_the_clustered_mean_of_the_differences() -> None:
    iv = paired_interval([1.0, 2.0, float("nan"), 4.0], [0.5, 2.5, 1.0, 1.0], ["g", "g", "h", "h"])
    assert iv.mean == pytest.approx((0.5 - 0.5 + 3.0) / 3) and iv.n == 3 and iv.excluded == 1 and iv.groups == 2


def test_split_halves_and_the_noise_ceiling_by_hand() -> None:
    rewards = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1]], dtype=float)  # M = 5: the odd last one left out
    a, b = split_half_reliability(rewards)
    np.testing.assert_allclose(a, [0.5, 0.0])
    np.testing.assert_allclose(b, [1.0, 0.5])
    assert noise_ceiling(0.5) == pytest.approx(np.sqrt(2 / 3))  # Spearman–Brown 2/3, then its root
    assert noise_ceiling(1.0) == 1.0 and np.isnan(noise_ceiling(0.0)) and np.isnan(noise_ceiling(float("nan")))


def test_a_changes_variance_splits_into_sampling_noise_and_the_problems_own_by_hand() -> None:
    """Two problems, 2 samples each: changes 0.5 and 0 (variance 0.125), all of it the noise of the
    0.5 accuracy, 0.5·0.5/(2−1) = 0.25 over two problems: nothing left for the problems' own spread."""
    v = change_variance([0.0, 1.0], [0.5, 1.0], samples=2)
    assert (v.change, v.total, v.noise, v.problems) == pytest.approx((0.25, 0.125, 0.125, 0.0))
    half, above = change_resolution(v, problems=2, samples=2)
    assert half == pytest.approx(1.96 * 0.25)  # se = sqrt(0.125 / 2)
    assert above == pytest.approx(stats.norm.cdf(0.25 / 0.25 - 1.96))  # 0.1685


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=3, max_size=40),
    st.integers(1, 4),
)
def test_more_problems_or_samples_never_widen_the_interval(counts: list[tuple[int, int]], more: int) -> None:
    before, after = [b / 6 for b, _ in counts], [a / 6 for _, a in counts]
    v = change_variance(before, after, samples=6)
    n = len(counts)
    half = change_resolution(v, n, 6)[0]
    assert change_resolution(v, n * (1 + more), 6)[0] <= half + 1e-12
    assert change_resolution(v, n, 6 * (1 + more))[0] <= half + 1e-12
    assert v.noise >= 0 and 0 <= v.problems <= max(v.total, 0)
