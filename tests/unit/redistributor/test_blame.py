"""Where σ puts a wrong trace's most blame against the line the chain checker names, on hand-built
chain traces with the real Qwen3 tokenizer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rredcot.common.config import load_config
from rredcot.common.records import WeightedSample
from rredcot.redistributor.blame import SlipChecker, takes_blame
from rredcot.redistributor.credit import redistribute_group
from rredcot.tasks.task import build_task
from tests.unit.redistributor.test_oracle import chain, group_of, slipped, text


@pytest.fixture
def traces(qwen_tok):
    """A chain config, its first problem's id, the working lines of a trace that slips at line 1,
    and that trace with a right one as a group weighted by ``oracle`` (σ on the slipped line)."""
    cfg, lines, pid = chain()
    wrong = [lines[0], slipped(lines[1]), *lines[2:]]
    answer = build_task(cfg.task).problems(cfg.data, cfg.run.seed)[0].answer
    group = group_of(qwen_tok, pid, [text(lines, answer, False), text(wrong, "0", False)], [1.0, 0.0])
    return cfg, pid, wrong, redistribute_group(group, cfg, tokenizer=qwen_tok)


def with_sigma(sample: WeightedSample, sigma: np.ndarray) -> WeightedSample:
    return dataclasses.replace(sample, sigma=sigma.astype(np.float32))


def test_a_wrong_trace_is_one_that_takes_blame(traces) -> None:
    _, _, _, out = traces
    right, wrong = out.samples
    assert takes_blame(wrong.rollout, -0.5) and not takes_blame(wrong.rollout, 0.0)
    assert not takes_blame(right.rollout, -0.5)  # a correct trace below its group's mean is no wrong trace


def test_the_checker_names_the_slipped_line_and_where_sigma_puts_the_most_blame(qwen_tok, traces) -> None:
    cfg, pid, wrong, out = traces
    checker = SlipChecker.of(cfg, qwen_tok)
    assert checker is not None
    right, blamed = out.samples
    found = checker.blame(blamed, pid)
    assert found is not None and (found.slip, found.text, found.lines, found.top) == (1, wrong[1], 3, 1.0)
    lo, hi = found.span
    assert qwen_tok.decode(blamed.rollout.completion_ids[lo:hi]).strip() == wrong[1]
    n = len(blamed.sigma)
    on_first = np.full(n, 0.5 / n)
    on_first[:lo] += 0.5 / lo  # half the mass spread over the tokens before the slipped line
    assert checker.blame(with_sigma(blamed, on_first), pid).top == 0.0
    tied = np.zeros(n)
    tied[0], tied[lo] = 0.5, 0.5  # as much on line 0 as on the slipped line 1
    assert checker.blame(with_sigma(blamed, tied), pid).top == 0.5
    assert checker.blame(right, pid) is None  # a correct trace
    assert checker.blame(dataclasses.replace(blamed, advantage=0.0), pid) is None  # no blame to place
    assert checker.blame(blamed, "nowhere-7") is None  # no problem of the task: nothing to check against


def test_right_working_has_no_line_to_name_and_a_task_without_checker_no_checker(qwen_tok, traces) -> None:
    cfg, pid, _, _ = traces
    _, lines, _ = chain()
    group = group_of(qwen_tok, pid, [text(lines, "1", False), text(lines, "0", False)], [1.0, 0.0])
    _, wrong_answer = redistribute_group(group, cfg, tokenizer=qwen_tok).samples
    assert SlipChecker.of(cfg, qwen_tok).blame(wrong_answer, pid) is None
    assert SlipChecker.of(load_config("tests", ["task.settings.op=mul"]), qwen_tok) is None
