"""Which weights a trained trajectory came from, judged per trajectory and not only per token.

A trajectory can mix versions (a weight update lands while it is generated, ``generation.in_flight``):
judged by its newest tokens it looks fresh while its prefix is older. Per step: the share of
trajectories that mix versions, the widest span within one, the mean lag of each trajectory's oldest
and newest tokens behind the policy being trained, the token-weighted lag, and how far behind the
policy the scorer that computed σ was. Lags count updates along the run's history (``common.lineage``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rredcot.learner.packing import TrainSample


def trajectory_metrics(
    samples: Sequence[TrainSample], at: int, position: Callable[[np.ndarray], np.ndarray], scored: bool
) -> dict[str, float]:
    """``at``: the trained policy's position; ``position``: versions → positions; ``scored``: σ came
    from a scorer (its version in ``TrainSample.scorer_version``)."""
    spans = [position(s.versions) for s in samples if len(s.versions)]
    if not spans:
        return {}
    oldest, newest = np.array([p.min() for p in spans]), np.array([p.max() for p in spans])
    tokens = np.concatenate(spans)
    out = {
        "trajectory_mixed_frac": float(np.mean(newest > oldest)),
        "trajectory_span_max": float(np.max(newest - oldest)),
        "trajectory_lag_oldest_mean": float(np.mean(np.maximum(at - oldest, 0))),
        "trajectory_lag_newest_mean": float(np.mean(np.maximum(at - newest, 0))),
        "token_lag_mean": float(np.mean(np.maximum(at - tokens, 0))),
    }
    if scored:
        scorer = position(np.array([s.scorer_version for s in samples]))
        out["scorer_lag_mean"] = float(np.mean(np.maximum(at - scorer, 0)))
    return out
