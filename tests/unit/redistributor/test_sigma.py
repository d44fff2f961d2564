"""σ from segment rewards: hand cases, degenerate inputs, and Σσ = 1, σ ≥ 0 as properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.redistributor.sigma import prob_rewards, segment_masses, segment_rewards, token_sigma, uniform_reason


def test_sigma_by_hand() -> None:
    r = segment_rewards(np.array([0.0, 0.5, 0.2]))
    np.testing.assert_allclose(r, [0.5, -0.3])
    exits = np.array([0, 4, 10])
    up = token_sigma(10, exits, segment_masses(r, 1.0, "relu"), 0.0)
    np.testing.assert_allclose(up, [0.25] * 4 + [0.0] * 6)  # credit the segment that raised v
    down = token_sigma(10, exits, segment_masses(r, -2.0, "relu"), 0.0)
    np.testing.assert_allclose(down, [0.0] * 4 + [1 / 6] * 6, rtol=1e-6)  # blame the one that lowered it
    absolute = token_sigma(10, exits, segment_masses(r, 1.0, "abs"), 0.0)
    np.testing.assert_allclose(absolute, [0.5 / 0.8 / 4] * 4 + [0.3 / 0.8 / 6] * 6, rtol=1e-6)
    # tokens 0, 1, 6..9 are outside every segment: they keep 1/|o|; the segments share 4/10
    mixed = token_sigma(10, np.array([2, 4, 6]), np.array([1.0, 0.0]), 0.5)
    np.testing.assert_allclose(mixed, [0.1] * 2 + [0.05 + 0.5 * 0.4 / 2] * 2 + [0.05] * 2 + [0.1] * 4, rtol=1e-6)


def test_answer_part_keeps_its_uniform_share() -> None:
    """Issue 13.1: a 2-token thinking segment with all the mass left the answer part σ = 0."""
    sigma = token_sigma(8, np.array([1, 3]), np.array([5.0]), 0.0)  # <think> a b </think> answer… EOS
    assert sigma[0] == pytest.approx(1 / 8) and np.all(sigma[3:] == pytest.approx(1 / 8))
    np.testing.assert_allclose(sigma[1:3], 1 / 8, rtol=1e-6)  # the span keeps its share, 2/8


def test_softmax_masses() -> None:
    m = segment_masses(np.array([0.0, np.log(3.0)]), 1.0, "softmax", temperature=1.0)
    np.testing.assert_allclose(m, [0.25, 0.75])
    m = segment_masses(np.array([0.0, np.log(3.0)]), -1.0, "softmax", temperature=1.0)
    np.testing.assert_allclose(m, [0.75, 0.25])
    with pytest.raises(ValueError, match="sign policy"):
        segment_masses(np.array([1.0]), 1.0, "tanh")


def test_softmax_of_zero_rewards_is_no_mass() -> None:
    """Every reward 0 (no reference pair, underflow) is reported as a uniform fallback: softmax gave
    each segment 1/K, so a 1-token segment took half the span ([0.5, 0.5/9 × 9] here)."""
    for advantage in (1.0, -1.0):
        masses = segment_masses(np.zeros(2), advantage, "softmax")
        assert masses.tolist() == [0.0, 0.0]
        np.testing.assert_allclose(token_sigma(10, np.array([0, 1, 10]), masses, 0.0), 0.1, rtol=1e-6)


def test_degenerate_sigma() -> None:
    assert token_sigma(0, np.array([0]), np.zeros(0), 0.0).size == 0  # empty completion
    np.testing.assert_allclose(token_sigma(1, np.array([0, 1]), np.array([0.7]), 0.0), [1.0])
    flat = np.full(5, 0.2)
    np.testing.assert_allclose(token_sigma(5, np.array([0, 5]), np.zeros(1), 0.0), flat)  # Σm = 0
    np.testing.assert_allclose(token_sigma(5, np.array([0]), np.zeros(0), 0.0), flat)  # no segment
    assert segment_masses(np.array([1.0, -1.0]), 0.0, "softmax").sum() == 0  # A = 0 -> uniform
    # no reference pair: log values are -inf everywhere; the rewards are 0 and σ is uniform
    r = segment_rewards(np.array([-np.inf, -np.inf, -np.inf]))
    assert r.tolist() == [0.0, 0.0]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 60),
    st.data(),
    st.floats(-3, 3),
    st.sampled_from(["relu", "abs", "softmax"]),
    st.floats(0, 1),
)
def test_sigma_properties(n, data, advantage, sign, lam) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=10))))
    values = np.array(
        data.draw(
            st.lists(
                st.one_of(st.floats(-50, 50), st.just(-np.inf), st.just(np.nan)), min_size=len(cuts), max_size=len(cuts)
            )
        )
    )
    sigma = token_sigma(n, np.array(cuts), segment_masses(segment_rewards(values), advantage, sign), lam)
    assert sigma.dtype == np.float32 and sigma.shape == (n,)
    assert np.all(np.isfinite(sigma)) and np.all(sigma >= 0)
    assert abs(float(sigma.astype(np.float64).sum()) - 1.0) < 1e-5


def test_prob_rewards_survive_underflow() -> None:
    """Issue 13.8: v̂ = e^-900 … underflows to 0 in prob space; scaled by e^{−max log v̂} the relu/abs
    masses are those of the exact differences."""
    lv = np.array([-900.0, -899.0, -902.0])
    assert not segment_rewards(np.exp(lv)).any()  # what prob space gave before: σ uniform
    r = prob_rewards(lv)
    np.testing.assert_allclose(r, [1 - np.exp(-1), np.exp(-3) - 1])
    exact = np.diff(np.exp(lv + 900))  # the same differences scaled by e^900
    for sign in ("relu", "abs"):
        m, m_exact = segment_masses(r, 1.0, sign), segment_masses(exact, 1.0, sign)
        np.testing.assert_allclose(m / m.sum(), m_exact / m_exact.sum())
    assert not prob_rewards(np.array([-np.inf, -np.inf])).any()


def test_uniform_reasons() -> None:
    z = np.zeros(2)
    assert uniform_reason(0, np.zeros(1), np.zeros(0), np.zeros(0)) == "no_segment"
    assert uniform_reason(2, np.zeros(0), z, z) == "no_reference"
    assert uniform_reason(2, np.full(3, -np.inf), z, z) == "underflow"
    assert uniform_reason(2, np.zeros(3), z, z) == "underflow"  # prob values that all underflowed
    assert uniform_reason(2, np.array([-3.0, -2.0, -2.0]), np.array([1.0, 0.0]), z) == "zero_mass"
    assert uniform_reason(2, np.array([-3.0, -3.0, -3.0]), z, np.full(2, 0.5)) == "zero_mass"  # softmax of 0s
    assert uniform_reason(2, np.array([-3.0, -2.0, -2.0]), np.array([1.0, 0.0]), np.array([1.0, 0.0])) == ""
