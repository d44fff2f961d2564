"""``rredcot study compare`` at CI size: two real training runs (grpo, rredcot) of the tests config
with one sampling seed and an evaluation mid-way (held-out and 3 training problems), then the
comparison; a second call reuses the finished runs."""

from __future__ import annotations

import json
import re

from rredcot.launch.study.compare import compare_study

PNG = b"\x89PNG\r\n\x1a\n"


def test_compare_trains_each_method_and_reports_the_paired_change(tmp_path) -> None:
    out = tmp_path / "cmp"
    overrides = ["run.steps=4", "logging.eval_every=2", "logging.eval_train=3"]
    path = compare_study("tests", overrides, ["grpo", "rredcot"], 1, out)
    s = json.loads((out / "compare.json").read_text())
    assert s["baseline"] == "grpo" and list(s["methods"]) == ["grpo", "rredcot"] and s["seeds"] == 1
    grpo, rredcot = s["methods"]["grpo"], s["methods"]["rredcot"]
    assert grpo["paired_vs_baseline"] is None and rredcot["paired_vs_baseline"]["problems"] == 5  # data.eval_size
    evals = json.loads((out / "grpo-s1" / "report" / "summary.json").read_text())["evaluations"]
    # held-out before, during (labelled with the step it started at, not the step it ended at) and after,
    # of the learner's last weights (a step that skipped its update made no version: versions <= steps)
    assert [e["step"] for e in evals][::2] == [0, 4] and len(evals) == 3 and 2 <= evals[1]["step"] < 4, evals
    learner = re.search(
        r"\| learner0 \| learner \|.* version=(\d+)", (out / "grpo-s1" / "report" / "summary.md").read_text()
    )
    assert learner is not None and evals[-1]["version"] == int(learner[1]) >= evals[1]["version"] > 0, evals
    # one seed: the baseline reaches its own final accuracy at its first evaluation that is as good
    assert grpo["steps_to_target"] == [next(e["step"] for e in evals if e["sampled"] >= grpo["final_sampled"][0])]
    assert 0 <= rredcot["final_sampled_mean"] <= 1 and rredcot["seeds"] == [1]
    for name in ("grpo-s1", "rredcot-s1"):
        summary = json.loads((out / name / "report" / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 4 and summary["training_reward"]
    assert (out / "compare_curves.png").read_bytes().startswith(PNG)
    assert "paired change vs grpo" in path.read_text()
    # logging.eval_train: every evaluation also measured the first 3 training problems, compared apart
    assert all(e["train"]["problems"] == 3 and e["train"]["version"] == e["version"] for e in evals), evals
    assert s["train"]["methods"]["rredcot"]["paired_vs_baseline"]["problems"] == 3
    assert "On the training problems the runs evaluated" in path.read_text()
    stamp = (out / "grpo-s1" / "report" / "summary.json").stat().st_mtime_ns
    compare_study("tests", overrides, ["grpo", "rredcot"], 1, out)
    assert (out / "grpo-s1" / "report" / "summary.json").stat().st_mtime_ns == stamp  # not trained again
