"""The group baseline of exit values, by hand and as properties."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rredcot.redistributor.baseline import group_baselines, relative_positions


def test_leave_one_out_mean_at_relative_positions_by_hand() -> None:
    """Trace 0 has 2 segments (exits at 0, 1/2, 1); trace 1 has 4 (0, 1/4, …, 1); trace 2 has 2.
    Trace 0's baseline at 1/2 reads trace 1 at its exit 2 (−3) and trace 2 at its exit 1 (−1): −2."""
    values = [np.array([0.0, -2.0, -6.0]), np.array([0.0, -1.0, -3.0, -5.0, -8.0]), np.array([0.0, -1.0, -4.0])]
    b = group_baselines(values)
    np.testing.assert_allclose(b[0], [0.0, (-3 - 1) / 2, (-8 - 4) / 2])
    # trace 1 at 1/4 reads trace 0 halfway to its exit 1 (−1) and trace 2 likewise (−0.5)
    np.testing.assert_allclose(b[1], [0.0, (-1 - 0.5) / 2, (-2 - 1) / 2, (-4 - 2.5) / 2, (-6 - 4) / 2])
    np.testing.assert_allclose(b[2], [0.0, (-2 - 3) / 2, (-6 - 8) / 2])
    np.testing.assert_allclose(relative_positions(5), [0, 0.25, 0.5, 0.75, 1])


def test_traces_without_a_curve_neither_give_nor_take() -> None:
    values = [np.array([0.0, -1.0]), np.zeros(0), np.array([0.5]), np.array([0.0, -np.inf]), np.array([1.0, 3.0])]
    b = group_baselines(values)
    assert b[1] is None and b[2] is None and b[3] is None  # no values, one exit, a non-finite value
    np.testing.assert_allclose(b[0], [1.0, 3.0])  # only trace 4 gives
    np.testing.assert_allclose(b[4], [0.0, -1.0])
    assert group_baselines([np.array([0.0, 1.0])]) == [None]  # alone in its group


@given(
    st.integers(1, 6),
    st.lists(st.floats(-5, 5), min_size=7, max_size=7),
    st.lists(st.floats(-3, 3), min_size=2, max_size=6),
    st.lists(st.integers(1, 6), min_size=2, max_size=6),
    st.floats(-4, 4),
)
def test_a_shared_drift_is_removed_and_an_offset_never_becomes_a_reward(k, drift, offsets, segments, slope) -> None:
    """Every trace's values = a curve shared by the group (what a construct says of any trace at
    that stage) + a constant of its own: the rewards left after the baseline are zero. Any curve when
    the traces have as many segments; a linear one (read exactly between exits) when they differ."""
    same_k = [np.asarray(drift[: k + 1]) + c for c in offsets]
    mixed = [slope * relative_positions(n + 1) + offsets[i % len(offsets)] for i, n in enumerate(segments)]
    for values in (same_k, mixed):
        for v, b in zip(values, group_baselines(values), strict=True):
            np.testing.assert_allclose(np.diff(v - b), 0.0, atol=1e-9)
