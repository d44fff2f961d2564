"""Builders of valid records for tests (random but deterministic)."""

from __future__ import annotations

import numpy as np

from rredcot.common.records import RolloutGroup, RolloutRecord, WeightedGroup, WeightedSample, new_id


def rollout(
    group_id: str, index: int = 0, length: int = 32, seed: int = 0, versions=((0, 0),), reward: float = 1.0
) -> RolloutRecord:
    rng = np.random.default_rng(seed + index)
    return RolloutRecord(
        id=new_id(),
        group_id=group_id,
        prompt_id="p0",
        sample_index=index,
        completion_ids=rng.integers(0, 151_000, length, dtype=np.int32),
        behaviour_logprobs=-rng.random(length, dtype=np.float32),
        version_runs=np.array(versions, dtype=np.int32).reshape(-1, 2),
        finish_reason="stop",
        reward=reward,
        verdict="correct" if reward else "wrong",
        timings={"generate_s": 0.5},
    )


def rollout_group(g: int = 4, length: int = 32, seed: int = 0) -> RolloutGroup:
    gid = new_id()
    rng = np.random.default_rng(seed)
    return RolloutGroup(
        group_id=gid,
        prompt_id="p0",
        prompt_ids=rng.integers(0, 1000, 20, dtype=np.int32),
        ref_solution_ids=[rng.integers(0, 1000, 12, dtype=np.int32)],
        ref_answer_ids=[rng.integers(0, 1000, 3, dtype=np.int32)],
        samples=[rollout(gid, i, length, seed, reward=float(i % 2)) for i in range(g)],
        answer="12",
    )


def weighted_group(g: int = 4, length: int = 32, seed: int = 0) -> WeightedGroup:
    group = rollout_group(g, length, seed)
    samples = [
        WeightedSample(
            rollout=r,
            advantage=float(r.reward - 0.5),
            sigma=np.full(length, 1.0 / length, dtype=np.float32),
            exit_points=np.array([0, length // 2, length], dtype=np.int32),
            exit_values=np.array([-3.0, -2.0, -1.0], dtype=np.float32),
            segment_rewards=np.array([1.0, 1.0], dtype=np.float32),
            credit_method="rredcot",
        )
        for r in group.samples
    ]
    return WeightedGroup(
        group_id=group.group_id, prompt_id=group.prompt_id, prompt_ids=group.prompt_ids, samples=samples
    )
