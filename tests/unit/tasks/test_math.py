import pytest

from rredcot.common.config import ConfigError, DataConfig, TaskConfig, load_config
from rredcot.tasks.task import build_task

MATH = build_task(TaskConfig("math"))


def test_extract_answer_prefers_last_answer_line_then_boxed():
    assert MATH.extract_answer("3 * 4 = 12.\nAnswer: 12") == "12"
    assert MATH.extract_answer("answer is: 7.\nmore text\nThe answer: 8") == "8"
    assert MATH.extract_answer(r"so \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert MATH.extract_answer("no idea") is None


def test_math_verify_equivalence():
    assert MATH.answers_match("0.5", r"\frac{1}{2}") and MATH.answers_match("12", "12")
    assert not MATH.answers_match("13", "12")
    assert MATH.answers_match("(3, 4)", "(3, 4)") and not MATH.answers_match("(3, 4)", "4")  # a pair, not 4
    assert MATH.answers_match("2 x", "2x")  # one letter after a number stays algebra


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("**56**", "56"), ("**-5**", "-5"), ("**3/4**", "3/4"), ("__56__", "56"), ("*56*", "56")]
    + [("20 dollars", "20"), ("20 cookies", "20"), ("20 pages", "20"), ("20 people", "20")]
    + [("5 miles per hour", "5"), (r"\frac{3}{4} cups", "3/4")],
)
def test_emphasis_and_units_around_a_number_are_read_as_the_number(answer, gold):
    """``**56**`` was no number to math-verify, and ``20 dollars`` was 20·d·o·l·l·a·r·s (while
    ``20 apples`` was 20: 'apples' happened to be no product of symbols it knows)."""
    found = MATH.extract_answer(f"The total is 20.\nAnswer: {answer}")
    assert MATH.answers_match(found, gold)


def test_a_wrong_number_with_units_is_still_wrong():
    assert MATH.answers_match("20 dollars", "20") and not MATH.answers_match("21 dollars", "20")


def test_rows_come_from_the_dataset_file(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"problem": "1+1?", "solution": "2. \\\\boxed{2}"}\n')
    probs = MATH.problems(DataConfig(source="jsonl", path=str(f), eval_size=0), seed=0)
    assert [(p.problem, p.answer) for p in probs] == [("1+1?", "2")]
    assert MATH.reference(probs[0]) == ("2. \\boxed{2}\n", "Answer: 2")


def test_needs_a_dataset_path_and_takes_no_settings():
    with pytest.raises(ConfigError, match="data.path = None is not allowed; expected a file or dataset path"):
        load_config(None)
    with pytest.raises(ConfigError, match=r"task.settings = \{'size': 3\} is not allowed; expected \{\}: task 'math'"):
        load_config(None, ["data.path=x.jsonl", "task.settings={size: 3}"])
