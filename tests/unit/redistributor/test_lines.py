"""A completion's lines from its token texts: its content without end tokens, the line the task's
checker names, σ's mass on each line and whether a line holds the most."""

from __future__ import annotations

import numpy as np

from rredcot.redistributor.lines import content_texts, line_mass, slipped_line, top_share
from rredcot.tasks.task import build_task
from tests.unit.redistributor.test_oracle import EOS, chain, slipped, text


def test_line_mass_sums_sigma_over_each_span() -> None:
    sigma = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    np.testing.assert_allclose(line_mass(sigma, [(0, 1), (1, 4)]), [0.1, 0.9], rtol=1e-6)


def test_a_line_of_most_mass_takes_the_hit_and_ties_share_it() -> None:
    assert top_share(np.array([0.1, 0.6, 0.3]), 1) == 1.0
    assert top_share(np.array([0.1, 0.6, 0.3]), 2) == 0.0
    assert top_share(np.array([0.4, 0.4, 0.2]), 0) == 0.5
    assert top_share(np.full(4, 0.25), 3) == 0.25  # uniform over equal lines: a quarter of a hit


def test_content_texts_leave_out_the_trailing_end_tokens(qwen_tok) -> None:
    ids = qwen_tok(f"2 + 3 = 5.\nAnswer: 5{EOS}{EOS}", add_special_tokens=False)["input_ids"]
    assert "".join(content_texts(qwen_tok, ids)) == "2 + 3 = 5.\nAnswer: 5"


def test_the_checker_names_a_working_line_or_none(qwen_tok) -> None:
    """Line 1 slipped: its span and index; right working, or steps missing: no line of the working."""
    cfg, lines, _ = chain()
    task = build_task(cfg.task)
    problem = task.problems(cfg.data, cfg.run.seed)[0]

    def named(working: list[str]) -> tuple[list[str], int | None]:
        texts = content_texts(qwen_tok, qwen_tok(text(working, "0", False), add_special_tokens=False)["input_ids"])
        spans, slip = slipped_line(task, problem, texts, "<think>", "</think>")
        return ["".join(texts[a:b]).strip() for a, b in spans], slip

    wrong = [lines[0], slipped(lines[1]), *lines[2:]]
    assert named(wrong) == (wrong, 1)
    assert named(lines) == (lines, None)
    assert named(lines[:2]) == (lines[:2], None)  # steps missing: the checker says len(lines)
