"""``rredcot study compare CONFIG --methods grpo,rredcot --seeds N``: one training run per (arm,
sampling seed) of the same config (an arm is a credit method, or ``METHOD@key=value...`` with its own
overrides) (same problems, data order and step budget), then learning curves
with bands over seeds, steps to reach the first method's final held-out accuracy, and the paired
held-out change of each method against the first, with the training run (seed) as the unit.

Each run is its own ``rredcot train`` process under ``out/<method>-s<seed>`` (logs and report there);
a run whose report says it finished is not run again, so an interrupted comparison resumes. A finished
run keeps its report and final model; its resumable training state (DeepSpeed's optimizer shards, some
GB per run) is dropped unless ``keep_checkpoints``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rredcot.common.errors import UserError  # noqa: E402
from rredcot.launch.observe.intervals import mean_ci  # noqa: E402
from rredcot.launch.study.stats import Interval, mean_interval  # noqa: E402
from rredcot.launch.study.step_slips import arm_slips, slips_table  # noqa: E402

log = logging.getLogger("rredcot.study")

REACH_TOLERANCE = 1e-9  # accuracies are k/n: far coarser than this


@dataclass
class Run:
    method: str
    seed: int
    summary: dict[str, Any]

    @property
    def evals(self) -> list[dict[str, Any]]:
        return self.summary["evaluations"]

    def part(self, part: str) -> list[dict[str, Any]]:
        """The evaluations of ``part``: ``held_out``, or ``train`` (``logging.eval_train``'s training
        problems, each with its evaluation's step)."""
        if part == "held_out":
            return self.evals
        return [{**e["train"], "step": e["step"]} for e in self.evals]


def arm_overrides(arm: str) -> list[str]:
    """An arm ``METHOD[@key=value...]`` (e.g. ``rredcot@credit.settings.rredcot.uniform_mix=1.0``: the
    whole RREDCoT pipeline with GRPO's σ) as config overrides, ``credit.method`` first."""
    method, *extra = arm.split("@")
    bad = [e for e in extra if "=" not in e]
    if not method or bad:
        raise UserError(
            f"arm {arm!r}: expected METHOD or METHOD@key=value[@key=value...], "
            "e.g. rredcot@credit.settings.rredcot.uniform_mix=1.0"
        )
    return [f"credit.method={method}", *extra]


def run_name(arm: str, seed: int) -> str:
    """The run (and folder) name of ``arm`` at ``seed``, within ``run.name``'s characters and length:
    ``rredcot@credit.settings.rredcot.uniform_mix=1.0`` at seed 3 is
    ``rredcot__credit.settings.rredcot.uniform_mix-1.0-s3``. An arm with a character outside
    ``[A-Za-z0-9._-@=]`` (``grpo@data.system_prompt=be brief``) or a long one keeps a readable head and
    gets a digest of the whole arm, so that it never shares a folder with another arm
    (``…be_brief-<digest>-s1``, while ``grpo@data.system_prompt=be_brief`` stays ``…be_brief-s1``)."""
    readable = arm.replace("@", "__").replace("=", "-")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", readable)
    if name != readable or len(name) > 52:  # run.name holds 64 characters
        name = f"{name[:43]}-{hashlib.sha1(arm.encode()).hexdigest()[:8]}"
    return f"{name}-s{seed}"


def check_arms(config: str, overrides: list[str], methods: list[str], seeds: int) -> None:
    """Before any run starts: no two arms share a run folder, and every arm's config loads and has
    what a run reads (its model, tokenizer and prover paths, its dataset's first rows; the doctor's
    checks), so that no arm fails only when it starts, after the earlier arms trained."""
    from rredcot.common.config import load_config
    from rredcot.common.config_schema import ConfigError
    from rredcot.launch.checks.doctor import PreflightError
    from rredcot.launch.checks.inputs import check_data, check_paths

    seen: dict[str, str] = {}
    for arm in methods:
        name = run_name(arm, 1)
        if name in seen:
            raise UserError(
                f"arms {seen[name]!r} and {arm!r} would be one run (folder {name}): "
                "give each arm of --methods once, with settings that differ"
            )
        seen[name] = arm
    for arm in methods:
        try:
            cfg = load_config(config, [*overrides, *arm_overrides(arm), f"run.name={run_name(arm, seeds)}"])
        except UserError as e:
            raise ConfigError(f"arm {arm!r}: {e}") from e
        errors = [c for c in (*check_paths(cfg), *check_data(cfg)) if c.level == "error"]
        if errors:
            found = "; ".join(f"{c.topic}: {c.found}" + (f" -> {c.fix}" if c.fix else "") for c in errors)
            raise PreflightError(f"arm {arm!r}: {found}")


def finished(folder: Path, keep_checkpoints: bool) -> dict[str, Any] | None:
    """The summary of the run in ``folder`` if its report says it finished (its training state
    dropped unless ``keep_checkpoints``), else None."""
    from rredcot.learner.checkpoint_dirs import drop_training_state

    summary_path = folder / "report" / "summary.json"
    if not summary_path.exists() or (summary := json.loads(summary_path.read_text()))["status"] != "finished":
        return None
    if not keep_checkpoints and (freed := drop_training_state(folder / "checkpoints")):
        log.info("study: dropped %.1f GB of training state of %s (kept its model)", freed / 1e9, folder)
    return summary


def train_once(
    config: str, overrides: list[str], method: str, seed: int, out: Path, keep_checkpoints: bool = False
) -> Run:
    """``rredcot train`` for one (arm, seed), unless its report says it already finished."""
    folder = out / run_name(method, seed)
    if (summary := finished(folder, keep_checkpoints)) is not None:
        log.info("study: %s already finished, reusing it", folder)
        return Run(method, seed, summary)
    args = [
        *overrides,
        *arm_overrides(method),
        f"run.sampling_seed={seed}",
        f"run.name={run_name(method, seed)}",
        f"run.dir={folder}",
        "run.resume=never",
    ]
    log.info("study: training %s (seed %d) in %s", method, seed, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(out / f"{run_name(method, seed)}.out", "w") as console:
        rc = subprocess.run(
            [sys.executable, "-m", "rredcot.launch.cli", "train", config, *args],
            stdout=console,
            stderr=subprocess.STDOUT,
        ).returncode
    if rc != 0 or (summary := finished(folder, keep_checkpoints)) is None:
        raise RuntimeError(f"the {method} run (seed {seed}) failed (exit {rc}): see {folder}/logs and {console.name}")
    return Run(method, seed, summary)


def steps_to_reach(run: Run, target: float, part: str = "held_out") -> int | None:
    """The first evaluated step whose sampled accuracy on ``part`` reaches ``target`` (None: never),
    within ``REACH_TOLERANCE``: a mean of equal accuracies can land a rounding error above them."""
    return next((e["step"] for e in run.part(part) if e["sampled"] >= target - REACH_TOLERANCE), None)


@dataclass(frozen=True)
class Paired:
    """A method's change of the final sampled held-out accuracy against the baseline's run of the
    same seed. The seed (a training run) is the unit: ``over_seeds`` is the mean of ``per_seed`` with
    its 95% t-interval (n_seeds − 1 degrees of freedom), so training luck is in its width.
    ``conditional`` is the 95% interval over ``problems`` of the seed-averaged per-problem changes:
    it holds for these trained models only (no training variance in it)."""

    per_seed: list[float]  # mean per-problem change of each seed's run against the baseline's
    over_seeds: Interval
    conditional: tuple[float, float]
    problems: int

    def as_json(self) -> dict[str, Any]:
        """``low``/``high``: the interval over seeds, None with a single seed (no training variance)."""
        seeds = self.over_seeds
        return {
            "mean": seeds.mean,
            "low": seeds.low if seeds.n > 1 else None,
            "high": seeds.high if seeds.n > 1 else None,
            "seeds": seeds.n,
            "per_seed": self.per_seed,
            "conditional_low": self.conditional[0],
            "conditional_high": self.conditional[1],
            "problems": self.problems,
        }


def paired_against(runs: list[Run], baseline: list[Run], part: str = "held_out") -> Paired:
    """Per seed, the mean per-problem change of the final sampled accuracy on ``part`` against the
    baseline method's run of that seed; their mean over seeds with its t-interval, and the
    problem-level interval conditional on these trained models."""
    base = {r.seed: r.part(part)[-1]["sampled_per_problem"] for r in baseline}
    diffs = np.array([np.subtract(r.part(part)[-1]["sampled_per_problem"], base[r.seed]) for r in runs])
    per_seed = [float(d) for d in diffs.mean(axis=1)]
    _, low, high = mean_ci([float(d) for d in diffs.mean(axis=0)], clip=None)
    return Paired(per_seed, mean_interval(per_seed), (low, high), diffs.shape[1])


def paired_cell(p: dict[str, Any]) -> str:
    """The report's paired change: the interval over seeds, then the one conditional on the models."""
    conditional = f"[{p['conditional_low']:+.3f}, {p['conditional_high']:+.3f}]"
    if p["low"] is None:
        return (
            f"{p['mean']:+.3f}, 1 seed: no interval over training runs; "
            f"conditional on this trained model {conditional} ({p['problems']} problems)"
        )
    return (
        f"{p['mean']:+.3f} [{p['low']:+.3f}, {p['high']:+.3f}] over {p['seeds']} seeds; "
        f"conditional on these trained models {conditional} ({p['problems']} problems)"
    )


def summarize(runs: list[Run], methods: list[str], part: str = "held_out") -> dict[str, Any]:
    """Per method, on ``part``'s problems: final sampled accuracy over seeds, start-to-end change,
    steps to reach the first method's final accuracy, and the paired change against the first method.
    On held-out problems with ``logging.eval_train`` in every run, the same on the training problems
    under ``train``."""
    by = {m: [r for r in runs if r.method == m] for m in methods}
    if any(not r.evals for r in runs):
        raise UserError("study compare needs held-out evaluations: set data.eval_size > 0 in the config")
    target = float(np.mean([r.part(part)[-1]["sampled"] for r in by[methods[0]]]))
    out: dict[str, Any] = {"baseline": methods[0], "target_accuracy": target, "methods": {}}
    for m, rs in by.items():
        final = [r.part(part)[-1]["sampled"] for r in rs]
        reached = [steps_to_reach(r, target, part) for r in rs]
        paired = paired_against(rs, by[methods[0]], part) if m != methods[0] else None
        out["methods"][m] = {
            "seeds": [r.seed for r in rs],
            "final_sampled": final,
            "final_sampled_mean": float(np.mean(final)),
            "start_sampled_mean": float(np.mean([r.part(part)[0]["sampled"] for r in rs])),
            "steps_to_target": reached,
            "wall_s_mean": float(np.mean([r.summary["wall_s"] for r in rs])),
            "paired_vs_baseline": None if paired is None else paired.as_json(),
        }
    if part == "held_out" and all("train" in r.evals[0] for r in runs):
        out["train"] = summarize(runs, methods, "train")
    return out


def _band(ax: Any, series: list[list[list[float]]], label: str) -> None:
    """Mean over seeds with a min–max band, on the steps every seed reported."""
    steps = sorted(set.intersection(*(set(int(p[0]) for p in s) for s in series))) if series else []
    if not steps:
        return
    ys = np.array([[dict((int(p[0]), p[1]) for p in s)[t] for t in steps] for s in series])
    (line,) = ax.plot(steps, ys.mean(axis=0), marker=".", label=f"{label} (n={len(series)})")
    ax.fill_between(steps, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)


def plot(runs: list[Run], methods: list[str], path: Path) -> None:
    parts = ["held_out", "train"] if all("train" in r.evals[0] for r in runs) else ["held_out"]
    fig, axes = plt.subplots(1, 1 + len(parts), figsize=(5.5 * (1 + len(parts)), 4))
    for m in methods:
        rs = [r for r in runs if r.method == m]
        _band(axes[0], [r.summary["training_reward"] for r in rs], m)
        for ax, part in zip(axes[1:], parts, strict=True):
            _band(ax, [[[e["step"], e["sampled"]] for e in r.part(part)] for r in rs], m)
    axes[0].set(xlabel="learner step", ylabel="mean sampled reward (training)", title="Training reward")
    for ax, part in zip(axes[1:], parts, strict=True):
        where = "held-out" if part == "held_out" else "training problems"
        ax.set(xlabel="learner step", ylabel=f"sampled accuracy ({where})", title=f"Accuracy, {where}")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(s: dict[str, Any], where: str) -> list[str]:
    """The report's table of one part (``summarize``'s output): a row per method."""
    base = s["baseline"]
    lines = [
        f"| method | {where} sampled, start → end (mean over seeds) | end, per seed | "
        f"steps to reach {base}'s final {s['target_accuracy']:.3f} | paired change vs {base} [95%, seeds the unit] | "
        "wall s |",
        "|---|---|---|---|---|---:|",
    ]
    for m, r in s["methods"].items():
        p = r["paired_vs_baseline"]
        paired = "—" if p is None else paired_cell(p)
        reached = ", ".join("never" if x is None else str(x) for x in r["steps_to_target"])
        per_seed = ", ".join(f"{x:.3f}" for x in r["final_sampled"])
        lines.append(
            f"| {m} | {r['start_sampled_mean']:.3f} → {r['final_sampled_mean']:.3f} | {per_seed} | {reached} | "
            f"{paired} | {r['wall_s_mean']:.0f} |"
        )
    return lines


def write_report(runs: list[Run], methods: list[str], meta: dict[str, Any], out: Path) -> Path:
    s = {**meta, **summarize(runs, methods)}
    slips = arm_slips({m: [r.evals for r in runs if r.method == m] for m in methods})
    if slips is not None:
        s["step_slips"] = slips
    (out / "compare.json").write_text(json.dumps(s, indent=1))
    plot(runs, methods, out / "compare_curves.png")
    lines = [
        f"# Credit methods compared: {', '.join(methods)}",
        "",
        f"- config: `{s['config']}` {' '.join(s['overrides'])}; sampling seeds 1 to {s['seeds']} per method; "
        "the same problems, data order and steps in every run",
        f"- machine: {s['machine']}",
        "",
        *_table(s, "held-out"),
    ]
    if "train" in s:
        lines += [
            "",
            "On the training problems the runs evaluated (`logging.eval_train`):",
            "",
            *_table(s["train"], "training"),
        ]
    if slips is not None:
        lines += ["", *slips_table(slips)]
    lines += ["", "![training reward and accuracy](compare_curves.png)", ""]
    path = out / "compare.md"
    path.write_text("\n".join(lines))
    return path


def compare_study(
    config: str, overrides: list[str], methods: list[str], seeds: int, out: Path, keep_checkpoints: bool = False
) -> Path:
    """Every (method, seed) run, then ``compare.md``, ``compare.json`` and ``compare_curves.png``."""
    from rredcot.common.precision import cpu_info

    check_arms(config, overrides, methods, seeds)  # every arm's name and config before the first run trains
    out.mkdir(parents=True, exist_ok=True)
    runs = [
        train_once(config, overrides, m, seed, out, keep_checkpoints) for seed in range(1, seeds + 1) for m in methods
    ]
    meta = {"config": config, "overrides": overrides, "seeds": seeds, "machine": cpu_info().describe()}
    return write_report(runs, methods, meta, out)
