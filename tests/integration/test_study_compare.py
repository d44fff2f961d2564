"""``rredcot study compare`` at CI size: a real training run of the tests config (rredcot, one sampling
seed, an evaluation mid-way on the held-out and 3 training problems) through ``rredcot train``, as
compare starts every arm's; the baseline's (grpo) run a copy of it, which compare reuses as it reuses
any finished run; then the comparison. (Compare treats every arm alike, so a second real run would
show nothing more, for another start-up of every tier.)"""

from __future__ import annotations

import json
import re
import shutil

from omegaconf import OmegaConf

from rredcot.launch.study.compare import compare_study, train_once

PNG = b"\x89PNG\r\n\x1a\n"


def test_compare_trains_each_method_and_reports_the_paired_change(tmp_path) -> None:
    out = tmp_path / "cmp"
    overrides = ["run.steps=4", "logging.eval_every=2", "logging.eval_train=3"]
    train_once("tests", overrides, "rredcot", 1, out)
    shutil.copytree(out / "rredcot-s1", out / "grpo-s1", symlinks=True)  # the baseline: a finished run
    runs = [out / name / "report" / "summary.json" for name in ("grpo-s1", "rredcot-s1")]
    stamps = [r.stat().st_mtime_ns for r in runs]
    path = compare_study("tests", overrides, ["grpo", "rredcot"], 1, out)
    assert [r.stat().st_mtime_ns for r in runs] == stamps  # finished runs are not trained again
    assert OmegaConf.load(out / "rredcot-s1" / "config.yaml").credit.method == "rredcot"  # the arm's overrides
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
