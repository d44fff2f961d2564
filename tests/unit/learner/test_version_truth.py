"""Per-trajectory version truth, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.common.ledger import GroupVersions
from rredcot.learner.packing import TrainSample
from rredcot.learner.version_truth import ledger_versions, trajectory_metrics


def sample(versions: list[int], scorer: int = 0) -> TrainSample:
    n = len(versions)
    z = np.zeros(n, np.float32)
    return TrainSample("s", np.arange(3), np.arange(n), z, z + 1 / n, np.array(versions, np.int32), 1.0, 1.0, scorer)


def test_a_trajectory_that_mixes_versions_is_judged_by_its_oldest_tokens_too():
    # trained at version 5: one trajectory all of v4; one started under v2, finished under v4 (an update mid-request)
    samples = [sample([4, 4, 4, 4], scorer=3), sample([2, 2, 3, 4], scorer=5)]
    out = trajectory_metrics(samples, 5, lambda v: np.asarray(v, np.int64), scored=True)
    assert out == {
        "trajectory_mixed_frac": 0.5,
        "trajectory_span_max": 2.0,
        "trajectory_lag_oldest_mean": pytest.approx((1 + 3) / 2),
        "trajectory_lag_newest_mean": pytest.approx((1 + 1) / 2),
        "token_lag_mean": pytest.approx((4 * 1 + 3 + 3 + 2 + 1) / 8),
        "scorer_lag_mean": pytest.approx((2 + 0) / 2),
    }
    assert "scorer_lag_mean" not in trajectory_metrics(samples, 5, lambda v: np.asarray(v), scored=False)
    assert trajectory_metrics([], 5, lambda v: np.asarray(v), scored=True) == {}


def test_lags_count_updates_along_the_runs_history_across_a_restore():
    """Versions 1..6, then a restore published the policy of version 3 as 7 (``VersionLineage``):
    7 is 3 updates along the history, not 7."""

    def position(v):
        v = np.asarray(v, np.int64)
        return np.where(v >= 7, v - 7 + 3, v)

    out = trajectory_metrics([sample([2, 3, 7, 8])], int(position(8)), position, scored=False)
    assert out["trajectory_span_max"] == 2.0  # positions 2, 3, 3, 4
    assert out["trajectory_lag_oldest_mean"] == 2.0 and out["trajectory_lag_newest_mean"] == 0.0


def test_each_trained_group_gets_its_ledger_truth_judged_by_position():
    """A restore published version 3's policy as 7: a group of tokens from v6 (discarded, position 6)
    and v7 (position 3) trained at v8 (position 4) is oldest at v7 and newest at v6, and v6 is ahead of
    the learner (lag never negative); a group from v2 only lags 2 updates."""

    def position(v):
        v = np.asarray(v, np.int64)
        return np.where(v >= 7, v - 7 + 3, v)

    out = ledger_versions({"a": ([6, 7], 7), "b": ([2], 0)}, 8, position)
    assert out == {
        "a": GroupVersions(oldest=7, newest=6, scorer=7, learner=8, lag=1),
        "b": GroupVersions(2, 2, 0, 8, 2),
    }
