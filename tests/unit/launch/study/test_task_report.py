"""``study task``'s measures on hand-built groups of a 3-step chain (a real tokenizer, no engine)."""

import numpy as np

from rredcot.common.config import TaskConfig
from rredcot.common.records import RolloutGroup, RolloutRecord
from rredcot.launch.study.task_report import length_report, task_table
from rredcot.models.smollm import smollm2_tokenizer_dir
from rredcot.models.store import load_tokenizer
from rredcot.tasks.arith import make_problem
from rredcot.tasks.task import build_task, working

TASK = build_task(TaskConfig("arith", {"op": "chain", "chain_steps": 3, "layout": "steps", "phrasings": 3}))
PROBLEM = make_problem("p0", ("+", "*", "-"), (7, 5, 2, 4), layout="steps")  # 12, 24, 20


def _group(texts: list[str], rewards: list[float], tok) -> RolloutGroup:
    samples = [
        RolloutRecord(
            f"g-{i}",
            "g",
            "p0",
            i,
            np.asarray(tok(t)["input_ids"], np.int32),
            np.zeros(len(tok(t)["input_ids"]), np.float32),
            np.zeros((1, 2), np.int32),
            "stop",
            r,
            "correct" if r else "wrong",
        )
        for i, (t, r) in enumerate(zip(texts, rewards))
    ]
    return RolloutGroup("g", "p0", np.asarray([1, 2], np.int32), [], [], samples)


def test_slip_rates_single_slips_and_shared_prefixes_by_hand():
    tok = load_tokenizer(smollm2_tokenizer_dir())
    right = "Step 1: 7 + 5 = 12.\nStep 2: 12 * 2 = 24.\nStep 3: 24 - 4 = 20.\nAnswer: 20"
    slip = "Step 1: 7 + 5 = 12.\nStep 2: 12 * 2 = 25.\nStep 3: 25 - 4 = 21.\nAnswer: 21"  # one slip, at line 1
    twice = "Step 1: 7 plus 5 is 13.\nStep 2: 13 * 2 = 27.\nStep 3: 27 - 4 = 23.\nAnswer: 23"  # lines 0 and 1
    r = length_report(TASK, [_group([right, slip, twice], [1.0, 0.0, 0.0], tok)], {"p0": PROBLEM}, tok)
    assert r["samples"] == 3 and r["accuracy"] == 1 / 3 and r["wrong"] == 2
    assert r["slip_rate_per_line"] == [1 / 3, 2 / 3, 0.0]
    assert r["slip_rate_per_kind"] == {"*": 2 / 3, "+": 1 / 3, "-": 0.0}
    assert r["exactly_one_slip"] == 0.5
    # slip's prefix up to its line 1 is shared by right (yes) and twice (no); twice slips at line 0: the
    # empty prefix, shared by both siblings
    assert (r["sibling_pairs"], r["sibling_prefix_shared"]) == (4, 3 / 4)
    assert "| 3 | 3 | 0.333 | `*` 0.667, `+` 0.333, `-` 0.000 | 0.33 0.67 0.00 | 0.500 (of 2) | 0.750 (of 4) |" in (
        "\n".join(task_table({3: r}, "smollm2-135m-chain-long"))
    )


def test_working_lines_stop_at_the_answer_line_and_know_where_they_start():
    assert working("a\n\nb\nAnswer: 3\nc") == (["a", "b"], [0, 3])
