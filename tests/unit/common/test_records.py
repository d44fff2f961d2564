"""Record validation: every rule of ``WeightedSample``/``WeightedGroup.validate`` and the ``RolloutGroup``
rules not covered through the codec (test_codec.py), one mutation of a valid record at a time; each
must raise ``RecordError`` naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.common.records import RecordError
from tests.factories import rollout_group, weighted_group


def whole(g):
    return g


def sample(g):
    """samples[1] of a group (a WeightedSample, or a RolloutRecord in a RolloutGroup)."""
    return g.samples[1]


def rollout(g):
    """The rollout of samples[1] of a WeightedGroup."""
    return g.samples[1].rollout


def _set(where, name: str, value):
    """A mutation: ``where(group).name = value`` (``value()`` when callable, a fresh array per test)."""
    return lambda g: setattr(where(g), name, value() if callable(value) else value)


def _poke(where, name: str, index: int, value):
    """A mutation: ``where(group).name[index] = value``."""
    return lambda g: getattr(where(g), name).__setitem__(index, value)


L = 32  # the factories' completion length

WEIGHTED = [
    # σ: float32 [L], finite, ≥ 0
    (
        "sigma too short",
        _set(sample, "sigma", lambda: np.full(L - 1, 1 / L, np.float32)),
        r"sigma has length 31, expected 32",
    ),
    (
        "sigma too long",
        _set(sample, "sigma", lambda: np.full(L + 1, 1 / L, np.float32)),
        r"sigma has length 33, expected 32",
    ),
    ("sigma NaN", _poke(sample, "sigma", 3, np.nan), r"sigma of \w+ must be finite and >= 0"),
    ("sigma +inf", _poke(sample, "sigma", 0, np.inf), r"sigma of \w+ must be finite and >= 0"),
    ("sigma negative", _poke(sample, "sigma", L - 1, -1e-6), r"sigma of \w+ must be finite and >= 0"),
    ("sigma float64", _set(sample, "sigma", lambda: np.full(L, 1 / L)), r"sigma must have dtype float32, got float64"),
    ("sigma 2-D", _set(sample, "sigma", lambda: np.full((1, L), 1 / L, np.float32)), r"sigma must have 1 dimension"),
    ("sigma a list", _set(sample, "sigma", [1 / L] * L), r"sigma must be a numpy array, got list"),
    # advantage: finite
    ("advantage NaN", _set(sample, "advantage", float("nan")), r"advantage of \w+ must be finite, got nan"),
    ("advantage +inf", _set(sample, "advantage", float("inf")), r"advantage of \w+ must be finite, got inf"),
    ("advantage -inf", _set(sample, "advantage", float("-inf")), r"advantage of \w+ must be finite, got -inf"),
    # exit points int32, exit values / segment rewards / stderr float32, all 1-D
    (
        "exit_points int64",
        _set(sample, "exit_points", lambda: np.array([0, 16, 32])),
        r"exit_points must have dtype int32",
    ),
    (
        "exit_points float32",
        _set(sample, "exit_points", lambda: np.array([0, 16, 32], np.float32)),
        r"exit_points must have dtype int32, got float32",
    ),
    (
        "exit_points 2-D",
        _set(sample, "exit_points", lambda: np.array([[0, 16, 32]], np.int32)),
        r"exit_points must have 1 dimension",
    ),
    ("exit_points a list", _set(sample, "exit_points", [0, 16, 32]), r"exit_points must be a numpy array"),
    (
        "exit_values float64",
        _set(sample, "exit_values", lambda: np.array([-3.0, -2.0, -1.0])),
        r"exit_values must have dtype float32, got float64",
    ),
    (
        "exit_values int32",
        _set(sample, "exit_values", lambda: np.array([-3, -2, -1], np.int32)),
        r"exit_values must have dtype float32, got int32",
    ),
    (
        "segment_rewards float64",
        _set(sample, "segment_rewards", lambda: np.array([1.0, 1.0])),
        r"segment_rewards must have dtype float32, got float64",
    ),
    (
        "segment_rewards 0-D",
        _set(sample, "segment_rewards", lambda: np.array(1.0, np.float32)),
        r"segment_rewards must have 1 dimension",
    ),
    (
        "exit_stderr not matching exit_values",
        _set(sample, "exit_stderr", lambda: np.zeros(2, np.float32)),
        r"exit_stderr of \w+ must be empty or match exit_values",
    ),
    (
        "exit_stderr float64",
        _set(sample, "exit_stderr", lambda: np.zeros(3)),
        r"exit_stderr must have dtype float32, got float64",
    ),
    # exit points lie in the completion, ascending; values one per exit point, rewards one per segment
    (
        "exit point past the end",
        _set(sample, "exit_points", lambda: np.array([0, 16, 33], np.int32)),
        r"exit_points of \w+ must be non-decreasing token indices in \[0, 32\]",
    ),
    (
        "exit points descending",
        _set(sample, "exit_points", lambda: np.array([0, 20, 16], np.int32)),
        r"exit_points of \w+ must be non-decreasing",
    ),
    (
        "negative exit point",
        _set(sample, "exit_points", lambda: np.array([-1, 16, 32], np.int32)),
        r"exit_points of \w+ must be non-decreasing",
    ),
    (
        "exit_values one short",
        _set(sample, "exit_values", lambda: np.zeros(2, np.float32)),
        r"exit_values of \w+ must be empty or one per exit point \(3\)",
    ),
    (
        "segment_rewards one too many",
        _set(sample, "segment_rewards", lambda: np.zeros(3, np.float32)),
        r"segment_rewards of \w+ must be empty or one per segment \(2\)",
    ),
    # the rollout inside is validated too
    ("rollout reward NaN", _set(rollout, "reward", float("nan")), r"reward must be finite"),
    (
        "rollout logprobs too short",
        _set(rollout, "behaviour_logprobs", lambda: np.zeros(3, np.float32)),
        r"behaviour_logprobs has length 3, expected 32",
    ),
    # the group
    ("no sample", _set(whole, "samples", []), r"a weighted group needs at least one sample"),
    ("empty group_id", _set(whole, "group_id", ""), r"group_id must be a non-empty string, got ''"),
    ("group_id not a string", _set(whole, "group_id", 7), r"group_id must be a non-empty string, got 7"),
    (
        "prompt_ids int64",
        _set(whole, "prompt_ids", lambda: np.arange(5)),
        r"prompt_ids must have dtype int32, got int64",
    ),
    (
        "prompt_ids negative",
        _set(whole, "prompt_ids", lambda: np.array([3, -1], np.int32)),
        r"prompt_ids must hold token ids >= 0, got -1 at position 1",
    ),
]


@pytest.mark.parametrize(("mutate", "reason"), [m[1:] for m in WEIGHTED], ids=[m[0] for m in WEIGHTED])
def test_weighted_group_rejects(mutate, reason) -> None:
    group = weighted_group()
    group.validate()  # valid before the mutation
    mutate(group)
    with pytest.raises(RecordError, match=reason):
        group.validate()


def test_weighted_sample_boundaries_are_valid() -> None:
    """What the rules allow: σ of zeros (a method that is not return-equivalent may give any σ ≥ 0),
    no exit values with no standard errors, standard errors (NaN allowed) matching the exit values, an
    empty completion with an empty σ and one exit point, an advantage of 0."""
    group = weighted_group()
    a, b, c, d = group.samples
    a.sigma = np.zeros(L, np.float32)
    b.exit_points, b.exit_values, b.segment_rewards = (
        np.zeros(0, np.int32),
        np.zeros(0, np.float32),
        np.zeros(0, np.float32),
    )
    c.exit_stderr = np.array([0.5, np.nan, 0.0], np.float32)
    d.advantage = 0.0
    group.validate()
    empty = weighted_group(g=1)
    empty.samples[0].rollout.completion_ids = np.zeros(0, np.int32)
    empty.samples[0].rollout.behaviour_logprobs = np.zeros(0, np.float32)
    empty.samples[0].sigma = np.zeros(0, np.float32)
    empty.samples[0].exit_points = np.zeros(1, np.int32)  # [lo]: an empty span has one exit point
    empty.samples[0].exit_values = np.zeros(1, np.float32)
    empty.samples[0].segment_rewards = np.zeros(0, np.float32)
    empty.samples[0].exit_stderr = np.zeros(0, np.float32)
    empty.validate()


ROLLOUT = [
    ("empty sample id", _set(sample, "id", ""), r"^id must be a non-empty string"),
    ("sample id not a string", _set(sample, "id", None), r"^id must be a non-empty string, got None"),
    ("empty sample group_id", _set(sample, "group_id", ""), r"^group_id must be a non-empty string"),
    ("empty group_id", _set(whole, "group_id", ""), r"^group_id must be a non-empty string"),
    ("verdict", _set(sample, "verdict", "maybe"), r"verdict 'maybe' not in"),
    (
        "logprobs float64",
        _set(sample, "behaviour_logprobs", lambda: np.zeros(L)),
        r"behaviour_logprobs must have dtype float32, got float64",
    ),
    (
        "logprobs +inf",
        _poke(sample, "behaviour_logprobs", 7, np.inf),
        r"behaviour_logprobs must be finite; token 7 has inf",
    ),
    (
        "completion_ids 2-D",
        _set(sample, "completion_ids", lambda: np.zeros((1, L), np.int32)),
        r"completion_ids must have 1 dimension",
    ),
    ("reward inf", _set(sample, "reward", float("inf")), r"reward must be finite, got inf"),
    (
        "version_runs int64",
        _set(sample, "version_runs", lambda: np.array([[0, 0]])),
        r"version_runs must have dtype int32, got int64",
    ),
    (
        "version_runs 1-D",
        _set(sample, "version_runs", lambda: np.array([0, 0], np.int32)),
        r"version_runs must have 2 dim",
    ),
    (
        "version_runs three columns",
        _set(sample, "version_runs", lambda: np.array([[0, 0, 0]], np.int32)),
        r"version_runs must have shape \[R >= 1, 2\]",
    ),
    (
        "version_runs empty",
        _set(sample, "version_runs", lambda: np.zeros((0, 2), np.int32)),
        r"version_runs must have shape \[R >= 1, 2\]",
    ),
    (
        "version_runs not increasing",
        _set(sample, "version_runs", lambda: np.array([[0, 1], [8, 2], [8, 3]], np.int32)),
        r"version_runs starts \[0, 8, 8\] must begin at 0 and increase within 32",
    ),
    (
        "version_runs start past the end",
        _set(sample, "version_runs", lambda: np.array([[0, 1], [32, 2]], np.int32)),
        r"version_runs starts \[0, 32\] must begin at 0 and increase within 32",
    ),
    ("prompt_ids a list", _set(whole, "prompt_ids", [1, 2]), r"prompt_ids must be a numpy array, got list"),
    (
        "ref_answer_ids int64",
        _set(whole, "ref_answer_ids", lambda: [np.array([1, 2])]),
        r"ref_answer_ids\[0\] must have dtype int32, got int64",
    ),
    (
        "more answers than solutions",
        _set(whole, "ref_answer_ids", lambda: [np.array([1], np.int32)] * 2),
        r"1 reference solutions but 2 answers",
    ),
]


@pytest.mark.parametrize(("mutate", "reason"), [m[1:] for m in ROLLOUT], ids=[m[0] for m in ROLLOUT])
def test_rollout_group_rejects(mutate, reason) -> None:
    group = rollout_group()
    group.validate()
    mutate(group)
    with pytest.raises(RecordError, match=reason):
        group.validate()


def test_rollout_group_boundaries_are_valid() -> None:
    """An empty completion with one version run, several runs inside the completion, no reference pair."""
    group = rollout_group(length=0)
    group.validate()
    group = rollout_group()
    group.samples[0].version_runs = np.array([[0, 3], [1, 4], [31, 9]], np.int32)
    group.ref_solution_ids, group.ref_answer_ids = [], []
    group.validate()
