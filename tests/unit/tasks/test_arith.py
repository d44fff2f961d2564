import re

import pytest

from rredcot.common.config import ConfigError, DataConfig, TaskConfig, load_config
from rredcot.tasks.data import Problem, train_and_held_out
from rredcot.tasks.task import build_task

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


def _twin(problem: str) -> str:
    """A problem and its commuted twin give one text: ``What is 8 * 3?`` and ``What is 3 * 8?`` give
    ``3 * 8``, ``What is (5 + 2) - 1?`` gives ``(2 + 5) - 1``; a subtraction keeps its order. A
    ``steps`` problem (``Start with 7.`` then ``Step 1: + 5``) is its own: it asks another question."""
    if problem.startswith("Start with "):
        return problem
    m = re.fullmatch(r"What is (\(*)(\d+) ([-+*]) (\d+)(.*)\?", problem)
    assert m, problem
    a, op, b = int(m[2]), m[3], int(m[4])
    if op != "-":
        a, b = sorted((a, b))
    return f"{m[1]}{a} {op} {b}{m[5]}"


def _twins(problems: list[Problem]) -> set[str]:
    return {_twin(p.problem) for p in problems}


def test_commuted_twins_are_one_problem_and_the_example_is_none():
    """Every problem the settings can make, once: a × b and b × a are one problem, and the 7 * 8
    example is no ``mul`` problem (it was problem mul-115 of the defaults)."""
    small = arith(op="mul", operand_min=2, operand_max=4, size=100).problems(DATA, 0)
    assert sorted(_twins(small)) == ["2 * 2", "2 * 3", "2 * 4", "3 * 3", "3 * 4", "4 * 4"]  # a <= b
    assert len(small) == 6
    assert len(arith(op="add", operand_min=2, operand_max=4, size=100).problems(DATA, 0)) == 6
    assert _twins(arith(op="mul", operand_min=7, operand_max=8, size=100).problems(DATA, 0)) == {"7 * 7", "8 * 8"}
    # one step of 1 or 2: 3 sums + 3 products + 4 differences, less the example
    chain = arith(op="chain", chain_steps=1, operand_min=1, operand_max=2, size=100)
    made = chain.problems(DATA, 0)
    assert len(made) == len(_twins(made)) == 9 and _twin(chain.example.problem) not in _twins(made)
    assert "7 * 8" not in _twins(arith(op="mul").problems(DATA, 0))


@pytest.mark.parametrize("seed", [0, 1])
def test_held_out_problems_have_no_twin_in_training_and_the_example_is_in_neither(seed):
    """The CPU demo held out 34 of its 40 problems with b × a in training; the chain example came
    from the problems' own stream with seed 1, so run.seed=1 held it out (chain-0)."""
    for name in ("demo_cpu", "study_cpu"):
        cfg = load_config(name, [f"run.seed={seed}"])
        task = build_task(cfg.task)
        train, held = train_and_held_out(task, cfg.data, cfg.run.seed)
        assert len(held) == cfg.data.eval_size > 0 and not _twins(held) & _twins(train), name
        assert _twin(task.example.problem) not in _twins(train) | _twins(held), name


def test_only_an_integer_written_as_a_number_is_an_answer():
    """math-verify evaluated any expression: copying the question (7 * 8) scored."""
    task = arith()

    def right(answer: str, gold: str) -> bool:
        found = task.extract_answer(f"Working.\nAnswer: {answer}")
        return found is not None and task.answers_match(found, gold)

    assert not right("7 * 8", "56")
    assert not right("(((2 + 4) + 3) + 2) + 4", "15")
    assert not right("14 = (((2 + 4) + 3) + 2) + 4", "15")
    assert not right("56.0", "56") and not right("57", "56") and not right("1,02", "102")
    for answer, gold in [("56", "56"), ("**56**", "56"), ("*56*", "56"), ("$56$", "56"), ("56.", "56")]:
        assert right(answer, gold), answer
    for answer, gold in [("1,024", "1024"), ("$-1,024$", "-1024"), ("\u22125", "-5"), ("-5", "-5")]:
        assert right(answer, gold), answer
    assert task.answers_match(task.extract_answer("so \\boxed{56}"), "56")  # no answer line: the box


def test_deterministic_in_seed():
    task = arith(op="chain", size=20)
    assert task.problems(DATA, 1) == task.problems(DATA, 1)
    assert task.problems(DATA, 1) != task.problems(DATA, 2)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("task.settings.operand_min=9", "task.settings.operand_min = 9 is not allowed; expected <= task.settings"),
        ("task.settings.size=5", "data.eval_size = 5 is not allowed; expected < task.settings.size (5)"),
        ("task.settings.chain_steps=0", "task.settings.chain_steps = 0 is not allowed; expected a number in [1, 16]"),
        # 15 distinct products a × b (2 <= a <= b <= 6), 5 held out: 10 to train on
        ("data.train_size=11", "data.train_size = 11 is not allowed; expected 0 (every problem not held out) or <= 10"),
        ("logging.eval_train=11", "logging.eval_train = 11 is not allowed; expected <= 10, the problems the run"),
        ("data.train_size=4 logging.eval_train=5", "logging.eval_train = 5 is not allowed; expected <= 4"),
    ],
)
def test_cross_field_rules_name_the_key(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config("tests", override.split())
    assert fragment in str(e.value)


def test_train_size_keeps_the_first_training_problems_and_the_same_held_out():
    """``data.train_size`` narrows the pool the generators draw from; the held-out split is untouched."""
    every = load_config("tests")
    four = load_config("tests", ["data.train_size=4"])
    task = build_task(every.task)
    train, held = train_and_held_out(task, every.data, every.run.seed)
    pool, same_held = train_and_held_out(task, four.data, four.run.seed)
    assert len(train) == 10 and pool == train[:4] and same_held == held


def test_chain_example_shows_the_chain_format_and_mul_keeps_its_own():
    """The one-shot example teaches the family's lines of working (one per step), drawn apart from
    the problems; ``mul`` and ``add`` keep the 7 * 8 example (the CPU demo's prompt is unchanged)."""
    chain = build_task(TaskConfig("arith", {"op": "chain", "chain_steps": 4, "operand_min": 1, "operand_max": 5}))
    lines = chain.example.solution.splitlines()
    assert len(lines) == 5 and lines[-1] == f"Answer: {chain.example.answer}"
    assert all(" = " in line for line in lines[:4]) and chain.example.problem.count("(") == 3
    assert chain.example.problem not in {p.problem for p in chain.problems(DataConfig(), 0)}
    assert build_task(TaskConfig("arith", {"op": "mul"})).example.solution == "7 * 8 = 56.\nAnswer: 56"


def test_eval_size_must_leave_some_of_the_distinct_problems_to_train_on():
    """The default mul makes 66 products a × b with a <= b in 2..12, less the 7 * 8 example: 65. The
    check compared data.eval_size with task.settings.size (2000) and the run failed later with 'no
    training problems'."""
    defaults = ["task.settings.operand_max=12", "task.settings.size=2000"]
    assert load_config("tests", [*defaults, "data.eval_size=64"]).data.eval_size == 64
    with pytest.raises(ConfigError) as e:
        load_config("tests", [*defaults, "data.eval_size=65"])
    assert "data.eval_size = 65 is not allowed; expected < 65, the distinct problems task.settings" in str(e.value)


def test_the_thinking_format_puts_the_working_inside_the_tags_and_u_without_them():
    task = arith(op="chain", chain_steps=3, operand_max=5, size=20, think=True)
    for p in [*task.problems(DATA, seed=0), task.example]:
        u, y = task.reference(p)
        assert p.solution == f"<think>\n{u.rstrip()}\n</think>\n\nAnswer: {p.answer}"
        assert y == f"Answer: {p.answer}" and "think>" not in u and len(u.splitlines()) == 3
        assert task.extract_answer(p.solution.split("</think>")[1]) == p.answer


def test_chain_lines_carry_a_slip_forward_and_the_checker_finds_it():
    from rredcot.tasks.chain import chain_lines, first_slip, parse_chain

    p = arith(op="chain", chain_steps=4, operand_max=5, size=30).problems(DATA, seed=0)[0]
    ops, operands = parse_chain(p)
    assert p.problem.count("(") == 3 and len(ops) == 4 and len(operands) == 5
    right, value = chain_lines(ops, operands)
    assert str(value) == p.answer and first_slip(p, right) is None
    for j in range(4):
        slipped, wrong = chain_lines(ops, operands, slip_at=j, delta=2)
        assert wrong != value and slipped[:j] == right[:j] and first_slip(p, slipped) == j
    assert first_slip(p, right[:3]) == 3  # a missing step: no line to blame
    assert first_slip(p, [right[0], "so far so good", *right[2:]]) == 1  # not a step
    copied = right[1].split(" ", 1)  # the previous result copied wrong: "9 * 4 = 36." after "... = 8."
    assert first_slip(p, [right[0], f"{int(copied[0]) + 1} {copied[1]}", *right[2:]]) == 1
    assert first_slip(p, [*right, right[-1]]) == 4  # a line past the last step


def test_chain_problems_and_texts_by_hand():
    from rredcot.tasks.arith import make_problem, solution_text
    from rredcot.tasks.chain import chain_lines

    p = make_problem("x", ("+", "*"), (2, 3, 4))
    assert (p.problem, p.answer) == ("What is (2 + 3) * 4?", "20")
    assert chain_lines(("+", "*"), (2, 3, 4), slip_at=0, delta=-1) == (["2 + 3 = 4.", "4 * 4 = 16."], 16)
    assert solution_text(["a.", "b."], 7, think=False) == "a.\nb.\nAnswer: 7"
