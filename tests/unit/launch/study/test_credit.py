"""The study's signed segment credit of a σ method, by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.launch.study.credit import segment_credit


def test_segment_credit_by_hand() -> None:
    """σ over 6 tokens, exits [0, 2, 5] (the answer token 5 outside every segment): the segments
    hold 0.1 + 0.2 and 0.3 + 0.1 + 0.1; A < 0 flips the sign."""
    sigma = np.array([0.1, 0.2, 0.3, 0.1, 0.1, 0.2], dtype=np.float32)
    np.testing.assert_allclose(segment_credit(sigma, np.array([0, 2, 5]), 1.5), [0.3, 0.5], rtol=1e-6)
    np.testing.assert_allclose(segment_credit(sigma, np.array([0, 2, 5]), -0.5), [-0.3, -0.5], rtol=1e-6)
    assert segment_credit(sigma, np.array([3]), 1.0).size == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.data())
def test_segment_credit_sums_the_segments(n, data) -> None:
    sigma = np.full(n, 1.0 / n)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=8))))
    exits = np.array(cuts)
    out = segment_credit(sigma, exits, 1.0)
    assert out.shape == (len(exits) - 1,)
    np.testing.assert_allclose(out.sum(), (exits[-1] - exits[0]) / n, atol=1e-9)
