from rredcot.common.config import DataConfig
from rredcot.common.tasks import synthetic_problems
from rredcot.common.verifier import extract_answer


def _evaluate(problem: str) -> int:
    expr = problem.removeprefix("What is ").removesuffix("?")
    return eval(expr, {"__builtins__": {}})  # test-only check of our own generated arithmetic


def test_answers_are_correct_and_solutions_end_with_answer_line():
    for task in ("mul", "add", "chain"):
        probs = synthetic_problems(DataConfig(task=task, size=60, chain_steps=3, operand_max=20))
        assert len({p.problem for p in probs}) == len(probs) == 60
        for p in probs:
            assert int(p.answer) == _evaluate(p.problem), p
            assert extract_answer(p.solution) == p.answer


def test_small_range_gives_all_distinct_problems_without_hanging():
    probs = synthetic_problems(DataConfig(task="mul", operand_min=2, operand_max=4, size=100))
    assert len(probs) == 9  # 3 x 3 ordered pairs


def test_deterministic_in_seed():
    cfg = DataConfig(task="chain", size=20)
    assert synthetic_problems(cfg, seed=1) == synthetic_problems(cfg, seed=1)
    assert synthetic_problems(cfg, seed=1) != synthetic_problems(cfg, seed=2)
