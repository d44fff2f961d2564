"""The end-of-run report: summary.md and summary.json from what the driver holds, at any end."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.common.ledger import Balance
from rredcot.launch.monitor import Phases
from rredcot.launch.report import RunOutcome, link_final_model, summary_json, write_report


def evaluation(step: int, per_problem: list[float]) -> dict:
    mean = sum(per_problem) / len(per_problem)
    return {
        "version": step,
        "problems": len(per_problem),
        "samples_per_problem": 4,
        "sampled": mean,
        "sampled_low": mean - 0.1,
        "sampled_high": mean + 0.1,
        "greedy": 0.5,
        "greedy_low": 0.4,
        "greedy_high": 0.6,
        "seconds": 12.0,
        "sampled_per_problem": per_problem,
        "step": step,
    }


class FakeMonitor:
    def __init__(self, evals: list[dict]) -> None:
        self.evals, self.step = evals, evals[-1]["step"] if evals else 0
        self.history = [
            {"t": 0.0, "tier": "learner", "worker": "learner0", "step": 1, "values": {"reward_mean": 0.4, "loss": 0.1}}
        ]
        self.last = {"learner0": {"tier": "learner", "step": float(self.step), "loss": 0.1}}


@pytest.mark.parametrize("status", ["finished", "interrupted (signal 15)"])
def test_report_writes_both_summaries(tmp_path: Path, status: str) -> None:
    cfg = load_config("tests", [f"run.dir={tmp_path}", "redis.url=redis://:secret@127.0.0.1:1/0"])
    before, after = [0.0, 0.25, 0.5, 0.5], [0.5, 0.5, 0.75, 1.0]
    outcome = RunOutcome(
        status=status, phases=Phases(), monitor=FakeMonitor([evaluation(0, before), evaluation(3, after)])
    )
    files = write_report(cfg, tmp_path, outcome)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["status"] == status and summary["steps"] == 3 and summary["steps_planned"] == 3
    paired = summary["paired_change"]
    assert paired["sampled_change"] == pytest.approx(0.375) and paired["problems"] == 4
    assert paired["low"] < 0.375 < paired["high"]
    assert [e["step"] for e in summary["evaluations"]] == [0, 3]
    assert summary["evaluations"][0]["sampled_per_problem"] == before  # for paired comparisons between runs
    assert summary["training_reward"] == [[1, 0.4]]  # learner0's mean sampled reward per step
    assert summary["dtype"]["model"] in ("float32", "bfloat16") and summary["cpu"]["model"]
    assert set(summary["phases_s"]) == {"start-up"}
    md = (tmp_path / "report" / "summary.md").read_text()
    assert f"Status: {status}." in md and "secret" not in md
    assert ("Sampled accuracy improved" in md) == (paired["low"] > 0)
    assert Path(files["learning curves"]).exists()


def test_the_ledger_section_names_why_groups_were_rejected_and_how_stale_the_trained_ones_were(tmp_path: Path) -> None:
    cfg = load_config("tests", [f"run.dir={tmp_path}"])
    reasons = {"uniform_solved": 7, "retired": 3, "uniform": 2}
    ledger = Balance(
        admitted=16,
        trained=4,
        dead=0,
        rejected=12,
        in_flight=0,
        rejected_by_reason=reasons,
        trained_by_lag={1: 3, 0: 1},
    )
    write_report(cfg, tmp_path, RunOutcome(status="finished", phases=Phases(), monitor=FakeMonitor([]), ledger=ledger))
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "Rejected by reason: retired 3, uniform 2, uniform_solved 7." in md and "Dead letters" not in md
    assert "Trained groups by the lag of their oldest token (updates behind the learner): 0: 1, 1: 3." in md


def test_training_problems_get_their_own_section_and_paired_change(tmp_path: Path) -> None:
    """``logging.eval_train``: each evaluation holds ``train``; the report pairs the first and last
    on those problems apart from the held-out ones (here the held-out ones do not move)."""
    cfg = load_config("tests", [f"run.dir={tmp_path}"])
    flat = [0.5, 0.5]
    evals = [
        {**evaluation(0, flat), "train": evaluation(0, [0.0, 0.25, 0.5])},
        {**evaluation(3, flat), "train": evaluation(3, [0.5, 0.75, 1.0])},
    ]
    write_report(cfg, tmp_path, RunOutcome(status="finished", phases=Phases(), monitor=FakeMonitor(evals)))
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["paired_change"]["sampled_change"] == 0.0
    train = summary["paired_change_train"]
    assert train["sampled_change"] == pytest.approx(0.5) and train["problems"] == 3
    assert train["low"] == train["high"] == pytest.approx(0.5)  # every problem changed by 0.5: no spread
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "Sampled accuracy did not change measurably: 0.500 → 0.500" in md
    assert "## Accuracy on training problems (`logging.eval_train`) (3 problems" in md
    assert "Sampled accuracy improved: 0.250 → 0.750, a change of +0.500" in md


def test_summary_without_evaluations(tmp_path: Path) -> None:
    cfg = load_config("tests", ["data.eval_size=0"])
    summary = summary_json(cfg, RunOutcome("failed: RuntimeError: x", Phases(), monitor=FakeMonitor([])), {})
    assert summary["evaluations"] == [] and summary["paired_change"] is None and summary["paired_change_train"] is None
    assert summary["status"].startswith("failed")


def test_final_model_is_a_relative_link_that_survives_moving_the_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (hf := run / "checkpoints" / "step-00000004" / "hf").mkdir(parents=True)
    (hf.parent / "pipeline.json").write_text("{}")
    (hf / "config.json").write_text("{}")
    (run / "report").mkdir()
    link = link_final_model(run, run / "report")
    assert link is not None and not Path(os.readlink(link)).is_absolute()
    run.rename(moved := tmp_path / "moved")
    assert (moved / "report" / "final_model" / "config.json").is_file()
