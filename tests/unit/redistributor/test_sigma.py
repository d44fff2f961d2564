"""σ from segment rewards: hand cases, degenerate inputs, and Σσ = 1, σ ≥ 0 as properties; σ against an
independent float64 restatement of the formula (docs/credit.md, "The computation")."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.redistributor.sigma import prob_rewards, segment_masses, segment_rewards, token_sigma, uniform_reason


def reference_rewards(values: list[float]) -> list[float]:
    """r_k = v_k − v_{k−1}, one subtraction at a time; a non-finite difference (−inf − −inf, NaN) is 0."""
    out = []
    for before, after in zip(values[:-1], values[1:]):
        d = float(after) - float(before)
        out.append(d if math.isfinite(d) else 0.0)
    return out


def reference_masses(rewards: list[float], advantage: float, sign: str, temperature: float = 1.0) -> list[float]:
    """m_k: relu max(sgn(A)·r_k, 0), abs |r_k|, softmax softmax(sgn(A)·r / T); all 0 when A = 0 or every r_k = 0."""
    s = 1 if advantage > 0 else -1 if advantage < 0 else 0
    if s == 0 or all(r == 0 for r in rewards):
        return [0.0] * len(rewards)
    if sign == "relu":
        return [max(s * r, 0.0) for r in rewards]
    if sign == "abs":
        return [abs(r) for r in rewards]
    z = [s * r / temperature for r in rewards]
    e = [math.exp(x - max(z)) for x in z]
    return [x / sum(e) for x in e]


def reference_sigma(n: int, exits: list[int], masses: list[float], lam: float) -> list[float]:
    """σ per token, written out from the formula and never normalised afterwards: a token outside
    [e_0, e_K) keeps 1/n; token j of segment k = [e_k, e_{k+1}) gets
    λ/n + (1 − λ) · (S/n) · m_k / (|seg_k| · Σm), S = e_K − e_0; Σm = 0 gives 1/n everywhere."""
    total = sum(masses)
    sigma = [1.0 / n] * n
    if not total > 0:
        return sigma
    span = exits[-1] - exits[0]
    for k, (lo, hi) in enumerate(zip(exits[:-1], exits[1:])):
        for j in range(lo, hi):
            sigma[j] = lam / n + (1 - lam) * (span / n) * masses[k] / ((hi - lo) * total)
    return sigma


def assert_matches_reference(sigma: np.ndarray, n: int, exits: list[int], masses: list[float], lam: float) -> None:
    """σ elementwise equal to the reference (whose own sum is 1 before any normalisation), and each
    segment's total λ|seg_k|/n + (1 − λ)(S/n)·m_k/Σm, tokens outside the segments 1/n."""
    ref = reference_sigma(n, exits, masses, lam)
    assert abs(math.fsum(ref) - 1.0) < 1e-9  # the formula is return-equivalent without renormalising
    np.testing.assert_allclose(sigma, ref, rtol=1e-6, atol=1e-9)
    total, span = sum(masses), exits[-1] - exits[0]
    if total > 0:
        outside = [*range(exits[0]), *range(exits[-1], n)]
        np.testing.assert_allclose(sigma[outside], 1 / n, rtol=1e-6)
        for k, (lo, hi) in enumerate(zip(exits[:-1], exits[1:])):
            share = lam * (hi - lo) / n + (1 - lam) * (span / n) * masses[k] / total
            assert float(sigma[lo:hi].sum(dtype=np.float64)) == pytest.approx(share, rel=1e-5, abs=1e-8)


def _exit_points(data, n: int) -> list[int]:
    """Strictly increasing exit points in [0, n] (one point: no segment). The span may start after 0
    (a thinking tag) and end before n (answer_part=uniform) or at n (answer_part=terminal)."""
    return sorted(set(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=10), label="exits")))


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


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 60),
    st.data(),
    st.one_of(st.just(0.0), st.floats(-3, 3)),
    st.sampled_from(["relu", "abs", "softmax"]),
    st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)),
    st.floats(0.05, 5.0),
)
def test_sigma_matches_the_formula_written_out(n, data, advantage, sign, lam, temperature) -> None:
    """values → rewards → masses → σ against the float64 restatement above, for every sign policy,
    λ, temperature and span (a thinking tag before it, an answer part after it or none): a dropped
    factor (S/|o|, λ, 1/|seg_k|) changes σ elementwise even though the implementation renormalises."""
    exits = _exit_points(data, n)
    values = data.draw(
        st.lists(
            st.one_of(st.floats(-50, 50), st.just(-math.inf), st.just(math.nan)),
            min_size=len(exits),
            max_size=len(exits),
        ),
        label="values",
    )
    rewards = segment_rewards(np.array(values))
    np.testing.assert_array_equal(rewards, reference_rewards(values))
    masses = segment_masses(rewards, advantage, sign, temperature)
    ref_masses = reference_masses(reference_rewards(values), advantage, sign, temperature)
    np.testing.assert_allclose(masses, ref_masses, rtol=1e-12, atol=1e-300)
    sigma = token_sigma(n, np.array(exits), masses, lam)
    assert sigma.dtype == np.float32 and sigma.shape == (n,)
    assert_matches_reference(sigma, n, exits, ref_masses, lam)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 40),
    st.data(),
    st.sampled_from([0.0, -900.0, -5000.0]),
    st.sampled_from([1.0, -1.0]),
    st.sampled_from(["relu", "abs"]),
    st.floats(0, 1),
)
def test_prob_space_sigma_matches_exact_arithmetic(n, data, base, advantage, sign, lam) -> None:
    """Prob space as the credit code runs it (``prob_rewards`` of log v̂, then relu/abs masses) against
    v̂ = e^{log v̂} in 60-digit arithmetic (mpmath), values down to e^−5700: σ is that of the exact
    differences. Log values within 700 nats of the largest (no difference underflows in float64, the
    limit ``prob_rewards`` documents), on a grid of 1/4 nat (no catastrophic cancellation); −inf is v̂ = 0."""
    exits = _exit_points(data, n)
    offsets = st.one_of(st.integers(-2800, 0).map(lambda q: q / 4), st.just(-math.inf))
    log_v = [base + o for o in data.draw(st.lists(offsets, min_size=len(exits), max_size=len(exits)), label="log v")]
    with mpmath.workdps(60):
        v = [mpmath.exp(mpmath.mpf(x)) for x in log_v]  # exp(−inf) = 0
        r = [b - a for a, b in zip(v[:-1], v[1:])]
        m = [max(advantage * x, 0) for x in r] if sign == "relu" else [abs(x) for x in r]
        total = sum(m)
        shares = [float(x / total) for x in m] if total > 0 else [0.0] * len(m)  # m_k / Σm, to float64
    sigma = token_sigma(n, np.array(exits), segment_masses(prob_rewards(np.array(log_v)), advantage, sign), lam)
    assert_matches_reference(sigma, n, exits, shares, lam)


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
