"""Where the time went: activity shares from the workers' cumulative seconds, checked by hand."""

from __future__ import annotations

import json

import pytest

from rredcot.launch.observe.report import read_history, redraw
from rredcot.launch.observe.timeline import bottleneck, plot_timeline, waiting, worker_timelines


def point(t: float, tier: str, worker: str, **values: float) -> dict:
    return {"t": t, "tier": tier, "worker": worker, "step": 0, "values": values}


def pipeline_waiting_for_generation() -> list[dict]:
    """Over 10 s: the generator generates 8 s, loads weights 1 s, waits 0; the redistributor scores
    2 s; the learner trains 2 s (of 3 s busy, 1 s broadcasting) and waits 6 s for batches."""
    return [
        point(100.0, "generator", "gen0", generate_s=1.0),
        point(100.0, "redistributor", "red0", busy_s=0.0),
        point(100.0, "learner", "learner0", busy_s=0.0, broadcast_s_total=0.0, wait_s=0.0),
        point(110.0, "generator", "gen0", generate_s=9.0, weight_update_s=1.0),
        point(110.0, "redistributor", "red0", busy_s=2.0),
        point(110.0, "learner", "learner0", busy_s=3.0, broadcast_s_total=1.0, wait_s=6.0),
    ]


def test_shares_per_interval_and_the_tier_remainder():
    gen, learner, red = worker_timelines(pipeline_waiting_for_generation())
    assert (gen.worker, learner.worker, red.worker) == ("gen0", "learner0", "red0")
    assert gen.times == [0.0, 10.0]  # one interval: from the first report to the second
    assert gen.shares["generate"] == [pytest.approx(0.8)] and gen.shares["load weights"] == [pytest.approx(0.1)]
    assert gen.shares["verify, publish"] == [pytest.approx(0.1)] and gen.shares["wait: staleness"] == [0.0]
    assert learner.shares["train"] == [pytest.approx(0.2)] and learner.shares["broadcast"] == [pytest.approx(0.1)]
    assert learner.shares["wait: batch"] == [pytest.approx(0.6)]
    assert learner.shares["checkpoint, other"] == [pytest.approx(0.1)]
    assert red.shares["score"] == [pytest.approx(0.2)] and red.shares["wait: rollouts"] == [pytest.approx(0.8)]


def test_the_tier_that_waits_least_bounds_the_run():
    timelines = worker_timelines(pipeline_waiting_for_generation())
    assert waiting(timelines) == {
        "generator": pytest.approx(0.0),
        "redistributor": pytest.approx(0.8),
        "learner": pytest.approx(0.6),
    }
    assert bottleneck(timelines).startswith("the generators bound this run: they wait least")
    assert "learners 60%" in bottleneck(timelines)


def test_a_learner_bound_run_and_a_balanced_one():
    blocked = [
        point(0.0, "generator", "gen0", generate_s=0.0, blocked_staleness_s=0.0),
        point(0.0, "learner", "learner0", busy_s=0.0, wait_s=0.0),
        point(20.0, "generator", "gen0", generate_s=5.0, blocked_staleness_s=15.0),
        point(20.0, "learner", "learner0", busy_s=19.5, wait_s=0.5),
    ]
    assert bottleneck(worker_timelines(blocked)).startswith("the learners bound this run")
    busy = [
        point(0.0, "generator", "gen0", generate_s=0.0),
        point(0.0, "learner", "learner0", busy_s=0.0, wait_s=0.0),
        point(10.0, "generator", "gen0", generate_s=9.5),
        point(10.0, "learner", "learner0", busy_s=9.8, wait_s=0.2),
    ]
    assert bottleneck(worker_timelines(busy)).startswith("balanced")
    assert bottleneck([]).startswith("no tier reported twice")


def test_counters_a_little_ahead_of_the_clock_never_make_a_share_above_one():
    history = [point(0.0, "learner", "l0", busy_s=0.0, wait_s=0.0), point(1.0, "learner", "l0", busy_s=0.8, wait_s=0.4)]
    (w,) = worker_timelines(history)
    assert sum(s[0] for s in w.shares.values()) == pytest.approx(1.0)
    assert all(0.0 <= s[0] <= 1.0 for s in w.shares.values())


def test_report_redraws_a_run_from_its_saved_history(tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    lines = [json.dumps(p) for p in pipeline_waiting_for_generation()]
    (report / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:20])  # a line still being written
    assert len(read_history(report / "metrics.jsonl")) == 6
    files, verdict = redraw(tmp_path)
    assert [f.name for f in files] == ["curves.png", "timeline.png"] and all(f.stat().st_size > 10_000 for f in files)
    assert verdict.startswith("the generators bound this run")
    out, same = plot_timeline([], tmp_path / "empty.png")
    assert out.exists() and same.startswith("no tier reported twice")
    with pytest.raises(FileNotFoundError, match="is .* a run directory"):
        redraw(tmp_path / "nothing")
