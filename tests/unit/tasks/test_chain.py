"""The chain family's layouts, phrasings, bounded draws and slip checker (``rredcot/tasks/chain.py``)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.common.config import ConfigError, DataConfig, TaskConfig, load_config
from rredcot.tasks.arith import ArithSettings, distinct_problems, key
from rredcot.tasks.chain import (
    OPS,
    PHRASINGS,
    chain_lines,
    count_bounded,
    draw_bounded,
    first_slip,
    parse_chain,
    read_step,
    step_line,
)
from rredcot.tasks.data import Problem
from rredcot.tasks.task import build_task

DATA = DataConfig(eval_size=0)
LONG = {"op": "chain", "chain_steps": 16, "layout": "steps", "phrasings": 3, "value_max": 30, "operand_min": 2}


def chain(**settings):
    return build_task(TaskConfig("arith", {**LONG, "operand_max": 9, "size": 200, **settings}))


def test_a_steps_question_and_its_solution_by_hand():
    from rredcot.tasks.arith import make_problem

    p = make_problem("x", ("+", "*", "-"), (7, 5, 2, 4), layout="steps", phrasings=[0, 1, 2])
    assert p.problem == "Start with 7.\nStep 1: + 5\nStep 2: * 2\nStep 3: - 4\nWhat is the result?"
    assert p.solution == "Step 1: 7 + 5 = 12.\nStep 2: 12 times 2 is 24.\nStep 3: 24 - 4 gives 20.\nAnswer: 20"
    assert parse_chain(p) == (("+", "*", "-"), (7, 5, 2, 4)) and p.answer == "20"


def test_every_phrasing_reads_back_as_its_step():
    for (op, phrasing), labelled in itertools.product(itertools.product(OPS, range(len(PHRASINGS))), (False, True)):
        line = step_line(4, 12, op, 3, OPS[op](12, 3), phrasing, labelled)
        assert read_step(line) == ((5 if labelled else None), 12, op, 3, OPS[op](12, 3)), line
    assert read_step("so far so good") is None and read_step("Step 2: 12 times 3 = 36.") is None


def test_sixteen_step_problems_stay_in_range_use_every_phrasing_and_check_right():
    task = chain()
    problems = task.problems(DATA, seed=0)
    assert len(problems) == 200 and len({p.problem for p in problems}) == 200
    words = set()
    for p in problems:
        ops, operands = parse_chain(p)
        assert len(ops) == 16 and all(2 <= b <= 9 for b in operands[1:])
        lines = p.solution.splitlines()[:-1]
        values = [read_step(line)[4] for line in lines]
        assert all(0 <= v <= 30 for v in values) and str(values[-1]) == p.answer
        assert first_slip(p, lines) is None and task.first_slip(p, lines) is None
        words |= {line.split()[5] for line in lines}  # "Step i: a op b" then '=', 'is' or 'gives'
    assert words == {"=", "is", "gives"}
    assert task.checks_slips and not build_task(TaskConfig("arith", {"op": "mul"})).checks_slips


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 15), st.sampled_from([-2, -1, 1, 2]), st.integers(0, 2))
def test_the_checker_finds_a_planted_slip_in_any_phrasing(seed, at, delta, phrasing):
    """A slip at line j, carried forward by the later lines, each line phrased at random: the checker
    names j, whatever the phrasings; the right chain in the same phrasings has none."""
    rng = np.random.default_rng(seed)
    ops, operands = draw_bounded(rng, 16, 2, 9, 30)
    p = Problem("x", _question(ops, operands), "", "")
    phrasings = rng.integers(0, 3, 16).tolist()
    right, value = chain_lines(ops, operands, phrasings=phrasings, labelled=True)
    slipped, wrong = chain_lines(ops, operands, slip_at=at, delta=delta, phrasings=phrasings, labelled=True)
    assert first_slip(p, right) is None and first_slip(p, slipped) == at and wrong != value
    assert first_slip(p, right[:at]) == at  # the steps from j on missing


def _question(ops, operands):
    from rredcot.tasks.chain import question

    return question(ops, operands, "steps")


def test_a_wrong_step_label_or_a_skipped_step_is_a_slip():
    p = build_task(TaskConfig("arith", {**LONG, "chain_steps": 3, "operand_max": 9, "size": 5})).problems(DATA, 0)[0]
    ops, operands = parse_chain(p)
    right, _ = chain_lines(ops, operands, labelled=True)
    relabelled = right[1].replace("Step 2:", "Step 3:")
    assert first_slip(p, [right[0], relabelled, right[2]]) == 1
    assert first_slip(p, [right[0], right[2]]) == 1  # step 2 skipped: step 3's operands on line 2


def bounded_chains(steps: int, lo: int, hi: int, top: int) -> list[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Brute force: every (ops, operands) chain from a start in [lo, min(hi, top)] whose running value
    stays in [0, top]."""
    out = []
    for start in range(lo, min(hi, top) + 1):
        for path in itertools.product(itertools.product(OPS, range(lo, hi + 1)), repeat=steps):
            v, ok = start, True
            for op, b in path:
                v = OPS[op](v, b)
                ok &= 0 <= v <= top
            if ok:
                out.append((tuple(op for op, _ in path), (start, *(b for _, b in path))))
    return out


def test_the_bounded_count_is_every_chain_draw_can_make():
    """``count_bounded`` against brute force: every (start, op, operand) path kept in range."""
    for steps, lo, hi, top in [(1, 2, 4, 6), (2, 1, 3, 5), (3, 2, 3, 8)]:
        assert count_bounded(steps, lo, hi, top) == len(bounded_chains(steps, lo, hi, top))
    s = build_task(TaskConfig("arith", {**LONG, "chain_steps": 1, "operand_min": 2, "operand_max": 3, "value_max": 4}))
    made = s.problems(DATA, 0)
    assert len(made) == distinct_problems(s.settings) == count_bounded(1, 2, 3, 4) - 1  # less the example


def test_the_nested_count_merges_a_commutative_first_step_as_key_does():
    """In the nested layout ``(a + b) - c`` and ``(b + a) - c`` are one problem (``key``). The count
    took them as two (56,438 counted where 40,569 exist for 4 steps of 1..5 kept in [0, 10]), so
    ``generate`` with a size between the two drew forever."""
    for steps, lo, hi, top in [(1, 1, 4, 6), (2, 1, 3, 5), (3, 1, 3, 6)]:
        keys = {key(*chain) for chain in bounded_chains(steps, lo, hi, top)}
        assert count_bounded(steps, lo, hi, top, merge_commutative=True) == len(keys)
    settings = {"op": "chain", "chain_steps": 2, "operand_min": 1, "operand_max": 3, "value_max": 5}
    wanted = distinct_problems(ArithSettings(**settings))
    assert wanted < count_bounded(2, 1, 3, 5) - 1  # the old count, which generate could never reach
    made = build_task(TaskConfig("arith", {**settings, "size": wanted + 5})).problems(DATA, 0)
    assert len(made) == wanted


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("task.settings.chain_steps=17", "task.settings.chain_steps = 17 is not allowed; expected a number in [1, 16]"),
        ("task.settings.phrasings=4", "task.settings.phrasings = 4 is not allowed; expected a number in [1, 3]"),
        ("task.settings.layout=flat", "task.settings.layout = 'flat' is not allowed"),
        ("task.settings.value_max=1", "task.settings.value_max = 1 is not allowed; expected 0 (any value) or >="),
    ],
)
def test_chain_settings_out_of_range_name_the_key(override, fragment):
    chain_cfg = ["task.settings.op=chain", "task.settings.operand_min=2", "task.settings.size=300"]
    with pytest.raises(ConfigError) as e:
        load_config("tests", [*chain_cfg, override])
    assert fragment in str(e.value)


def test_chain_only_settings_on_another_family_are_refused():
    with pytest.raises(ConfigError) as e:
        load_config("tests", ["task.settings.layout=steps"])
    assert "task.settings.layout, phrasings and value_max shape chains only" in str(e.value)
