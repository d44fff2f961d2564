"""Where a task checks its lines (``Task.checks_slips``), each held-out evaluation counts the wrong
lines of working per kind of step (``launch.evaluate.step_counts``). From those, per compared arm:
the weak kind's slip rate against step (the kind that slips most at the start, pooled over every
run), the step at which it first falls to half its start, and the collateral: the share of the other
kinds' lines written right inside wrong traces, at the start and the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def rate(counts: dict[str, list[int]], kinds: Sequence[str]) -> float:
    """Wrong ÷ checked lines of ``kinds`` in ``counts`` ({kind: [wrong, checked]}); NaN if none."""
    wrong = sum(counts.get(k, [0, 0])[0] for k in kinds)
    checked = sum(counts.get(k, [0, 0])[1] for k in kinds)
    return wrong / checked if checked else float("nan")


def weak_kind(evals: Sequence[dict[str, Any]]) -> str:
    """The kind of step that slips most in the first evaluations of ``evals`` (pooled)."""
    pooled: dict[str, list[int]] = {}
    for e in evals:
        for kind, (wrong, checked) in e["steps"]["all"].items():
            tally = pooled.setdefault(kind, [0, 0])
            tally[0] += wrong
            tally[1] += checked
    return max(pooled, key=lambda k: pooled[k][0] / max(pooled[k][1], 1))


def halving_step(evals: Sequence[dict[str, Any]], kind: str) -> int | None:
    """The first evaluated step at which ``kind``'s slip rate is at most half its start (None: never)."""
    start = rate(evals[0]["steps"]["all"], [kind])
    return next((e["step"] for e in evals[1:] if rate(e["steps"]["all"], [kind]) <= start / 2), None)


def arm_slips(runs_evals: dict[str, list[list[dict[str, Any]]]]) -> dict[str, Any] | None:
    """Per arm (its runs' held-out evaluations, one list per seed): the weak kind's slip rate per
    evaluated step (mean over seeds), each seed's halving step, and the collateral (the other kinds'
    right share inside wrong traces) at the start and the end. None when no evaluation counts steps."""
    every = [evals for runs in runs_evals.values() for evals in runs]
    if not every or any(not evals or evals[0].get("steps") is None for evals in every):
        return None
    weak = weak_kind([evals[0] for evals in every])
    others = sorted({k for evals in every for e in evals for k in e["steps"]["all"]} - {weak})
    out: dict[str, Any] = {"weak_kind": weak, "other_kinds": others, "arms": {}}
    for arm, runs in runs_evals.items():
        steps = sorted(set.intersection(*(set(e["step"] for e in evals) for evals in runs)))
        curve = [
            float(np.nanmean([rate(e["steps"]["all"], [weak]) for evals in runs for e in evals if e["step"] == t]))
            for t in steps
        ]
        collateral = [
            float(np.nanmean([1 - rate(evals[i]["steps"]["in_wrong"], others) for evals in runs])) for i in (0, -1)
        ]
        out["arms"][arm] = {
            "steps": steps,
            "weak_slip_rate": curve,
            "halving_step": [halving_step(evals, weak) for evals in runs],
            "collateral_right_start": collateral[0],
            "collateral_right_end": collateral[1],
        }
    return out


def slips_table(s: dict[str, Any]) -> list[str]:
    """The report's lines for ``arm_slips``' result."""
    weak, others = s["weak_kind"], ", ".join(f"`{k}`" for k in s["other_kinds"])
    lines = [
        f"Lines of working on the held-out samples: `{weak}` slips most at the start; its slip rate per "
        f"evaluated step (mean over seeds), the step each seed halved it, and {others} lines written right "
        "inside wrong traces (collateral), start → end:",
        "",
        f"| method | `{weak}` slip rate by step | halved at, per seed | {others} right in wrong traces |",
        "|---|---|---|---|",
    ]
    for arm, a in s["arms"].items():
        curve = ", ".join(f"{t}: {r:.3f}" for t, r in zip(a["steps"], a["weak_slip_rate"]))
        halved = ", ".join("never" if h is None else str(h) for h in a["halving_step"])
        lines.append(
            f"| {arm} | {curve} | {halved} | {a['collateral_right_start']:.3f} → {a['collateral_right_end']:.3f} |"
        )
    return lines
