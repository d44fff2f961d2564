"""The credit study's summary from synthetic traces with known answers: a method equal to MC agrees
perfectly, a reversed one perfectly negatively, segments land in the quintile of their start, and
costs are plain means."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.launch.study.credit import MC, Cost, TraceCredit
from rredcot.launch.study.report import (
    agreement,
    costs,
    every_start,
    half_agreement,
    paired_agreement,
    position_correlation,
    summarize,
    with_sign,
    write_report,
)


def _trace(i: int, mc: np.ndarray, length: int = 100) -> TraceCredit:
    k = len(mc)
    exits = np.linspace(0, length, k + 1).astype(int)
    values = np.cumsum(np.r_[0.0, mc])
    return TraceCredit(
        group_id=f"g{i // 2}",
        sample_index=i % 2,
        advantage=1.0,
        reward=1.0,
        length=length,
        exits=exits,
        values={MC: values, "same": values * 2 + 1, "reversed": -values},
        segment_scores={MC: mc, "same": mc * 3, "reversed": -mc},
        mc_rewards=np.tile(np.array([0.0, 1.0]), (k + 1, 4)),  # [K+1, 8]: alternating outcomes
        mc_stderr=np.full(k + 1, 0.1),
        cost={"same": Cost(100 + i, 1.0), MC: Cost(1000, 10.0 + i)},
    )


@pytest.fixture
def traces() -> list[TraceCredit]:
    rng = np.random.default_rng(0)
    return [_trace(i, rng.permutation(10).astype(float) - 4.5) for i in range(6)]


def test_agreement_with_mc_is_plus_one_for_a_monotone_copy_and_minus_one_reversed(traces):
    for attribute in ("segment_scores", "values"):
        same, rev = agreement(traces, "same", attribute), agreement(traces, "reversed", attribute)
        assert same.spearman.mean == pytest.approx(1) and same.kendall.mean == pytest.approx(1)
        assert rev.spearman.mean == pytest.approx(-1) and rev.kendall.mean == pytest.approx(-1)
        assert same.spearman.n == 6 and same.spearman.excluded == 0


def test_position_quintiles_pool_the_segments_that_start_there():
    """Ten segments of 10 tokens in a 100-token trace: two start in each quintile. Scores that agree
    with MC in the first two quintiles and disagree in the rest show up per bin."""
    mc = np.arange(10, dtype=float)
    traces = [_trace(i, mc) for i in range(3)]
    for t in traces:
        t.segment_scores["mixed"] = np.r_[mc[:4], -mc[4:]]
    by_bin = position_correlation(traces, "mixed")
    assert by_bin[:2] == pytest.approx([1.0, 1.0]) and by_bin[2:] == pytest.approx([-1.0] * 3)


def test_costs_are_means_over_the_traces_that_ran_the_method(traces):
    got = costs(traces)
    assert got["same"] == {"tokens": pytest.approx(102.5), "seconds": 1.0}
    assert got[MC] == {"tokens": 1000.0, "seconds": pytest.approx(12.5)}


META = {"checkpoint": "ckpt", "config": "test", "source": "a run", "mc_samples": 8, "machine": "cpu"}


def test_summary_and_report_files(traces, tmp_path):
    summary = summarize(traces, META)
    assert summary["traces"] == 6 and summary["groups"] == 3 and summary["mean_segments"] == 10
    assert summary["mc_stderr_mean"] == pytest.approx(0.1)
    assert summary["mc_std_by_m"][1] == pytest.approx(np.std([0, 1, 0, 1, 0, 1, 0, 1], ddof=1))
    table = summary["by_sign"]["all"]
    assert table["segment_rewards"]["same"]["spearman"]["mean"] == pytest.approx(1)
    assert table["segment_rewards"]["same"]["spearman"]["groups"] == 3  # clustered by group
    assert set(summary["by_sign"]) == {"all", "A>0"}  # no blamed trace: no table for A < 0
    text = write_report(traces, META, tmp_path).read_text()
    assert "| reversed | -1.000" in text and "| same | +1.000" in text
    assert sorted(p.name for p in tmp_path.glob("*.png")) and (tmp_path / "study.json").exists()


def test_signs_pairs_and_the_test_retest_agreement_by_hand():
    """Traces 0, 2, 4 credited and 1, 3, 5 blamed; a method that copies MC on credited traces and
    reverses it on blamed ones is +1 and −1 by sign; against ``entropy`` (all zeros but one) the
    paired difference is its own ρ. MC halves that repeat each other agree perfectly."""
    rng = np.random.default_rng(1)
    traces = [_trace(i, rng.permutation(6).astype(float)) for i in range(6)]
    for t in traces:
        t.advantage = 1.0 if t.sample_index == 0 else -1.0
        mc = t.segment_scores[MC]
        t.segment_scores["signed"] = mc if t.advantage > 0 else -mc
        t.segment_scores["entropy"] = np.r_[1.0, np.zeros(len(mc) - 1)]  # ρ with MC: whatever it is, per trace
        hits = np.round(np.cumsum(np.r_[0.0, mc]) / 15 * 4).astype(int)  # 0..4 successes of 4 per exit
        half = np.array([[1.0] * h + [0.0] * (4 - h) for h in hits])
        t.mc_rewards = np.hstack([half, half])  # the two halves of the 8 continuations agree exactly
    plus, minus = with_sign(traces, "A>0"), with_sign(traces, "A<0")
    assert agreement(plus, "signed", "segment_scores").spearman.mean == pytest.approx(1)
    assert agreement(minus, "signed", "segment_scores").spearman.mean == pytest.approx(-1)
    entropy = agreement(plus, "entropy", "segment_scores").spearman
    assert paired_agreement(plus, "signed", "entropy").mean == pytest.approx(1 - entropy.mean)
    halves = half_agreement(traces)
    assert halves.n > 0 and halves.mean == pytest.approx(1)


def test_a_windowed_suffix_row_is_paired_with_the_same_row_at_every_start(traces, tmp_path):
    """``rredcot:suffix:w2+group`` copies MC and ``rredcot:suffix+group`` reverses it: the paired
    difference is +2 per trace; rows without a window are not paired this way."""
    assert every_start("rredcot:suffix:w2+group") == "rredcot:suffix+group"
    assert every_start("rredcot:suffix:w12") == "rredcot:suffix"
    for t in traces:
        t.segment_scores["rredcot:suffix:w2+group"] = t.segment_scores["same"]
        t.segment_scores["rredcot:suffix+group"] = t.segment_scores["reversed"]
    paired = summarize(traces, META)["by_sign"]["all"]["paired_windows"]
    assert set(paired) == {"rredcot:suffix:w2+group"}
    assert paired["rredcot:suffix:w2+group"]["mean"] == pytest.approx(2) and paired["rredcot:suffix:w2+group"]["n"] == 6
    assert (
        "| rredcot:suffix:w2+group − rredcot:suffix+group | +2.000" in write_report(traces, META, tmp_path).read_text()
    )
