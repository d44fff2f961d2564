"""Which weights a trained trajectory came from, judged per trajectory and not only per token.

A trajectory can mix versions (a weight update lands while it is generated, ``generation.in_flight``):
judged by its newest tokens it looks fresh while its prefix is older. Per step: the share of
trajectories that mix versions, the widest span within one, the mean lag of each trajectory's oldest
and newest tokens behind the policy being trained, the token-weighted lag, and how far behind the
policy the scorer that computed σ was. Per trained group, the same truth for the ledger
(``ledger_versions``). Lags count updates along the run's history (``common.lineage``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from rredcot.common.ledger import GroupVersions
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


def ledger_versions(
    spans: dict[str, tuple[list[int], int]], learner: int, position: Callable[[np.ndarray | int], np.ndarray]
) -> dict[str, GroupVersions]:
    """Each group's ``GroupVersions`` from the versions of its tokens and its scorer (``batches.version_span``)
    and the ``learner`` version that trains it. Oldest and newest are judged by position, not by
    number (a restore renumbers); the lag is never negative (``ahead_tokens`` counts those)."""
    at = int(position(learner))
    out = {}
    for g, (versions, scorer) in spans.items():
        where = position(np.asarray(versions))
        oldest, newest = versions[int(np.argmin(where))], versions[int(np.argmax(where))]
        out[g] = GroupVersions(oldest, newest, scorer, learner, max(at - int(where.min()), 0))
    return out
