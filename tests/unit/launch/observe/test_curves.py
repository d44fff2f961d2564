"""The run's learning curves: rates per learner step after warm-up, and panels that say why they are flat."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rredcot.launch.observe.curves import flat_note, panels, plot_curves, rate_ceiling, rate_per_step


def test_rate_per_step_leaves_out_the_warm_up_and_sums_within_a_step() -> None:
    # (learner step, cumulative samples, cumulative busy seconds): the first report is 8 samples in 0.01 s
    points = [(0, 8, 0.01), (0, 9, 1.01), (1, 11, 3.01), (1, 12, 4.01), (2, 18, 10.01)]
    # step 0 is warm-up; step 1: (2 + 1) samples over (2 + 1) s; step 2: 6 over 6 s
    assert rate_per_step(points) == [(1, pytest.approx(1.0)), (2, pytest.approx(1.0))]


def test_rate_per_step_starts_afresh_after_a_restart() -> None:
    points = [(1, 10, 10.0), (1, 14, 12.0), (2, 2, 1.0), (2, 6, 3.0), (3, 10, 5.0)]
    # the drop from 14 to 2 is a restarted worker: that interval is skipped, not a negative rate
    assert rate_per_step(points) == [(1, pytest.approx(2.0)), (2, pytest.approx(2.0)), (3, pytest.approx(2.0))]


def test_rate_per_step_needs_two_reports() -> None:
    assert rate_per_step([(3, 5, 1.0)]) == []
    assert rate_per_step([(1, 5, 1.0), (1, 5, 1.0)]) == []  # no time passed: no rate


def test_flat_note_says_the_value_and_the_reason_when_known() -> None:
    note = flat_note("clip_frac", [0.0, 0.0, 0.0])
    assert note is not None and note.startswith("0 at every step") and "clip range" in note
    assert flat_note("loss", [0.5, 0.5]) == "0.5 at every step"
    assert flat_note("clip_frac", [0.0, 0.01]) is None
    assert flat_note("clip_frac", [0.0]) is None  # one point is not a flat line


def test_panels_draw_rates_from_counters_and_skip_absent_metrics(tmp_path: Path) -> None:
    red = [(i // 2, {"rollouts": 6.0 * i + (50 if i else 0), "busy_s": 2.0 * i + 0.01}) for i in range(8)]
    history = [{"t": 0.0, "tier": "redistributor", "worker": "red0", "step": s, "values": v} for s, v in red]
    history += [
        {"t": 0.0, "tier": "learner", "worker": "learner0", "step": s, "values": {"clip_frac": 0.0}} for s in (1, 2)
    ]
    shown = panels(history)
    assert [p.title for p in shown] == ["clip fraction", "redistributor samples/s (per step, after warm-up)"]
    clip, rate = shown
    assert clip.lines == {"learner0": [(1, 0.0), (2, 0.0)]} and not clip.zero_based
    # the first report's 50 quick samples are warm-up; then 3 samples/s in every step
    assert rate.zero_based and rate.lines["red0"] == [
        (1, pytest.approx(3.0)),
        (2, pytest.approx(3.0)),
        (3, pytest.approx(3.0)),
    ]
    assert plot_curves(history, [], tmp_path / "curves.png").exists()


def test_a_rate_spike_is_put_off_the_scale_not_the_steady_state() -> None:
    """A step of groups that needed no credit passes through the redistributor at ~1,500 samples/s
    against a steady ~1: the axis stops at 3 × the upper quartile, and the spike is named instead."""
    steady = [0.8, 1.0, 1.1, 0.9, 1.2, 1.0, 0.95, 1.05]
    assert rate_ceiling([*steady, 1575.0]) == pytest.approx(3 * np.percentile([*steady, 1575.0], 75))
    assert rate_ceiling(steady) is None  # nothing to hide
    assert rate_ceiling([5.0, 900.0]) is None  # too few steps to tell a spike from a trend


def test_the_held_out_panel_notes_the_paired_change_by_hand() -> None:
    """Changes +0.5, 0 and +0.25: mean +0.25, sd 0.25 over 3 problems; the same draws named only
    when both evaluations had them; one evaluation has no change to note."""
    from rredcot.launch.observe.curves import paired_note

    before = {"sampled_per_problem": [0.0, 0.5, 0.25], "same_draws": True}
    after = {"sampled_per_problem": [0.5, 0.5, 0.5], "same_draws": True}
    half = 1.96 * 0.25 / 3**0.5
    assert paired_note([before, after]) == (
        f"sampled, paired change: +0.250 [{0.25 - half:+.3f}, {0.25 + half:+.3f}] (the same draws)"
    )
    assert paired_note([before, {**after, "same_draws": False}]).endswith("]")
    assert paired_note([before]) is None
