"""The end-of-run report: summary.md and summary.json from what the driver holds, at any end; what
σ did (the redistributors' counters); heatmaps chosen to show blame on the checker's line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rredcot.common.codec import encode
from rredcot.common.config import load_config
from rredcot.common.ledger import Balance
from rredcot.launch.observe.monitor import Phases
from rredcot.launch.observe.report import RunOutcome, credit_summary, link_final_model, summary_json, write_report
from rredcot.models.store import qwen_tokenizer_dir
from rredcot.redistributor.credit import redistribute_group
from tests.unit.redistributor.test_oracle import chain, group_of, slipped, text


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
    def __init__(self, evals: list[dict], workers: dict[str, dict] | None = None) -> None:
        self.evals, self.step = evals, evals[-1]["step"] if evals else 0
        self.history = [
            {"t": 0.0, "tier": "learner", "worker": "learner0", "step": 1, "values": {"reward_mean": 0.4, "loss": 0.1}}
        ]
        self.last = {"learner0": {"tier": "learner", "step": float(self.step), "loss": 0.1}, **(workers or {})}


# two redistributors' final counters (``WorkerMetrics``): 48 segments over 16 segmented traces, max
# σ·|o| summed to 12 over 6 wrong traces, 3 hits in 5 named slips where a random pick of a line makes 1.5
REDISTRIBUTORS = {
    "red0": {"tier": "redistributor", "segmented_samples": 10.0, "segments": 32.0, "wrong_samples": 4.0,
             "wrong_sigma_peak_sum": 9.0, "slip_named": 3.0, "slip_top_blame": 2.5, "slip_top_chance": 1.0},
    "red1": {"tier": "redistributor", "segmented_samples": 6.0, "segments": 16.0, "wrong_samples": 2.0,
             "wrong_sigma_peak_sum": 3.0, "slip_named": 2.0, "slip_top_blame": 0.5, "slip_top_chance": 0.5},
}  # fmt: skip


@pytest.mark.parametrize("status", ["finished", "interrupted (signal 15)"])
def test_report_writes_both_summaries(tmp_path: Path, status: str) -> None:
    about = "run.about=What it trains, and why."
    cfg = load_config("tests", [f"run.dir={tmp_path}", "redis.url=redis://:secret@127.0.0.1:1/0", about])
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
    assert md.startswith(f"# rredcot run report\n\nWhat it trains, and why.\n\nStatus: {status}.")
    assert "secret" not in md
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
    assert "Sampled accuracy did not change measurably: 0.500 → 0.500" in md and "same draws" not in md
    assert "## Accuracy on training problems (`logging.eval_train`) (3 problems" in md
    assert "Sampled accuracy improved: 0.250 → 0.750, a change of +0.500" in md


def test_a_change_measured_with_the_same_draws_says_so(tmp_path: Path) -> None:
    """``logging.eval_same_draws``: the sentence of the paired change names the shared draws, only
    when both evaluations had them."""
    cfg = load_config("tests", [f"run.dir={tmp_path}"])
    shared = [{**evaluation(step, [0.0, 0.5]), "same_draws": True} for step in (0, 3)]
    for evals, said in ((shared, True), ([shared[0], evaluation(3, [0.0, 0.5])], False)):
        write_report(cfg, tmp_path, RunOutcome(status="finished", phases=Phases(), monitor=FakeMonitor(evals)))
        md = (tmp_path / "report" / "summary.md").read_text()
        assert ("paired over the same held-out problems, each problem with the same draws both times" in md) == said, md


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


def test_credit_sums_every_redistributors_counters_before_dividing() -> None:
    credit = credit_summary({**FakeMonitor([]).last, **REDISTRIBUTORS}, checks_slips=True)
    assert credit == {
        "segmented_traces": 16,
        "segments_per_trace": 3.0,
        "wrong_traces": 6,
        "sigma_max_scaled_wrong_mean": 2.0,
        "slip_named_traces": 5,
        "top_blame_on_slip": 0.6,
        "top_blame_on_slip_chance": 0.3,
    }
    assert credit_summary(FakeMonitor([]).last, checks_slips=True) is None  # no redistributor reported
    grpo = credit_summary({"red0": {"tier": "redistributor", "wrong_samples": 2.0, "wrong_sigma_peak_sum": 2.0}}, False)
    assert grpo is not None and grpo["segments_per_trace"] is None and grpo["sigma_max_scaled_wrong_mean"] == 1.0
    assert grpo["slip_named_traces"] is None and grpo["top_blame_on_slip"] is None  # the task has no checker


@pytest.mark.parametrize("op", ["chain", "mul"])
def test_the_summaries_say_what_sigma_did(tmp_path: Path, op: str) -> None:
    cfg = load_config("tests", [f"run.dir={tmp_path}", f"task.settings.op={op}"])
    outcome = RunOutcome("finished", Phases(), monitor=FakeMonitor([], REDISTRIBUTORS))
    write_report(cfg, tmp_path, outcome)
    credit = json.loads((tmp_path / "report" / "summary.json").read_text())["credit"]
    assert credit["segments_per_trace"] == 3.0 and credit["sigma_max_scaled_wrong_mean"] == 2.0
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "## Credit" in md
    assert "- Segments per trace: 3.00 (mean over the 16 traces the credit method segmented)." in md
    assert "not even a σ known to be right (docs/study.md#where-credit-can-pay-a-positive-control-issue-60)" in md
    assert "mean max σ·|o| 2.00 over 6 wrong traces taking blame (1.00: uniform)." in md
    checker = "checker names: 0.60 of 5 wrong traces (ties share; a random pick among their lines of working: 0.30)"
    assert (checker in md) == (op == "chain") and ("The task has no slip checker" in md) == (op == "mul")
    write_report(cfg, tmp_path, RunOutcome("finished", Phases(), monitor=FakeMonitor([])))
    assert "## Credit" not in (tmp_path / "report" / "summary.md").read_text()  # no redistributor reported


def test_the_first_heatmap_is_a_wrong_trace_blamed_on_the_checkers_line_and_says_so(tmp_path: Path, qwen_tok) -> None:
    """Two saved groups of one right and one slipped trace: ``a`` weighted by grpo (uniform σ blames
    the longest line most, not the slipped one), ``b`` by oracle (blame on the slipped line). ``b``'s
    wrong trace comes first though ``a`` sorts first; then ``a``'s most-credited sample (the first of
    equal |A|: its right trace, no checker line to name)."""
    where = [f"run.dir={tmp_path}", f"model.tokenizer={qwen_tokenizer_dir()}"]
    cfg, lines, pid = chain(False, *where)
    wrong = [lines[0], slipped(lines[1]), *lines[2:]]
    group = group_of(qwen_tok, pid, [text(lines, "1", False), text(wrong, "0", False)], [1.0, 0.0])
    (tmp_path / "traces").mkdir()
    for name, method in [("a", "grpo"), ("b", "oracle")]:
        weighted = redistribute_group(group, chain(False, *where, f"credit.method={method}")[0], tokenizer=qwen_tok)
        (tmp_path / "traces" / f"red0-{name}.msgpack").write_bytes(encode(weighted))
    files = write_report(cfg, tmp_path, RunOutcome("finished", Phases(), monitor=FakeMonitor([])))
    first, second = (Path(files[f"credit heatmap {i}"]) for i in (0, 1))
    assert (first.name, second.name) == ("heatmap_red0-b.html", "heatmap_red0-a.html")
    caption = f"the checker's first wrong line: line 2 of 3 of working, '{wrong[1]}'; σ blames it most"
    assert caption.replace("'", "&#x27;") in first.read_text() and "checker" not in second.read_text()
    assert first.with_suffix(".png").is_file() and "credit heatmap 2" not in files
