"""The credit study's numbers, plots (PNG) and markdown report from its per-trace results."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rredcot.launch.study.credit import MC, TraceCredit  # noqa: E402
from rredcot.launch.study.stats import Interval, mean_interval, rank_agreement, subsample_std  # noqa: E402

POSITION_BINS = 5  # relative exit position quintiles for the correlation-vs-position plot


@dataclass
class Agreement:
    """A method against MC over traces: Spearman and Kendall, each a mean with its interval."""

    spearman: Interval
    kendall: Interval


def agreement(traces: list[TraceCredit], method: str, attribute: str) -> Agreement:
    """Per-trace rank agreement of ``method``'s ``segment_scores`` or ``values`` with MC's."""
    pairs = [rank_agreement(getattr(t, attribute)[method], getattr(t, attribute)[MC]) for t in traces]
    return Agreement(mean_interval([p[0] for p in pairs]), mean_interval([p[1] for p in pairs]))


def methods_of(traces: list[TraceCredit], attribute: str) -> list[str]:
    return sorted({m for t in traces for m in getattr(t, attribute)} - {MC})


def position_correlation(traces: list[TraceCredit], method: str) -> list[float]:
    """Spearman of ``method``'s segment scores with MC's segment rewards, pooled over traces within
    each quintile of relative segment position (start of the segment ÷ completion length)."""
    pos, ours, mc = [], [], []
    for t in traces:
        pos += list(t.exits[:-1] / max(t.length, 1))
        ours += list(t.segment_scores[method])
        mc += list(t.segment_scores[MC])
    bins = np.minimum((np.asarray(pos) * POSITION_BINS).astype(int), POSITION_BINS - 1)
    return [rank_agreement(np.asarray(ours)[bins == b], np.asarray(mc)[bins == b])[0] for b in range(POSITION_BINS)]


def costs(traces: list[TraceCredit]) -> dict[str, dict[str, float]]:
    """Mean tokens and seconds per trace of each method."""
    methods = sorted({m for t in traces for m in t.cost})
    return {
        m: {
            "tokens": float(np.mean([t.cost[m].tokens for t in traces if m in t.cost])),
            "seconds": float(np.mean([t.cost[m].seconds for t in traces if m in t.cost])),
        }
        for m in methods
    }


def summarize(traces: list[TraceCredit], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything the report shows, as plain data (also written as ``study.json``)."""
    m_max = max(t.mc_rewards.shape[1] for t in traces)
    return {
        **meta,
        "traces": len(traces),
        "groups": len({t.group_id for t in traces}),
        "mean_length": float(np.mean([t.length for t in traces])),
        "mean_segments": float(np.mean([len(t.exits) - 1 for t in traces])),
        "mc_stderr_mean": float(np.mean(np.concatenate([t.mc_stderr for t in traces]))),
        "segment_rewards": {
            m: asdict(agreement(traces, m, "segment_scores")) for m in methods_of(traces, "segment_scores")
        },
        "exit_values": {m: asdict(agreement(traces, m, "values")) for m in methods_of(traces, "values")},
        "by_position": {m: position_correlation(traces, m) for m in methods_of(traces, "segment_scores")},
        "mc_std_by_m": {
            m: float(np.nanmean([subsample_std(t.mc_rewards, m) for t in traces]))
            for m in range(1, m_max // 2 + 1)
            if m_max // m >= 2
        },
        "cost": costs(traces),
    }


def _row(method: str, a: dict[str, Any]) -> str:
    rho, tau = Interval(**a["spearman"]), Interval(**a["kendall"])
    return f"| {method} | {rho} | {tau} | {rho.excluded} |"


def plot(traces: list[TraceCredit], summary: dict[str, Any], out: Path) -> list[str]:
    """correlation_by_position.png, mc_std.png and value_curves.png; returns their names."""
    fig, ax = plt.subplots(figsize=(7, 4))
    centers = (np.arange(POSITION_BINS) + 0.5) / POSITION_BINS
    for m, rhos in summary["by_position"].items():
        ax.plot(centers, rhos, marker="o", label=m)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(xlabel="segment start / completion length", ylabel="Spearman vs MC segment reward")
    ax.set_title("Agreement with MC by position")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "correlation_by_position.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ms = sorted(int(m) for m in summary["mc_std_by_m"])
    ax.plot(ms, [summary["mc_std_by_m"][m] for m in ms], marker="o", label="measured (disjoint subsets)")
    if ms:
        s1 = summary["mc_std_by_m"][ms[0]] * np.sqrt(ms[0])
        ax.plot(ms, [s1 / np.sqrt(m) for m in ms], ls="--", label="1/√m from the first point")
    ax.set(xlabel="continuations per exit (m)", ylabel="std of the MC value", title="MC noise vs continuations")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "mc_std.png", dpi=110)
    plt.close(fig)

    trace = max(traces, key=lambda t: (np.ptp(t.values[MC]), len(t.exits)))  # the most informative MC curve
    fig, ax = plt.subplots(figsize=(7, 4))
    for m, v in sorted(trace.values.items()):
        finite = np.where(np.isfinite(v), v, np.nan)
        span = np.nanmax(finite) - np.nanmin(finite)
        scaled = (finite - np.nanmin(finite)) / span if span > 0 else np.zeros_like(finite)
        if m == MC:
            ax.errorbar(trace.exits, finite, yerr=trace.mc_stderr, marker="o", label="mc (success prob ± s.e.)")
        else:
            ax.plot(trace.exits, scaled, marker=".", label=f"{m} (min-max scaled)")
    ax.set(xlabel="exit point (completion token)", ylabel="value")
    ax.set_title(f"Exit values of one trace ({trace.group_id}/{trace.sample_index})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "value_curves.png", dpi=110)
    plt.close(fig)
    return ["correlation_by_position.png", "mc_std.png", "value_curves.png"]


def write_report(traces: list[TraceCredit], meta: dict[str, Any], out: Path) -> Path:
    """``study.json``, the PNGs and ``study.md`` under ``out``; returns the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    s = summarize(traces, meta)
    (out / "study.json").write_text(json.dumps(s, indent=1, default=float))
    pngs = plot(traces, s, out)
    mc_cost = s["cost"].get(MC, {"tokens": 0, "seconds": 0})
    lines = [
        "# Credit study: every method against Monte Carlo on the policy",
        "",
        f"- policy (traces and MC continuations): `{s['checkpoint']}`; scorer: the same weights",
        f"- config: `{s['config']}`; traces from: {s['source']}",
        f"- {s['traces']} traces (samples with a non-zero advantage) from {s['groups']} groups; mean length "
        f"{s['mean_length']:.0f} tokens, {s['mean_segments']:.1f} segments",
        f"- MC: {s['mc_samples']} continuations per exit point, each within the token budget left there; "
        f"mean standard error of an exit value {s['mc_stderr_mean']:.3f}",
        f"- machine: {s['machine']}",
        "",
        "Per trace, Spearman ρ and Kendall τ-b of a method's segment scores (RREDCoT: r_k in its value space; "
        "σ methods: sgn(A)·Σσ over the segment) against MC's segment rewards v_k − v_(k−1); mean over traces with "
        "its 95% t-interval. Traces where either series is constant are excluded (counted).",
        "",
        "## Segment rewards vs MC",
        "",
        "| method | Spearman | Kendall | excluded |",
        "|---|---|---|---:|",
    ]
    for m, a in s["segment_rewards"].items():
        lines.append(_row(m, a))
    lines += ["", "## Exit values vs MC", "", "| method | Spearman | Kendall | excluded |", "|---|---|---|---:|"]
    lines += [_row(m, a) for m, a in s["exit_values"].items()]
    lines += ["", "## Cost per trace", "", "| method | tokens | seconds | MC ÷ method (seconds) |"]
    lines += ["|---|---:|---:|---:|"]
    for m, c in s["cost"].items():
        ratio = mc_cost["seconds"] / c["seconds"] if c["seconds"] else float("nan")
        lines.append(f"| {m} | {c['tokens']:.0f} | {c['seconds']:.3f} | {ratio:.1f} |")
    lines += ["", "Tokens: forwarded through the scorer (trace + branches), or generated (MC continuations).", ""]
    lines += [f"![{p}]({p})" for p in pngs]
    path = out / "study.md"
    path.write_text("\n".join(lines) + "\n")
    return path
