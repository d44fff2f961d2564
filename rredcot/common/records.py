"""Records that cross process and machine boundaries, with their validation rules.

A stream entry is a whole group: ``RolloutGroup`` (generator → redistributor) or
``WeightedGroup`` (redistributor → learner). Each sample inside still carries its own id.
Arrays are numpy arrays with fixed dtypes; ``common.codec`` moves them as raw little-endian bytes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np

SCHEMA_VERSION = 1
FINISH_REASONS = ("stop", "length", "abort")
VERDICTS = ("correct", "wrong", "no_answer", "timeout", "error")


class RecordError(ValueError):
    """A record that breaks the schema; the message says which field and why."""


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class RolloutRecord:
    """One sampled completion with everything the later stages need."""

    id: str
    group_id: str
    prompt_id: str
    sample_index: int
    completion_ids: np.ndarray  # int32 [L]
    behaviour_logprobs: np.ndarray  # float32 [L], after temperature
    version_runs: np.ndarray  # int32 [R, 2]: (first token index, policy version), starts at 0
    finish_reason: str
    reward: float
    verdict: str
    timings: dict[str, float] = field(default_factory=dict)

    def token_versions(self) -> np.ndarray:
        """Policy version that generated each completion token (int32 [L])."""
        n = len(self.completion_ids)
        out = np.empty(n, dtype=np.int32)
        starts = list(self.version_runs[:, 0]) + [n]
        for (start, version), end in zip(self.version_runs, starts[1:]):
            out[start:end] = version
        return out

    @property
    def min_version(self) -> int:
        return int(self.version_runs[:, 1].min())

    @property
    def max_version(self) -> int:
        return int(self.version_runs[:, 1].max())

    def validate(self) -> None:
        _require_id(self.id, "id")
        _require_id(self.group_id, "group_id")
        n = _token_ids(self.completion_ids, "completion_ids")
        _array(self.behaviour_logprobs, np.float32, 1, "behaviour_logprobs", length=n)
        if not np.all(np.isfinite(self.behaviour_logprobs)):
            bad = int(np.flatnonzero(~np.isfinite(self.behaviour_logprobs))[0])
            raise RecordError(
                f"behaviour_logprobs must be finite; token {bad} has {self.behaviour_logprobs[bad]} "
                "(the generator's engine produced a NaN/inf log-prob)"
            )
        runs = _array(self.version_runs, np.int32, 2, "version_runs")
        if runs == 0 or self.version_runs.shape[1] != 2:
            raise RecordError("version_runs must have shape [R >= 1, 2]")
        starts = self.version_runs[:, 0]
        if starts[0] != 0 or np.any(np.diff(starts) <= 0) or (n and starts[-1] >= n):
            raise RecordError(f"version_runs starts {starts.tolist()} must begin at 0 and increase within {n}")
        if self.finish_reason not in FINISH_REASONS:
            raise RecordError(f"finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
        if self.verdict not in VERDICTS:
            raise RecordError(f"verdict {self.verdict!r} not in {VERDICTS}")
        if not np.isfinite(self.reward):
            raise RecordError(f"reward must be finite, got {self.reward}")


@dataclass
class RolloutGroup:
    """The G samples of one prompt, written by a generator as one stream entry."""

    group_id: str
    prompt_id: str
    prompt_ids: np.ndarray  # int32 [P]
    ref_solution_ids: list[np.ndarray]  # N arrays of int32: reference solutions u_i
    ref_answer_ids: list[np.ndarray]  # N arrays of int32: reference answers y_i
    samples: list[RolloutRecord]
    answer: str = ""  # the gold answer text (for reports and the verifier)

    def validate(self) -> None:
        _require_id(self.group_id, "group_id")
        _token_ids(self.prompt_ids, "prompt_ids")
        if len(self.ref_solution_ids) != len(self.ref_answer_ids):
            raise RecordError(
                f"{len(self.ref_solution_ids)} reference solutions but {len(self.ref_answer_ids)} answers"
            )
        for i, (u, y) in enumerate(zip(self.ref_solution_ids, self.ref_answer_ids)):
            _token_ids(u, f"ref_solution_ids[{i}]")
            _token_ids(y, f"ref_answer_ids[{i}]")
        if not self.samples:
            raise RecordError("a group needs at least one sample")
        for s in self.samples:
            s.validate()
            if s.group_id != self.group_id:
                raise RecordError(f"sample {s.id} belongs to group {s.group_id}, not {self.group_id}")

    def token_arrays(self) -> dict[str, np.ndarray]:
        """Every token id array of the group, by field name (``check_vocabulary``)."""
        arrays = {"prompt_ids": self.prompt_ids}
        arrays |= {f"samples[{i}].completion_ids": s.completion_ids for i, s in enumerate(self.samples)}
        arrays |= {f"ref_solution_ids[{i}]": u for i, u in enumerate(self.ref_solution_ids)}
        return arrays | {f"ref_answer_ids[{i}]": y for i, y in enumerate(self.ref_answer_ids)}


@dataclass
class WeightedSample:
    """A rollout with its credit: advantage and per-token weights σ (Σσ = 1 where the method says so)."""

    rollout: RolloutRecord
    advantage: float
    sigma: np.ndarray  # float32 [L]
    exit_points: np.ndarray  # int32 [K+1], token indices into the completion
    exit_values: np.ndarray  # float32 [K+1], v̂ at each exit point (empty when not computed)
    segment_rewards: np.ndarray  # float32 [K]
    credit_method: str
    timings: dict[str, float] = field(default_factory=dict)
    sigma_fallback: str = ""  # why σ is uniform: no_segment, no_reference, underflow, zero_mass, skipped
    exit_stderr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [K+1] MC only, else empty
    values_version: int = -1  # policy version that sampled the MC continuations behind exit_values; -1: none

    def validate(self) -> None:
        self.rollout.validate()
        n = len(self.rollout.completion_ids)
        _array(self.sigma, np.float32, 1, "sigma", length=n)
        if not np.all(np.isfinite(self.sigma)) or np.any(self.sigma < 0):
            raise RecordError(f"sigma of {self.rollout.id} must be finite and >= 0")
        k = _array(self.exit_points, np.int32, 1, "exit_points")
        e = self.exit_points
        if k and not (e[0] >= 0 and e[-1] <= n and np.all(np.diff(e) >= 0)):
            raise RecordError(f"exit_points of {self.rollout.id} must be non-decreasing token indices in [0, {n}]")
        if _array(self.exit_values, np.float32, 1, "exit_values") not in (0, k):
            raise RecordError(f"exit_values of {self.rollout.id} must be empty or one per exit point ({k})")
        if _array(self.segment_rewards, np.float32, 1, "segment_rewards") not in (0, max(k - 1, 0)):
            raise RecordError(f"segment_rewards of {self.rollout.id} must be empty or one per segment ({k - 1})")
        if _array(self.exit_stderr, np.float32, 1, "exit_stderr") not in (0, len(self.exit_values)):
            raise RecordError(f"exit_stderr of {self.rollout.id} must be empty or match exit_values")
        if not np.isfinite(self.advantage):
            raise RecordError(f"advantage of {self.rollout.id} must be finite, got {self.advantage}")


@dataclass
class WeightedGroup:
    """A redistributed group, written by a redistributor as one entry of the batches stream."""

    group_id: str
    prompt_id: str
    prompt_ids: np.ndarray
    samples: list[WeightedSample]
    scorer_version: int = 0

    def validate(self) -> None:
        _require_id(self.group_id, "group_id")
        _token_ids(self.prompt_ids, "prompt_ids")
        if not self.samples:
            raise RecordError("a weighted group needs at least one sample")
        for s in self.samples:
            s.validate()

    def token_arrays(self) -> dict[str, np.ndarray]:
        """Every token id array the learner trains on, by field name (``check_vocabulary``)."""
        arrays = {"prompt_ids": self.prompt_ids}
        return arrays | {f"samples[{i}].completion_ids": s.rollout.completion_ids for i, s in enumerate(self.samples)}


def check_vocabulary(arrays: dict[str, np.ndarray], vocab: int, whose: str) -> None:
    """Raise ``RecordError`` naming the first array holding a token id outside ``[0, vocab)`` of
    ``whose`` model, before any forward: on CUDA an out-of-range embedding index is a device-side
    assert that breaks every later kernel of the process, so the record must be dead-lettered."""
    for name, ids in arrays.items():
        if ids.size and not 0 <= ids.min() <= ids.max() < vocab:
            bad = ids[(ids < 0) | (ids >= vocab)]
            raise RecordError(f"{name} holds token id {int(bad[0])}, outside {whose} vocabulary [0, {vocab})")


def _require_id(value: object, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{name} must be a non-empty string, got {value!r}")


def _token_ids(a: object, name: str) -> int:
    """Validate a 1-D int32 array of token ids (>= 0; the vocabulary's size is the consumer's to check)."""
    n = _array(a, np.int32, 1, name)
    if n and isinstance(a, np.ndarray) and (low := int(a.min())) < 0:
        raise RecordError(f"{name} must hold token ids >= 0, got {low} at position {int(a.argmin())}")
    return n


def _array(a: object, dtype: type, ndim: int, name: str, length: int | None = None) -> int:
    if not isinstance(a, np.ndarray):
        raise RecordError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise RecordError(f"{name} must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != ndim:
        raise RecordError(f"{name} must have {ndim} dimension(s), got shape {a.shape}")
    if length is not None and a.shape[0] != length:
        raise RecordError(f"{name} has length {a.shape[0]}, expected {length}")
    return a.shape[0]
