"""The credit study's numbers, plots (PNG) and markdown report from its per-trace results."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from rredcot.launch.study.credit import MC, TraceCredit  # noqa: E402
from rredcot.launch.study.stats import (  # noqa: E402
    Interval,
    clustered_interval,
    noise_ceiling,
    paired_interval,
    rank_agreement,
    split_half_reliability,
    subsample_std,
)

POSITION_BINS = 5  # relative exit position quintiles for the correlation-vs-position plot


SIGNS = ("all", "A>0", "A<0")  # every trace, the credited (correct) ones, the blamed (wrong) ones
PAIRED_AGAINST = "entropy"  # the method every other is compared with, trace by trace
WINDOW_ROW = re.compile(r"^rredcot:suffix:w\d+")  # a suffix construct at a window, paired with every start


@dataclass
class Agreement:
    """A method against MC over traces: Spearman and Kendall, each a mean with its interval
    clustered by group (a group's traces share a prompt and a policy sample)."""

    spearman: Interval
    kendall: Interval


def with_sign(traces: list[TraceCredit], sign: str) -> list[TraceCredit]:
    """The traces of ``sign`` (``SIGNS``)."""
    return [t for t in traces if sign == "all" or (t.advantage > 0) == (sign == "A>0")]


def _per_trace(traces: list[TraceCredit], method: str, attribute: str) -> list[tuple[float, float]]:
    return [rank_agreement(getattr(t, attribute)[method], getattr(t, attribute)[MC]) for t in traces]


def agreement(traces: list[TraceCredit], method: str, attribute: str) -> Agreement:
    """Per-trace rank agreement of ``method``'s ``segment_scores`` or ``values`` with MC's."""
    pairs, groups = _per_trace(traces, method, attribute), [t.group_id for t in traces]
    return Agreement(
        clustered_interval([p[0] for p in pairs], groups), clustered_interval([p[1] for p in pairs], groups)
    )


def paired_agreement(traces: list[TraceCredit], method: str, against: str) -> Interval:
    """Per trace, ``method``'s Spearman with MC's segment rewards less ``against``'s, clustered."""
    a, b = (_per_trace(traces, m, "segment_scores") for m in (method, against))
    return paired_interval([x[0] for x in a], [x[0] for x in b], [t.group_id for t in traces])


def every_start(method: str) -> str:
    """The row a windowed suffix row (``rredcot:suffix:w2+group``) is paired with: the same
    construct and baseline at every start (``rredcot:suffix+group``)."""
    return WINDOW_ROW.sub("rredcot:suffix", method)


def half_agreement(traces: list[TraceCredit]) -> Interval:
    """Test-retest of the ground truth: per trace, the Spearman between the segment rewards of two
    disjoint halves of its MC continuations (``split_half_reliability``), clustered by group."""
    rhos = []
    for t in traces:
        a, b = split_half_reliability(t.mc_rewards)
        rhos.append(rank_agreement(np.diff(a), np.diff(b))[0])
    return clustered_interval(rhos, [t.group_id for t in traces])


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


def _by_sign(traces: list[TraceCredit]) -> dict[str, Any]:
    """The agreement tables of one subset of traces: every method against MC, paired against
    ``PAIRED_AGAINST``, the MC test-retest agreement and the ceiling it implies."""
    methods = methods_of(traces, "segment_scores")
    halves = half_agreement(traces)
    return {
        "traces": len(traces),
        "groups": len({t.group_id for t in traces}),
        "segment_rewards": {m: asdict(agreement(traces, m, "segment_scores")) for m in methods},
        "paired": {
            m: asdict(paired_agreement(traces, m, PAIRED_AGAINST)) for m in methods if PAIRED_AGAINST in methods
        },
        "paired_windows": {
            m: asdict(paired_agreement(traces, m, every_start(m))) for m in methods if WINDOW_ROW.match(m)
        },
        "half_agreement": asdict(halves),
        "ceiling": noise_ceiling(halves.mean),
        "by_position": {m: position_correlation(traces, m) for m in methods},
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
        "by_sign": {sign: _by_sign(with_sign(traces, sign)) for sign in SIGNS if with_sign(traces, sign)},
        "exit_values": {m: asdict(agreement(traces, m, "values")) for m in methods_of(traces, "values")},
        "mc_std_by_m": {
            m: float(np.nanmean([subsample_std(t.mc_rewards, m) for t in traces]))
            for m in range(1, m_max // 2 + 1)
            if m_max // m >= 2
        },
        "cost": costs(traces),
    }


def _row(method: str, table: dict[str, Any], ceiling: float) -> str:
    rho, tau = (
        Interval(**table["segment_rewards"][method]["spearman"]),
        Interval(**table["segment_rewards"][method]["kendall"]),
    )
    share = f"{rho.mean / ceiling:.2f}" if np.isfinite(ceiling) and rho.n else "n/a"
    paired = table["paired"].get(method)
    diff = str(Interval(**paired)) if paired and method != PAIRED_AGAINST else "—"
    return f"| {method} | {rho} | {share} | {tau} | {diff} | {rho.excluded} |"


def plot_positions(summary: dict[str, Any], path: Path) -> None:
    """Agreement with MC by relative segment position, a panel per sign of A (one colour and marker
    per method; the legend beside the panels)."""
    signs = [s for s in SIGNS[1:] if s in summary["by_sign"]]
    fig, axes = plt.subplots(1, max(len(signs), 1), figsize=(5.5 * max(len(signs), 1) + 2.2, 4.2), squeeze=False)
    centers = (np.arange(POSITION_BINS) + 0.5) / POSITION_BINS
    colours, markers = plt.get_cmap("tab20").colors, "osD^vP*Xh<>p"
    for ax, sign in zip(axes[0], signs):
        table = summary["by_sign"][sign]
        for k, (m, rhos) in enumerate(sorted(table["by_position"].items())):
            ax.plot(centers, rhos, marker=markers[k % len(markers)], color=colours[(2 * k) % 20], label=m)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set(xlabel="segment start / completion length", ylabel="Spearman vs MC segment reward")
        ax.set_title(f"{sign}: {table['traces']} traces", fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=8)
    fig.suptitle("Agreement with MC by position (pooled over traces per quintile)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1 - 2.1 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(traces: list[TraceCredit], summary: dict[str, Any], out: Path) -> list[str]:
    """correlation_by_position.png (a panel per sign of A), mc_std.png and value_curves.png; returns
    their names."""
    plot_positions(summary, out / "correlation_by_position.png")

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
        if not np.isfinite(v).any():  # no value to draw (e.g. rredcot scored no branch: one segment)
            continue
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
        "Per trace, Spearman ρ and Kendall τ-b of a method's segment scores (RREDCoT: r_k for each value "
        "construct, `+group` with the group baseline; σ methods: sgn(A)·Σσ over the segment) against MC's segment "
        "rewards v_k − v_(k−1); mean over traces with its 95% interval clustered by group (a group's traces share "
        "a prompt and a policy sample). Traces where either series is constant are excluded (counted). "
        "**Ceiling**: two disjoint halves of each exit's continuations agree with ρ_half (test-retest); a method "
        "that knew the true segment rewards would reach √(2ρ_half / (1 + ρ_half)) against the full MC "
        f"(Spearman–Brown); `÷ ceiling` is a method's ρ over it. **Paired**: per trace, ρ less `{PAIRED_AGAINST}`'s; "
        "a suffix window's rows (`suffix:wW`) are also paired with the same construct at every start.",
        "",
    ]
    for sign, table in s["by_sign"].items():
        half = Interval(**table["half_agreement"])
        lines += [
            f"## Segment rewards vs MC: {sign} ({table['traces']} traces, {table['groups']} groups)",
            "",
            f"MC test-retest ρ_half {half}; ceiling {table['ceiling']:.3f}.",
            "",
            f"| method | Spearman | ÷ ceiling | Kendall | Spearman − {PAIRED_AGAINST} (paired) | excluded |",
            "|---|---|---:|---|---|---:|",
        ]
        lines += [_row(m, table, table["ceiling"]) for m in table["segment_rewards"]]
        lines.append("")
        if table["paired_windows"]:
            lines += ["| suffix window, paired with every start | Spearman difference |", "|---|---|"]
            lines += [f"| {m} − {every_start(m)} | {Interval(**d)} |" for m, d in table["paired_windows"].items()]
            lines.append("")
    lines += ["## Exit values vs MC", "", "| method | Spearman | Kendall | excluded |", "|---|---|---|---:|"]
    for m, a in s["exit_values"].items():
        rho, tau = Interval(**a["spearman"]), Interval(**a["kendall"])
        lines.append(f"| {m} | {rho} | {tau} | {rho.excluded} |")
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
