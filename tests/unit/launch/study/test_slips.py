"""Slip localisation: working lines from token texts, the scores by hand, and constructed groups in
both formats with the real SmolLM2-sized Qwen tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.common.config import DataConfig, TaskConfig
from rredcot.launch.study.slips import (
    FILLER,
    Format,
    constructed_group,
    dependency_share,
    label_sampled,
    slip_scores,
    working_lines,
)
from rredcot.tasks.chain import first_slip
from rredcot.tasks.task import build_task

FMT = Format("<think>", "</think>", "Answer: ")


def test_working_lines_stop_at_the_answer_line_or_the_thinking_end():
    texts = ["2 + 3", " = 5.\n", "\n", "5 * 2 = 10.", "\n", "Answer", ": 10", "<|im_end|>"]
    assert working_lines(texts, "<think>", "</think>", "Answer: ") == [(0, 2), (3, 5)]  # the blank line is none
    think = ["<think>", "\n", "1 + 1 = 2.\n", "2 + 2", " = 4.\n", "</think>", "\n\n", "Answer", ": 4"]
    assert working_lines(think, "<think>", "</think>", "Answer: ") == [(2, 3), (3, 5)]  # not the newline after the tag


def test_slip_scores_by_hand():
    # ranks 1.5, 4, 3, 1.5 against 2, 4, 2, 2: ρ = 3 / √(4.5 · 3)
    assert slip_scores(np.array([0.1, 0.6, 0.2, 0.1]), 1) == pytest.approx((1.0, 0.6, 3 / np.sqrt(13.5)))
    hit, share, rho = slip_scores(np.array([0.25, 0.25, 0.25, 0.25]), 2)  # no ranking: a shared hit, no ρ
    assert (hit, share, rho) == (0.25, 0.25, 0.0)
    assert slip_scores(np.array([0.5, 0.5, 0.0, 0.0]), 0)[0] == 0.5
    assert dependency_share(np.array([0.2, 0.2, 0.1, 0.5]), 3) == pytest.approx(0.5)


@pytest.mark.parametrize("think", [False, True])
def test_constructed_groups_hold_a_correct_chain_a_filler_and_a_slip_at_each_line(qwen_tok, think):
    settings = {"op": "chain", "chain_steps": 4, "operand_min": 1, "operand_max": 5, "size": 20, "think": think}
    task, data = build_task(TaskConfig("arith", settings)), DataConfig(eval_size=0, prompt_style="chat_one_shot")
    problem = task.problems(data, 0)[3]
    group, labels = constructed_group(0, problem, task, data, qwen_tok, FMT, np.random.default_rng(0))
    group.validate()
    assert [s.reward for s in group.samples] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [lab.slip for lab in labels] == [None, None, 0, 1, 2, 3]
    for s, lab in zip(group.samples, labels, strict=True):
        texts, spans = FMT.spans(qwen_tok, s.completion_ids.tolist())
        lines = ["".join(texts[a:b]).strip() for a, b in spans]
        assert spans == lab.lines and len(lines) == (5 if lab.filler is not None else 4)
        if lab.filler is not None:
            assert lines[lab.filler] == FILLER
        else:
            assert first_slip(problem, lines) == lab.slip
    # the sampled path labels the same traces the same way (the filler trace is a correct one)
    sampled = label_sampled(0, group, problem, qwen_tok, FMT)
    assert [lab.slip for lab in sampled] == [None, None, 0, 1, 2, 3]
