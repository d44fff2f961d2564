"""The run's learning curves (``report/curves.png``) from the monitor's history and the evaluations.

Rates are drawn per learner step from the workers' cumulative counters, from step 1 on: a worker's
first report covers its warm-up (a few quick samples over a short busy time), which as a running
average set the scale of the whole panel and flattened the steady state to a line at zero. A panel
whose value never changes says so, and why when the reason is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (panel title, tier, metric key): what the curves show when the run reported it
CURVES = [
    ("reward (sampled, training)", "learner", "reward_mean"),
    ("policy loss", "learner", "loss"),
    ("clip fraction", "learner", "clip_frac"),
    ("learner idle fraction", "learner", "idle_frac"),
]
# (panel title, tier, cumulative count key, cumulative seconds key)
RATES = [
    ("generator tokens/s", "generator", "tokens", "generate_s"),
    ("redistributor samples/s", "redistributor", "rollouts", "busy_s"),
]
# why a metric can stay at one value for a whole run
FLAT_REASONS = {
    "clip_frac": "no token's ratio π_θ/μ left the clip range on the side its advantage clips",
    "idle_frac": "the learner never waited for a batch",
}


@dataclass(frozen=True)
class Panel:
    """One panel: its title, the metric key, one line of (learner step, value) per worker."""

    title: str
    key: str
    lines: dict[str, list[tuple[int, float]]]
    zero_based: bool = False  # rates: the axis starts at 0


def rate_per_step(points: list[tuple[int, float, float]]) -> list[tuple[int, float]]:
    """One worker's rate within each learner step: Δcount / Δseconds summed over the reports that
    fall in the step. ``points``: (learner step, cumulative count, cumulative seconds) in report order.
    The first report (everything since the start) and step 0 (before the learner's first step) are
    warm-up and left out; a counter that went backwards (a restarted worker) starts afresh."""
    totals: dict[int, list[float]] = {}
    for (_, c0, s0), (step, c1, s1) in zip(points, points[1:]):
        if step == 0 or c1 < c0 or s1 < s0:
            continue
        acc = totals.setdefault(step, [0.0, 0.0])
        acc[0] += c1 - c0
        acc[1] += s1 - s0
    return [(step, c / s) for step, (c, s) in sorted(totals.items()) if s > 0]


def flat_note(key: str, values: list[float]) -> str | None:
    """The words a panel shows when its metric had one value throughout (None when it changed)."""
    if len(values) < 2 or max(values) != min(values):
        return None
    reason = FLAT_REASONS.get(key)
    return f"{values[0]:g} at every step" + (f":\n{reason}" if reason else "")


def _workers(history: list[dict[str, Any]], tier: str) -> list[str]:
    return sorted({p["worker"] for p in history if p["tier"] == tier})


def _series(history: list[dict[str, Any]], worker: str, *keys: str) -> list[tuple[Any, ...]]:
    return [
        (p["step"], *(p["values"][k] for k in keys))
        for p in history
        if p["worker"] == worker and all(k in p["values"] for k in keys)
    ]


def paired_note(evals: list[dict[str, Any]]) -> str | None:
    """The paired change of sampled accuracy, first → last evaluation, for the held-out panel: the
    two evaluations' own intervals overlap where the paired one, over the same problems, is above 0."""
    if len(evals) < 2:
        return None
    from rredcot.launch.observe.intervals import drawn_alike, paired_change

    first, last = evals[0], evals[-1]
    d, lo, hi = paired_change(first["sampled_per_problem"], last["sampled_per_problem"])
    same = " (the same draws)" if drawn_alike(first, last) else ""
    return f"sampled, paired change: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]{same}"


def _eval_panel(ax: Any, evals: list[dict[str, Any]]) -> None:
    if note := paired_note(evals):
        ax.text(0.98, 0.04, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
    if evals:
        steps = [e["step"] for e in evals]
        for name, color in (("sampled", "tab:blue"), ("greedy", "tab:orange")):
            ax.plot(steps, [e[name] for e in evals], "o-", color=color, label=f"{name} accuracy")
            lo, hi = [e[f"{name}_low"] for e in evals], [e[f"{name}_high"] for e in evals]
            ax.fill_between(steps, lo, hi, color=color, alpha=0.2)
        if "train" in evals[0]:  # ``logging.eval_train``: what the policy fits, beside what it generalises to
            ax.plot(
                steps,
                [e["train"]["sampled"] for e in evals],
                "s--",
                color="tab:green",
                label="sampled, training problems",
            )
        ax.legend(loc="best")
    else:
        ax.text(0.5, 0.5, "no held-out evaluation in this run", transform=ax.transAxes, ha="center", va="center")
    ax.set_title("held-out accuracy (95% CI)")
    ax.set_ylim(0, 1)


def rate_ceiling(values: list[float]) -> float | None:
    """The top of a rate panel's axis when a few steps would flatten the rest (None: show all). A
    step whose groups needed no credit (every sample equally rewarded) passes through the
    redistributor almost without work, and its samples/s is hundreds of times the steady rate."""
    if len(values) < 4:
        return None
    typical = float(np.percentile(values, 75))
    return 3.0 * typical if typical > 0 and max(values) > 5.0 * typical else None


def _draw(ax: Any, panel: Panel) -> None:
    for worker, pts in panel.lines.items():
        ax.plot([s for s, _ in pts], [v for _, v in pts], label=worker)
    points = [p for pts in panel.lines.values() for p in pts]
    note = flat_note(panel.key, [v for _, v in points])
    if panel.zero_based:
        ceiling = rate_ceiling([v for _, v in points])
        ax.set_ylim(0, ceiling)
        if ceiling is not None:
            above = ", ".join(f"{v:,.0f} at step {s}" for s, v in points if v > ceiling)
            note = f"off the scale: {above}"
    if note:
        ax.text(0.5, 0.97, note, transform=ax.transAxes, ha="center", va="top", fontsize=8, wrap=True)
    ax.set_title(panel.title)
    if len(panel.lines) > 1:
        ax.legend(loc="best", fontsize=8)


def panels(history: list[dict[str, Any]]) -> list[Panel]:
    """The panels beside held-out accuracy, for the metrics the run reported."""
    out = []
    for title, tier, key in CURVES:
        lines = {w: _series(history, w, key) for w in _workers(history, tier)}
        if any(lines.values()):
            out.append(Panel(title, key, {w: pts for w, pts in lines.items() if pts}))
    for title, tier, count, seconds in RATES:
        lines = {w: rate_per_step(_series(history, w, count, seconds)) for w in _workers(history, tier)}
        if any(lines.values()):
            out.append(Panel(f"{title} (per step, after warm-up)", count, {w: p for w, p in lines.items() if p}, True))
    return out


def plot_curves(history: list[dict[str, Any]], evals: list[dict[str, Any]], out: Path) -> Path:
    """``history``: points {t, tier, worker, step, values}; ``evals``: EvalResult dicts with ``step``."""
    shown = panels(history)
    cols = 2
    rows = (len(shown) + 1 + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    _eval_panel(axes[0][0], evals)
    for i, panel in enumerate(shown, start=1):
        _draw(axes[i // cols][i % cols], panel)
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        ax.set_xlabel("learner step")
        if i > len(shown):
            ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
