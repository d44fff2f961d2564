"""``study compare``'s paired change (seeds the unit) and steps to reach the baseline, by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rredcot.common.config import RUN_NAME, load_config
from rredcot.common.errors import UserError
from rredcot.launch import cli
from rredcot.launch.study import compare
from rredcot.launch.study.compare import (
    Run,
    arm_overrides,
    check_arms,
    paired_cell,
    run_name,
    steps_to_reach,
    summarize,
    write_report,
)

T_975_DF2 = 4.302652729749462  # Student t, 97.5% quantile, 2 degrees of freedom (tables: 4.303)


def run(method: str, seed: int, per_problem: list[float], start: float = 0.5) -> Run:
    """A finished run evaluated at step 0 (``start``) and step 24 (``per_problem`` at the end)."""
    final = sum(per_problem) / len(per_problem)
    evals = [
        {"step": 0, "sampled": start, "sampled_per_problem": [start] * len(per_problem)},
        {"step": 24, "sampled": final, "sampled_per_problem": per_problem},
    ]
    return Run(method, seed, {"evaluations": evals, "wall_s": 1.0, "training_reward": []})


BASE = [run("grpo", s, [0.5, 0.5]) for s in (1, 2, 3)]
# per-problem changes against the same seed's baseline: [0, .25], [.25, .25], [.25, .5]
OURS = [run("rredcot", 1, [0.5, 0.75]), run("rredcot", 2, [0.75, 0.75]), run("rredcot", 3, [0.75, 1.0])]


def test_paired_change_takes_the_seed_as_the_unit() -> None:
    """Per seed: 0.125, 0.25, 0.375; mean 0.25, sd 0.125, so the t-interval (df 2) is
    0.25 ± 4.303 · 0.125/√3 = [−0.061, +0.561]: it contains 0. Averaged over seeds first, the two
    problems change by 1/6 and 1/3: mean 0.25 ± 1.96 · (1/12) = [0.087, 0.413], which holds only
    for these trained models (six runs)."""
    p = summarize(BASE + OURS, ["grpo", "rredcot"])["methods"]["rredcot"]["paired_vs_baseline"]
    half = T_975_DF2 * 0.125 / math.sqrt(3)
    assert p["mean"] == pytest.approx(0.25)
    assert (p["low"], p["high"]) == pytest.approx((0.25 - half, 0.25 + half))
    assert p["low"] < 0 < p["high"]
    assert p["per_seed"] == [0.125, 0.25, 0.375] and p["seeds"] == 3 and p["problems"] == 2
    assert (p["conditional_low"], p["conditional_high"]) == pytest.approx((0.25 - 1.96 / 12, 0.25 + 1.96 / 12))
    assert paired_cell(p) == (
        "+0.250 [-0.061, +0.561] over 3 seeds; conditional on these trained models [+0.087, +0.413] (2 problems)"
    )


def test_one_seed_has_no_interval_over_training_runs() -> None:
    """Seed 1 alone: a change of 0.125 with no interval over seeds. The problems' changes [0, .25]
    (sd 0.177, se 0.125) give 0.125 ± 1.96 · 0.125 = [−0.120, +0.370], labelled as conditional on the model."""
    p = summarize(BASE[:1] + OURS[:1], ["grpo", "rredcot"])["methods"]["rredcot"]["paired_vs_baseline"]
    assert p["mean"] == 0.125 and p["low"] is None and p["high"] is None and p["seeds"] == 1
    assert (p["conditional_low"], p["conditional_high"]) == pytest.approx((0.125 - 1.96 * 0.125, 0.125 + 1.96 * 0.125))
    assert paired_cell(p) == (
        "+0.125, 1 seed: no interval over training runs; conditional on this trained model [-0.120, +0.370] "
        "(2 problems)"
    )


def test_equal_finals_reach_their_own_mean() -> None:
    """Three baseline seeds ending at 27/40: their mean is 0.6750000000000002 in floating point, a
    rounding error above 27/40; every seed reaches it at step 24. 26/40 does not."""
    grpo = [run("grpo", s, [1.0] * 27 + [0.0] * 13) for s in (1, 2, 3)]
    s = summarize(grpo, ["grpo"])
    assert s["target_accuracy"] > 27 / 40
    assert s["methods"]["grpo"]["steps_to_target"] == [24, 24, 24]
    assert steps_to_reach(run("grpo", 4, [1.0] * 26 + [0.0] * 14), s["target_accuracy"]) is None


def test_training_problems_are_compared_apart_from_held_out_ones(tmp_path: Path) -> None:
    """With ``logging.eval_train`` every evaluation holds ``train``: the same statistics on those
    problems under ``train``, here a change of +0.25 per seed on held-out problems and of −0.5 on
    the training ones (every seed alike: a zero-width interval)."""

    def with_train(r: Run, train_end: list[float]) -> Run:
        first, last = r.evals
        start = {"step": 0, "sampled": 1.0, "sampled_per_problem": [1.0] * len(train_end)}
        end = {"step": 24, "sampled": sum(train_end) / len(train_end), "sampled_per_problem": train_end}
        return Run(r.method, r.seed, {**r.summary, "evaluations": [{**first, "train": start}, {**last, "train": end}]})

    base = [with_train(r, [1.0, 1.0]) for r in BASE]
    ours = [with_train(r, [0.5, 0.5]) for r in OURS]
    s = summarize(base + ours, ["grpo", "rredcot"])
    assert s["methods"]["rredcot"]["paired_vs_baseline"]["mean"] == pytest.approx(0.25)
    train = s["train"]["methods"]["rredcot"]
    assert train["paired_vs_baseline"]["per_seed"] == [-0.5, -0.5, -0.5]
    assert train["start_sampled_mean"] == 1.0 and train["final_sampled_mean"] == 0.5
    assert s["train"]["methods"]["grpo"]["steps_to_target"] == [0, 0, 0]  # 1.0 at the start already
    assert "train" not in summarize(BASE + OURS, ["grpo", "rredcot"])  # only when every run has it
    meta = {"config": "tests", "overrides": [], "seeds": 3, "machine": "cpu"}
    md = write_report(base + ours, ["grpo", "rredcot"], meta, tmp_path).read_text()
    assert "| rredcot | 1.000 → 0.500 | 0.500, 0.500, 0.500 |" in md  # the training problems' table
    assert (tmp_path / "compare_curves.png").stat().st_size > 0


def test_an_arm_is_a_method_with_its_own_overrides() -> None:
    assert arm_overrides("grpo") == ["credit.method=grpo"]
    mix = "credit.settings.rredcot.uniform_mix"
    assert arm_overrides(f"rredcot@{mix}=1.0@credit.settings.rredcot.baseline=none") == [
        "credit.method=rredcot",
        f"{mix}=1.0",
        "credit.settings.rredcot.baseline=none",
    ]
    assert run_name(f"rredcot@{mix}=1.0", 3) == f"rredcot__{mix}-1.0-s3"  # 51 characters: no digest yet
    long = f"rredcot@generation.drop_uniform_groups=true@{mix}=0.5@learner.lr=4e-5"
    for arm in ("grpo", f"rredcot@{mix}=1.0", "rredcot@generation.drop_uniform_groups=true", long):
        name = run_name(arm, 12)
        assert RUN_NAME.fullmatch(name), name  # a name run.name accepts (the '+' of an earlier version was not)
        load_config("tests", [f"run.name={name}"])
    assert run_name(long, 1) != run_name(long.replace("0.5", "0.6"), 1)  # long arms stay apart
    for bad in ("rredcot@uniform", "@credit.x=1"):
        with pytest.raises(UserError, match="METHOD@key=value"):
            arm_overrides(bad)


def test_arms_that_sanitise_to_one_name_are_distinct_runs() -> None:
    """``be brief`` and ``be_brief`` used to share a folder: the second arm reused the first's run."""
    spaced, underscored = "grpo@data.system_prompt=be brief", "grpo@data.system_prompt=be_brief"
    assert run_name(underscored, 1) == "grpo__data.system_prompt-be_brief-s1"  # an ordinary arm keeps its name
    assert run_name(spaced, 1) != run_name(underscored, 1)
    assert run_name(spaced, 1).startswith("grpo__data.system_prompt-be_brief-")
    for arm in (spaced, "grpo@data.system_prompt=be:brief", "grpo@model.path=/models/a b"):
        assert RUN_NAME.fullmatch(run_name(arm, 12)), arm
    assert run_name("grpo@model.path=/m/a", 1) != run_name("grpo@model.path=_m_a", 1)
    check_arms("tests", [], [spaced, underscored], 1)  # distinct: accepted


def _no_training(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    started: list[str] = []
    monkeypatch.setattr(compare, "train_once", lambda config, overrides, arm, *a, **k: started.append(arm))
    return started


def test_an_arm_given_twice_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started, out = _no_training(monkeypatch), tmp_path / "cmp"
    assert cli.main(["study", "compare", "tests", "--methods", "grpo,rredcot,grpo", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert started == [] and not out.exists()
    assert err.count("\n") == 0 and "arms 'grpo' and 'grpo' would be one run" in err, err


def test_every_arms_model_path_is_checked_before_the_first_run_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An arm whose model path does not exist used to fail only when it started, after the earlier
    arms trained."""
    started, out = _no_training(monkeypatch), tmp_path / "cmp"
    arms = f"grpo,rredcot@model.path={tmp_path / 'nope'}"
    assert cli.main(["study", "compare", "tests", "--methods", arms, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert started == [] and not out.exists()
    assert err.startswith("rredcot: cannot start: arm 'rredcot@model.path=") and err.count("\n") == 0, err
    assert f"model.path {tmp_path / 'nope'}: no such directory" in err
    with pytest.raises(UserError, match="arm 'grpo@learner.lrr=1'.*unknown config key 'learner.lrr'"):
        check_arms("tests", [], ["rredcot", "grpo@learner.lrr=1"], 1)
