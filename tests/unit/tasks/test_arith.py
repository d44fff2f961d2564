import pytest

from rredcot.common.config import ConfigError, DataConfig, TaskConfig, load_config
from rredcot.common.task import build_task

DATA = DataConfig(eval_size=0)


def _evaluate(problem: str) -> int:
    expr = problem.removeprefix("What is ").removesuffix("?")
    return eval(expr, {"__builtins__": {}})  # test-only check of our own generated arithmetic


def arith(**settings):
    return build_task(TaskConfig("arith", settings))


def test_answers_are_correct_and_solutions_end_with_answer_line():
    for op in ("mul", "add", "chain"):
        task = arith(op=op, size=60, chain_steps=3, operand_max=20)
        probs = task.problems(DATA, seed=0)
        assert len({p.problem for p in probs}) == len(probs) == 60
        for p in probs:
            assert int(p.answer) == _evaluate(p.problem), p
            assert task.extract_answer(p.solution) == p.answer
            u, y = task.reference(p)
            assert y == f"Answer: {p.answer}" and "Answer" not in u and u.endswith(".\n")


def test_small_range_gives_all_distinct_problems_without_hanging():
    assert len(arith(op="mul", operand_min=2, operand_max=4, size=100).problems(DATA, 0)) == 9  # 3 x 3 pairs


def test_deterministic_in_seed():
    task = arith(op="chain", size=20)
    assert task.problems(DATA, 1) == task.problems(DATA, 1)
    assert task.problems(DATA, 1) != task.problems(DATA, 2)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("task.settings.operand_min=9", "task.settings.operand_min = 9 is not allowed; expected <= task.settings"),
        ("data.eval_size=25", "data.eval_size = 25 is not allowed; expected < task.settings.size (25)"),
        ("task.settings.chain_steps=0", "task.settings.chain_steps = 0 is not allowed; expected a number in [1, 8]"),
    ],
)
def test_cross_field_rules_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config("tests", [override])
    assert fragment in str(e.value)


def test_chain_example_shows_the_chain_format_and_mul_keeps_its_own():
    """The one-shot example teaches the family's lines of working (one per step), drawn apart from
    the problems; ``mul`` and ``add`` keep the 7 * 8 example (the CPU demo's prompt is unchanged)."""
    chain = build_task(TaskConfig("arith", {"op": "chain", "chain_steps": 4, "operand_min": 1, "operand_max": 5}))
    lines = chain.example.solution.splitlines()
    assert len(lines) == 5 and lines[-1] == f"Answer: {chain.example.answer}"
    assert all(" = " in line for line in lines[:4]) and chain.example.problem.count("(") == 3
    assert chain.example.problem not in {p.problem for p in chain.problems(DataConfig(), 0)}
    assert build_task(TaskConfig("arith", {"op": "mul"})).example.solution == "7 * 8 = 56.\nAnswer: 56"
