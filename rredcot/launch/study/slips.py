"""Slip localisation: a ground truth for credit that needs no Monte Carlo.

On a chain task a checker knows which line of working first goes wrong (``tasks.chain.first_slip``).
A credit method that carries information puts the blame of a wrong trace (its σ, what the learner
multiplies a negative advantage by) on that line. Two sources of labelled traces:

- **constructed**: per problem, a group of the correct chain, the correct chain with an irrelevant
  line inserted (for the credit share on lines the answer depends on), and one trace per line j
  with a slip at j whose later lines carry the slip forward (answers wrong);
- **sampled**: the policy's own groups, each wrong trace labelled by the checker.

Per trace the σ mass of each working line is summed; on a wrong trace with a slip at line s:
top-1 (the line of most blame is s; ties share the hit), blame share (mass on s ÷ mass on the
working lines) and the Spearman correlation of the line masses with the slip indicator (0 when the
masses are all equal: no ranking). On a correct trace with a filler line: the share of its credit
on the working lines the answer depends on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from rredcot.common.config import DataConfig
from rredcot.common.records import RolloutGroup, RolloutRecord
from rredcot.redistributor.lines import line_texts, top_share, working_lines
from rredcot.redistributor.segmentation import token_texts
from rredcot.tasks.arith import solution_text
from rredcot.tasks.chain import chain_lines, first_slip, parse_chain
from rredcot.tasks.data import Problem
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.task import Task

FILLER = "Let me go on to the next step."  # a line the answer does not depend on
SLIP_DELTAS = (1, -1, 2, -2)


@dataclass
class LabelledTrace:
    """One sample of a group with its working lines (completion token spans) and its label."""

    group: int  # index of its group in the study
    sample: int  # index in the group
    lines: list[tuple[int, int]]  # token spans [lo, hi) of the working lines
    slip: int | None  # the first wrong working line (wrong traces); None for a correct one
    filler: int | None = None  # the irrelevant line of a constructed correct trace


def slip_scores(mass: np.ndarray, slip: int) -> tuple[float, float, float]:
    """(top-1 hit, blame share, Spearman with the slip indicator) of a wrong trace's line masses."""
    hit = top_share(mass, slip)
    total = mass.sum()
    share = float(mass[slip] / total) if total > 0 else 1.0 / len(mass)
    indicator = np.zeros(len(mass))
    indicator[slip] = 1.0
    rho = 0.0 if np.ptp(mass) == 0 else float(stats.spearmanr(mass, indicator).statistic)
    return hit, share, rho


def dependency_share(mass: np.ndarray, filler: int) -> float:
    """The share of a correct trace's line credit on the lines other than the filler."""
    total = mass.sum()
    return float((total - mass[filler]) / total) if total > 0 else float("nan")


def _record(group_id: str, i: int, ids: list[int], reward: float) -> RolloutRecord:
    n = len(ids)
    return RolloutRecord(
        f"{group_id}-{i}",
        group_id,
        group_id,
        i,
        np.asarray(ids, np.int32),
        np.zeros(n, np.float32),
        np.zeros((1, 2), np.int32),
        "stop",
        reward,
        "correct" if reward > 0 else "wrong",
    )


@dataclass(frozen=True)
class Format:
    """Where a completion's working lies: the thinking tags and the task's answer template."""

    think_start: str
    think_end: str
    template: str

    def spans(self, tok: Any, ids: Sequence[int]) -> tuple[list[str], list[tuple[int, int]]]:
        """(token texts, working line spans) of completion ``ids``."""
        texts = token_texts(tok, ids)
        return texts, working_lines(texts, self.think_start, self.think_end, self.template)


def constructed_group(
    index: int, problem: Problem, task: Task, data: DataConfig, tok: Any, fmt: Format, rng: np.random.Generator
) -> tuple[RolloutGroup, list[LabelledTrace]]:
    """The correct chain, the correct chain with ``FILLER`` after a random line, and a slip at each
    line (a random non-zero offset, the later lines carried on from it), as one verified group in the
    task's own format (``task.settings.think``)."""
    ops, operands = parse_chain(problem)
    lines, value = chain_lines(ops, operands)
    at = int(rng.integers(1, len(lines)))
    variants: list[tuple[list[str], int, int | None, int | None]] = [
        (lines, value, None, None),
        ([*lines[:at], FILLER, *lines[at:]], value, None, at),
    ]
    for j in range(len(lines)):
        slipped, wrong = chain_lines(ops, operands, j, int(rng.choice(SLIP_DELTAS)))
        variants.append((slipped, wrong, j, None))
    gid = f"constructed-{index}"
    think = bool(getattr(task.settings, "think", False))
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    records, labels = [], []
    for i, (ls, v, slip, filler) in enumerate(variants):
        ids = enc(solution_text(ls, v, think) + tok.eos_token)
        records.append(_record(gid, i, ids, float(slip is None)))
        labels.append(LabelledTrace(index, i, fmt.spans(tok, ids)[1], slip, filler))
    u, y = task.reference(problem)
    prompt = np.asarray(prompt_ids(problem, task, data, tok), np.int32)
    refs = [np.asarray(enc(u), np.int32)], [np.asarray(enc(y), np.int32)]
    return RolloutGroup(gid, gid, prompt, *refs, records, problem.answer), labels


def label_sampled(index: int, group: RolloutGroup, problem: Problem, tok: Any, fmt: Format) -> list[LabelledTrace]:
    """The checker's label of each sample of a policy's group: correct samples (slip None), and the
    wrong ones whose first wrong line lies in their working (a wrong answer after right working, or
    missing steps, has no line to blame and is left out)."""
    out = []
    for i, s in enumerate(group.samples):
        texts, spans = fmt.spans(tok, s.completion_ids.tolist())
        slip = first_slip(problem, line_texts(texts, spans))
        if s.reward > 0:
            out.append(LabelledTrace(index, i, spans, None))
        elif slip is not None and slip < len(spans):
            out.append(LabelledTrace(index, i, spans, slip))
    return out
