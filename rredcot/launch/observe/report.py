"""The end-of-run report: markdown and JSON summaries (with what σ did), PNG learning curves, credit
heatmaps, final model link.

Written at every end of ``rredcot train`` — finished, interrupted (SIGTERM / Ctrl-C) or failed —
from what the driver holds in memory, so it needs neither Ray nor Redis to be alive.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rredcot.common.config import Config, redacted, to_yaml
from rredcot.common.ledger import Balance
from rredcot.common.precision import cpu_info, dtype_settings, planned_dtype
from rredcot.launch.observe.curves import plot_curves
from rredcot.launch.observe.timeline import bottleneck, plot_timeline, worker_timelines

HISTORY_FILE = "metrics.jsonl"  # under report/: every worker report the monitor saw, as it came
HEATMAP_CANDIDATES = 32  # saved groups the report reads to choose its heatmaps from

if TYPE_CHECKING:
    from rredcot.common.control import RunControl
    from rredcot.common.records import WeightedGroup, WeightedSample
    from rredcot.launch.observe.monitor import Monitor, Phases
    from rredcot.redistributor.blame import SlipBlame, SlipChecker


def _fmt(e: dict[str, Any], name: str) -> str:
    return f"{e[name]:.3f} [{e[f'{name}_low']:.3f}, {e[f'{name}_high']:.3f}]"


def _accuracy_section(title: str, evals: list[dict[str, Any]], over: str) -> list[str]:
    """A summary section: the accuracy at every evaluation, then the paired change first → last."""
    first, last = evals[0], evals[-1]
    lines = [
        f"## {title} ({first['problems']} problems, {first['samples_per_problem']} samples each at "
        "the sampling temperature; 95% intervals over problems)",
        "",
        "| learner step | policy version | sampled | greedy |",
        "|---:|---:|---|---|",
    ]
    lines += [f"| {e['step']} | {e['version']} | {_fmt(e, 'sampled')} | {_fmt(e, 'greedy')} |" for e in evals]
    if len(evals) > 1:
        from rredcot.launch.observe.intervals import drawn_alike, paired_change

        d, lo, hi = paired_change(first["sampled_per_problem"], last["sampled_per_problem"])
        verdict = "improved" if lo > 0 else ("got worse" if hi < 0 else "did not change measurably")
        if drawn_alike(first, last):
            over += ", each problem with the same draws both times, `logging.eval_same_draws`"
        lines += [
            "",
            f"Sampled accuracy {verdict}: {first['sampled']:.3f} → {last['sampled']:.3f}, a change of "
            f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] (95% interval of the mean per-problem change, paired "
            f"over the same {over}).",
        ]
    return lines


def credit_summary(last: dict[str, dict[str, Any]], checks_slips: bool) -> dict[str, Any] | None:
    """What σ did over every trace the redistributors weighted (their counters in ``last``, each
    worker's final report, summed): segments per trace, max σ·|o| on wrong traces and, where the task
    has a slip checker (``checks_slips``), how often a wrong trace's most blame fell on the line it
    names; None when no redistributor reported."""
    counters = [values for values in last.values() if values.get("tier") == "redistributor"]
    if not counters:
        return None

    def total(name: str) -> float:
        return sum(float(values.get(name, 0.0)) for values in counters)

    def mean(name: str, over: str) -> float | None:
        return total(name) / total(over) if total(over) else None

    slips = {
        "slip_named_traces": int(total("slip_named")),
        "top_blame_on_slip": mean("slip_top_blame", "slip_named"),
        "top_blame_on_slip_chance": mean("slip_top_chance", "slip_named"),
    }
    return {
        "segmented_traces": int(total("segmented_samples")),
        "segments_per_trace": mean("segments", "segmented_samples"),
        "wrong_traces": int(total("wrong_samples")),
        "sigma_max_scaled_wrong_mean": mean("wrong_sigma_peak_sum", "wrong_samples"),
        **(slips if checks_slips else dict.fromkeys(slips)),
    }


# what the project's own study found, under every run's credit section (docs/study.md, issue 60)
STUDY_LINE = (
    "- What σ changes in learning: at the project's CPU scale nothing measurable, not even a σ known to be "
    "right (docs/study.md#where-credit-can-pay-a-positive-control-issue-60); this section shows where blame lands."
)


def _credit_section(credit: dict[str, Any]) -> list[str]:
    """The summary's lines on what σ did (``credit_summary``)."""
    lines = ["## Credit (σ: each token's share of its trace's advantage; GRPO's is uniform, 1/|o|)", ""]
    if credit["segments_per_trace"] is None:
        lines.append("- Segments per trace: none (the credit method does not segment traces).")
    else:
        lines.append(
            f"- Segments per trace: {credit['segments_per_trace']:.2f} "
            f"(mean over the {credit['segmented_traces']} traces the credit method segmented)."
        )
    if credit["sigma_max_scaled_wrong_mean"] is None:
        lines.append("- σ's distance from uniform on wrong traces: no wrong trace took blame (A < 0).")
    else:
        lines.append(
            f"- σ's distance from uniform on wrong traces: mean max σ·|o| {credit['sigma_max_scaled_wrong_mean']:.2f} "
            f"over {credit['wrong_traces']} wrong traces taking blame (1.00: uniform)."
        )
    if credit["slip_named_traces"] is None:
        lines.append("- The task has no slip checker: no line to hold σ's blame against.")
    elif credit["top_blame_on_slip"] is None:
        lines.append("- The task's checker named the first wrong line of no wrong trace's working.")
    else:
        lines.append(
            f"- Most blame on the first wrong line the task's checker names: {credit['top_blame_on_slip']:.2f} of "
            f"{credit['slip_named_traces']} wrong traces (ties share; a random pick among their lines of working: "
            f"{credit['top_blame_on_slip_chance']:.2f})."
        )
    lines.append(STUDY_LINE)
    return [*lines, ""]


def write_summary(
    out: Path,
    cfg_yaml: str,
    evals: list[dict[str, Any]],
    final: dict[str, dict[str, Any]],
    wall_s: float,
    artefacts: dict[str, str],
    status: str = "finished",
    phases: dict[str, float] | None = None,
    ledger: Balance | None = None,
    time_verdict: str = "",
    credit: dict[str, Any] | None = None,
    about: str = "",
) -> Path:
    lines = [
        "# rredcot run report",
        "",
        *([about, ""] if about else []),
        f"Status: {status}. Wall time: {wall_s / 60:.1f} min",
    ]
    if phases:
        lines[-1] += " (" + ", ".join(f"{name} {sec / 60:.1f}" for name, sec in phases.items()) + ")"
    lines.append("")
    if time_verdict:
        lines += [f"Where the time went (`timeline.png`): {time_verdict}.", ""]
    if evals:
        lines += _accuracy_section("Held-out accuracy", evals, "held-out problems")
    if evals and "train" in evals[0]:
        train = [{**e["train"], "step": e["step"]} for e in evals]
        lines += [
            "",
            *_accuracy_section("Accuracy on training problems (`logging.eval_train`)", train, "training problems"),
        ]
    if credit is not None:
        lines += ["", *_credit_section(credit)]
    if ledger is not None:
        lines += ["", "## Ledger (every admitted prompt group)", "", ledger.line() + ".", ""]
        lines += ["| outcome | groups | by mean completion length |", "|---|---:|---|"]
        for outcome in ("trained", "dead", "rejected"):
            buckets = ", ".join(f"{b}: {n}" for b, n in sorted(ledger.by_length.get(outcome, {}).items()))
            lines.append(f"| {outcome} | {getattr(ledger, outcome)} | {buckets} |")
        if ledger.dead_by_reason or ledger.dead_unattributed:
            reasons = dict(ledger.dead_by_reason) | (
                {"unreadable": ledger.dead_unattributed} if ledger.dead_unattributed else {}
            )
            lines += ["", "Dead letters by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) + "."]
        if ledger.rejected_by_reason:
            rejected = ledger.rejected_by_reason.items()
            lines += ["", "Rejected by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(rejected)) + "."]
        if ledger.trained_by_lag:
            lags = ", ".join(f"{lag}: {n}" for lag, n in sorted(ledger.trained_by_lag.items()))
            lines += ["", f"Trained groups by the lag of their oldest token (updates behind the learner): {lags}."]
    lines += ["", "## Final counters per worker", "", "| worker | tier | metrics |", "|---|---|---|"]
    for worker, values in sorted(final.items()):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(values.items()) if k != "tier" and isinstance(v, float))
        lines.append(f"| {worker} | {values.get('tier', '')} | {shown} |")
    lines += ["", "## Files", ""] + [f"- {k}: `{v}`" for k, v in artefacts.items()]
    lines += ["", "## Config", "", "```yaml", cfg_yaml.rstrip(), "```", ""]
    out.write_text("\n".join(lines))
    return out


@dataclass
class RunOutcome:
    """What the driver knows at the end of a run, whatever the end was."""

    status: str  # finished | interrupted (...) | failed: ...
    phases: Phases
    cfg: Config | None = None  # with the Redis URL the run used
    control: RunControl | None = None
    monitor: Monitor | None = None
    refs: dict[Any, tuple[str, int]] = field(default_factory=dict)  # Ray refs of the workers' run()
    learner_stopped: bool | None = None  # on a stop: did every learner rank return (and checkpoint) in time
    ledger: Balance | None = None  # what became of every admitted prompt (``common.ledger``)
    apart: dict[str, str] = field(default_factory=dict)  # nodes without the shared run.dir (``launch.observe.gather``)


def training_reward(history: list[dict[str, Any]]) -> list[list[float]]:
    """[step, mean sampled reward] of learner rank 0's batches, one point per step it reported."""
    points: dict[int, float] = {}
    for p in history:
        if p["worker"] == "learner0" and "reward_mean" in p["values"]:
            points[int(p["values"].get("step", p["step"]))] = p["values"]["reward_mean"]
    return [[step, points[step]] for step in sorted(points)]


def summary_json(cfg: Config, outcome: RunOutcome, artefacts: dict[str, str]) -> dict[str, Any]:
    """The machine-readable summary: evaluations, paired change, what σ did, phases, dtype and CPU."""
    from rredcot.launch.observe.intervals import paired_change
    from rredcot.tasks.task import build_task

    monitor = outcome.monitor
    evals = monitor.evals if monitor else []

    def paired(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
        d, lo, hi = paired_change(first["sampled_per_problem"], last["sampled_per_problem"])
        return {"sampled_change": d, "low": lo, "high": hi, "problems": len(first["sampled_per_problem"])}

    many = len(evals) > 1
    info = cpu_info()
    model, learner = (planned_dtype(requested, on_gpu) for _, requested, on_gpu in dtype_settings(cfg))
    return {
        "run": cfg.run.name,
        "status": outcome.status,
        "steps": monitor.step if monitor else 0,
        "steps_planned": cfg.run.steps,
        "learner_stopped_in_time": outcome.learner_stopped,
        "wall_s": outcome.phases.elapsed(),
        "phases_s": outcome.phases.closed(),
        "evaluations": evals,  # with each problem's sampled accuracy, for paired comparisons between runs
        "paired_change": paired(evals[0], evals[-1]) if many else None,
        # on the first ``logging.eval_train`` training problems (each evaluation's ``train``)
        "paired_change_train": paired(evals[0]["train"], evals[-1]["train"]) if many and "train" in evals[0] else None,
        "training_reward": training_reward(monitor.history) if monitor else [],
        "credit": credit_summary(monitor.last, build_task(cfg.task).checks_slips) if monitor else None,
        "bottleneck": bottleneck(worker_timelines(monitor.history)) if monitor else "",
        "workers": {  # every worker's last report: its tier and counters
            w: {k: v for k, v in values.items() if k == "tier" or isinstance(v, float)}
            for w, values in (monitor.last.items() if monitor else [])
        },
        "dtype": {"model": model.dtype, "learner": learner.dtype, "why": model.reason},
        "cpu": {"model": info.model, "flags": info.speed_flags()},
        "ledger": None if outcome.ledger is None else outcome.ledger.as_dict(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": artefacts,
    }


def write_report(cfg: Config, run_dir: Path, outcome: RunOutcome) -> dict[str, str]:
    """Curves, heatmaps, the final model link, ``summary.md`` and ``summary.json``; returns the files."""
    monitor = outcome.monitor
    assert monitor is not None
    report_dir = run_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    artefacts = {
        "learning curves": str(plot_curves(monitor.history, monitor.evals, report_dir / "curves.png")),
    }
    timeline, verdict = plot_timeline(monitor.history, report_dir / "timeline.png")
    artefacts |= {"timeline": str(timeline), "tensorboard": str(run_dir / "tensorboard")}
    artefacts.update({f"credit heatmap {i}": p for i, p in enumerate(render_heatmaps(cfg, run_dir, report_dir))})
    final_model = link_final_model(run_dir, report_dir)
    if final_model is not None:
        artefacts["final HF model"] = str(final_model)
    artefacts["summary"] = str(report_dir / "summary.md")
    artefacts["summary (JSON)"] = str(report_dir / "summary.json")
    summary = summary_json(cfg, outcome, artefacts)
    write_summary(
        report_dir / "summary.md",
        to_yaml(redacted(cfg)),
        monitor.evals,
        monitor.last,
        outcome.phases.elapsed(),
        artefacts,
        outcome.status,
        outcome.phases.closed(),
        outcome.ledger,
        verdict,
        summary["credit"],
        cfg.run.about,
    )
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return artefacts


def render_heatmaps(cfg: Config, run_dir: Path, report_dir: Path, limit: int = 3) -> list[str]:
    """Heatmaps of the traces the redistributors saved under ``run_dir/traces`` (``choose_heatmaps``),
    each wrong trace's caption naming the line the task's slip checker names."""
    files = sorted((run_dir / "traces").glob("*.msgpack"))[:HEATMAP_CANDIDATES]
    if not files:
        return []
    from rredcot.models.store import load_decoder, resolve_model_path
    from rredcot.redistributor.blame import SlipChecker
    from rredcot.redistributor.heatmap import load_group, render_heatmap

    tok = load_decoder(cfg.model.tokenizer or resolve_model_path(cfg.model.path, seed=cfg.run.seed))
    groups = {f.stem: load_group(str(f), None) for f in files}
    out = []
    for name, sample, blame in choose_heatmaps(groups, SlipChecker.of(cfg, tok), limit):
        html = report_dir / f"heatmap_{name}.html"
        render_heatmap(sample, tok, html, html.with_suffix(".png"), blame)
        out.append(str(html))
    return out


def choose_heatmaps(
    groups: dict[str, WeightedGroup], checker: SlipChecker | None, limit: int
) -> list[tuple[str, WeightedSample, SlipBlame | None]]:
    """Up to ``limit`` (group name, sample, its blame), one sample a group: first, where the task has
    a checker, the wrong trace whose most blame is most on the checker's first wrong line (the first
    in name order among equals), then each other group's most-credited sample (largest |A|)."""

    def blame(group: WeightedGroup, sample: WeightedSample) -> SlipBlame | None:
        return checker.blame(sample, group.prompt_id) if checker else None

    named = [(b, name, s) for name, g in groups.items() for s in g.samples if (b := blame(g, s)) is not None]
    shown = []
    if named:
        best, name, sample = max(named, key=lambda found: found[0].top)
        shown.append((name, sample, best))
    taken = {name for name, _, _ in shown}
    for name, group in groups.items():
        if name not in taken:
            sample = max(group.samples, key=lambda s: abs(s.advantage))
            shown.append((name, sample, blame(group, sample)))
    return shown[:limit]


def link_final_model(run_dir: Path, report_dir: Path) -> Path | None:
    """Link the newest checkpoint's HF directory as ``report/final_model``, by a relative path (the
    link survives moving or copying the run directory)."""
    from rredcot.learner.checkpoint_dirs import latest_checkpoint

    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        return None
    link = report_dir / "final_model"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(ckpt / "hf", report_dir), target_is_directory=True)
    return link


def read_history(path: Path) -> list[dict[str, Any]]:
    """The monitor's history saved in ``path`` (a line cut short by a run still writing is skipped)."""
    points = []
    for line in path.read_text().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return points


def redraw(run_dir: Path) -> tuple[list[Path], str]:
    """``rredcot report RUN``: the curves and the timeline of a finished or running run, from what it
    saved (``report/metrics.jsonl``, and the evaluations of ``report/summary.json`` once it exists);
    returns the files and the bottleneck sentence."""
    report_dir = run_dir / "report"
    if not (report_dir / HISTORY_FILE).is_file():
        raise FileNotFoundError(f"{report_dir / HISTORY_FILE} not found: is {run_dir} a run directory?")
    history = read_history(report_dir / HISTORY_FILE)
    summary = report_dir / "summary.json"
    evals = json.loads(summary.read_text())["evaluations"] if summary.is_file() else []
    curves = plot_curves(history, evals, report_dir / "curves.png")
    timeline, verdict = plot_timeline(history, report_dir / "timeline.png")
    return [curves, timeline], verdict
