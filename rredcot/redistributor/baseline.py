"""The group baseline of exit values (``credit.settings.rredcot.baseline=group``).

Every trace of a group answers the same prompt, so what their value curves share at the same
relative position — how a value construct drifts as a trace gets longer, whatever it says — is not
credit. Trace i's exit t sits at relative segment position p = t / K_i (K_i segments); its baseline
is the mean, over the group's *other* traces j, of trace j's value curve read at p (linear between
its exits, which sit at 0, 1/K_j, …, 1). Segment rewards are then taken from v − b: the changes
trace i shows beyond those of its group at that stage of the work. Leaving trace i out keeps its own
signal out of its baseline. Rewards still telescope: Σ_k r_k = (v_K − b_K) − (v_0 − b_0).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def relative_positions(n_exits: int) -> np.ndarray:
    """0, 1/K, …, 1 for K = n_exits − 1 segments ([0] for a single exit)."""
    return np.linspace(0.0, 1.0, n_exits) if n_exits > 1 else np.zeros(n_exits)


def group_baselines(values: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    """Per trace, the leave-one-out mean of the other traces' value curves at its relative exit
    positions; None where no other trace has a curve (two or more exits, all values finite), or where
    the trace itself has none."""
    curves = {
        i: (relative_positions(len(v)), np.asarray(v, dtype=np.float64))
        for i, v in enumerate(values)
        if len(v) > 1 and np.isfinite(v).all()
    }
    out: list[np.ndarray | None] = []
    for i in range(len(values)):
        others = [c for j, c in curves.items() if j != i]
        if i not in curves or not others:
            out.append(None)
            continue
        at = curves[i][0]
        out.append(np.mean([np.interp(at, x, y) for x, y in others], axis=0))
    return out
