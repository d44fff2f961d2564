"""A finished vLLM group → a verified ``RolloutGroup`` record (the generator's and the credit study's)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rredcot.actors.engine import GroupOutput
from rredcot.common.ledger import group_id
from rredcot.common.records import RolloutGroup, RolloutRecord
from rredcot.tasks.data import Problem
from rredcot.tasks.prompts import opens_thought
from rredcot.tasks.task import Task
from rredcot.tasks.verifier import Verifier


def rollout_group(
    group: GroupOutput, problem: Problem, index: int, run_id: str, task: Task, tokenizer: Any, verifier: Verifier
) -> RolloutGroup:
    """Verify each completion against the problem's answer and attach the task's reference pair;
    sample ids derive from (run, admission index, sample)."""
    u, y = task.reference(problem)
    opened = opens_thought(group.prompt_ids, tokenizer, verifier.think[0])
    samples = []
    for i, c in enumerate(group.completions):
        start = time.perf_counter()
        verdict = verifier.score(tokenizer.decode(c.token_ids, skip_special_tokens=True), problem.answer, opened)
        samples.append(
            RolloutRecord(
                id=group_id(run_id, index, i),
                group_id=group.request_id,
                prompt_id=problem.id,
                sample_index=i,
                completion_ids=np.asarray(c.token_ids, dtype=np.int32),
                behaviour_logprobs=np.asarray(c.logprobs, dtype=np.float32),
                version_runs=np.asarray(c.version_runs, dtype=np.int32).reshape(-1, 2),
                finish_reason=c.finish_reason,
                reward=verdict.reward,
                verdict=verdict.verdict,
                timings={
                    "generate_s": group.finished - group.started,
                    "verify_s": time.perf_counter() - start,
                    "finished_at": group.finished,
                },
            )
        )
    return RolloutGroup(
        group_id=group.request_id,
        prompt_id=problem.id,
        prompt_ids=np.asarray(group.prompt_ids, dtype=np.int32),
        ref_solution_ids=[np.asarray(tokenizer(u, add_special_tokens=False)["input_ids"], dtype=np.int32)],
        ref_answer_ids=[np.asarray(tokenizer(y, add_special_tokens=False)["input_ids"], dtype=np.int32)],
        samples=samples,
        answer=problem.answer,
    )
