"""Where a run's time goes (``report/timeline.png``), and which tier bounds it.

Every worker reports cumulative seconds per activity (``GeneratorMetrics``, the redistributor's
``WorkerMetrics``, the learner's totals); between two of its reports the increase of each, over the
wall time between them, is the share of that interval it spent so. What no counter covers is the
tier's remainder: the generators' verifying and publishing, the redistributors' waiting for rollouts,
the learner's checkpoints. The tier that waits least bounds the run: the others wait for it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# per tier: (activity, the cumulative-seconds keys it adds, those it subtracts); then the remainder
ACTIVITIES: dict[str, list[tuple[str, tuple[str, ...], tuple[str, ...]]]] = {
    "generator": [
        ("generate", ("generate_s",), ()),
        ("load weights", ("weight_update_s",), ()),
        ("wait: staleness", ("blocked_staleness_s",), ()),
        ("wait: backpressure", ("blocked_backpressure_s",), ()),
    ],
    "redistributor": [("score", ("busy_s",), ())],
    "learner": [
        ("train", ("busy_s",), ("broadcast_s_total",)),
        ("broadcast", ("broadcast_s_total",), ()),
        ("wait: batch", ("wait_s",), ()),
    ],
}
REMAINDER = {"generator": "verify, publish", "redistributor": "wait: rollouts", "learner": "checkpoint, other"}
# what counts as waiting for another tier
WAITS = {
    "generator": ("wait: staleness", "wait: backpressure"),
    "redistributor": ("wait: rollouts",),
    "learner": ("wait: batch",),
}
TIERS = ("generator", "redistributor", "learner")
BALANCED = 0.10  # below this share of waiting in every tier, no tier stands out
COLORS = {
    "generate": "tab:blue",
    "score": "tab:purple",
    "train": "tab:green",
    "load weights": "tab:cyan",
    "broadcast": "tab:olive",
    "verify, publish": "tab:gray",
    "checkpoint, other": "tab:gray",
    "wait: staleness": "tab:red",
    "wait: backpressure": "tab:orange",
    "wait: rollouts": "tab:pink",
    "wait: batch": "tab:brown",
}


@dataclass(frozen=True)
class WorkerTimeline:
    """One worker: its report times (seconds since the run's first report) and, per activity, the
    share of each interval between two consecutive reports spent on it (the last: the remainder)."""

    worker: str
    tier: str
    times: list[float]  # the report that starts the first interval, then the end of each
    shares: dict[str, list[float]]  # per activity, one share per interval
    seconds: dict[str, float]  # each activity's total over the worker's observed window


def _activity_seconds(tier: str, values: dict[str, float]) -> dict[str, float]:
    return {
        name: sum(values.get(k, 0.0) for k in plus) - sum(values.get(k, 0.0) for k in minus)
        for name, plus, minus in ACTIVITIES[tier]
    }


def worker_timelines(history: list[dict[str, Any]]) -> list[WorkerTimeline]:
    """Per worker of a tier in ``ACTIVITIES`` with at least two reports, its activity shares."""
    start = min((p["t"] for p in history), default=0.0)
    points: dict[str, list[dict[str, Any]]] = {}
    for p in history:
        if p["tier"] in ACTIVITIES:
            points.setdefault(p["worker"], []).append(p)
    out = []
    for worker, ps in sorted(points.items()):
        ps = sorted(ps, key=lambda p: p["t"])
        tier = ps[0]["tier"]
        names = [a for a, _, _ in ACTIVITIES[tier]] + [REMAINDER[tier]]
        shares: dict[str, list[float]] = {n: [] for n in names}
        totals = dict.fromkeys(names, 0.0)
        times = []
        for before, after in zip(ps, ps[1:]):
            dt = after["t"] - before["t"]
            if dt <= 0:
                continue
            a, b = _activity_seconds(tier, before["values"]), _activity_seconds(tier, after["values"])
            used = {n: min(max(b[n] - a[n], 0.0), dt) for n in a}
            scale = min(1.0, dt / max(sum(used.values()), 1e-12))  # counters a little ahead of the clock
            used = {n: s * scale for n, s in used.items()}
            used[REMAINDER[tier]] = dt - sum(used.values())
            times += [before["t"] - start] if not times else []
            times.append(after["t"] - start)
            for n in names:
                shares[n].append(used[n] / dt)
                totals[n] += used[n]
        if times:
            out.append(WorkerTimeline(worker, tier, times, shares, totals))
    return out


def waiting(timelines: list[WorkerTimeline]) -> dict[str, float]:
    """Per tier, the share of its workers' observed time spent waiting for another tier."""
    out = {}
    for tier in TIERS:
        ws = [w for w in timelines if w.tier == tier]
        total = sum(sum(w.seconds.values()) for w in ws)
        if total > 0:
            out[tier] = sum(w.seconds[n] for w in ws for n in WAITS[tier]) / total
    return out


def bottleneck(timelines: list[WorkerTimeline]) -> str:
    """One sentence: the tier that bounds the run (the one that waits least), with every tier's wait."""
    waits = waiting(timelines)
    if not waits:
        return "no tier reported twice: nothing to say about where the time went"
    shares = ", ".join(f"{t}s {w:.0%}" for t, w in waits.items())
    if all(w < BALANCED for w in waits.values()):
        return f"balanced: no tier waits for another more than {BALANCED:.0%} of the time ({shares} waiting)"
    tier = min(waits, key=waits.get)
    return f"the {tier}s bound this run: they wait least for the others (time spent waiting: {shares})"


def plot_timeline(history: list[dict[str, Any]], out: Path) -> tuple[Path, str]:
    """``report/timeline.png``: per worker, the share of each interval per activity, over wall time;
    returns the file and the bottleneck sentence (its title)."""
    timelines = worker_timelines(history)
    verdict = bottleneck(timelines)
    rows = max(len(timelines), 1)
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1.9 * rows + 0.9), sharex=True, squeeze=False)
    span = max((w.times[-1] for w in timelines), default=0.0)
    unit, per = ("minutes", 60.0) if span > 180 else ("seconds", 1.0)
    for ax, w in zip(axes[:, 0], timelines):
        x = [t / per for t in w.times]  # each interval's share holds from its start to its end
        names = list(w.shares)
        ys = [w.shares[n] + w.shares[n][-1:] for n in names]
        ax.stackplot(x, *ys, labels=names, colors=[COLORS[n] for n in names], step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel(w.worker, rotation=0, ha="right", va="center")
        ax.set_yticks([0, 0.5, 1])
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    if not timelines:
        axes[0, 0].text(0.5, 0.5, "no worker reported twice", ha="center", va="center")
    axes[-1, 0].set_xlabel(f"{unit} since the run's first report")
    fig.suptitle(textwrap.fill(verdict, 110), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out, verdict
