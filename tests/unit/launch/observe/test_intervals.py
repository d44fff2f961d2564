"""The intervals of held-out accuracies, by hand."""

import math

import pytest

from rredcot.launch.observe.intervals import drawn_alike, mean_ci, paired_change


def test_mean_ci_hand_computed():
    m, lo, hi = mean_ci([0.0, 0.5, 1.0, 0.5])  # mean 0.5, sd sqrt(1/6), n 4
    half = 1.96 * math.sqrt(1 / 6) / 2
    assert (m, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert mean_ci([1.0, 1.0]) == (1.0, 1.0, 1.0)
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)
    assert mean_ci([1.0, 1.0, 0.0])[2] == 1.0  # clipped to [0, 1]


def test_paired_change_cancels_problem_difficulty():
    before = [0.1, 0.9, 0.2, 0.8, 0.5]
    after = [b + 0.1 for b in before]  # every problem improved by exactly 0.1
    d, lo, hi = paired_change(before, after)
    assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
    # the unpaired intervals of the two evaluations overlap widely even so
    assert mean_ci(after)[1] < mean_ci(before)[2]


def test_paired_change_hand_computed_and_length_check():
    d, lo, hi = paired_change([0.0, 0.0, 0.0], [0.0, 0.5, 1.0])
    half = 1.96 * 0.5 / math.sqrt(3)
    assert (d, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    with pytest.raises(ValueError):
        paired_change([0.1], [0.1, 0.2])


def test_two_evaluations_drew_alike_only_when_both_had_the_same_draws():
    assert drawn_alike({"same_draws": True}, {"same_draws": True})
    assert not drawn_alike({"same_draws": True}, {"same_draws": False})
    assert not drawn_alike({}, {"same_draws": True})  # a record from before the setting
