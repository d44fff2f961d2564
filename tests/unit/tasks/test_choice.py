"""The multiple-choice task: a non-numeric (letter) answer through the same task interface."""

import re

import pytest

from rredcot.common.config import DataConfig, TaskConfig, load_config
from rredcot.tasks.task import build_task
from rredcot.tasks.verifier import Verifier

SPEC = TaskConfig("choice", {"options": 5, "size": 40})


def test_gold_letter_names_the_largest_or_smallest_choice():
    task = build_task(SPEC)
    probs = task.problems(DataConfig(eval_size=0), seed=0)
    assert len(probs) == 40 and len({p.problem for p in probs}) > 30
    for p in probs:
        choices = dict(re.findall(r"^([A-E])\) (\d+)$", p.problem, re.MULTILINE))
        assert len(choices) == 5 and len(set(choices.values())) == 5
        pick = max if "largest" in p.problem else min
        assert p.answer == pick(choices, key=lambda letter: int(choices[letter]))
        assert task.extract_answer(p.solution) == p.answer
        assert task.reference(p)[1] == f"Answer: {p.answer}"


@pytest.mark.parametrize(
    ("completion", "letter"),
    [("Answer: C", "C"), ("answer: (B)", "B"), ("so...\nAnswer: D) 17.", "D"), ("Answer: 17", None), ("C", None)],
)
def test_letter_extraction(completion, letter):
    assert build_task(SPEC).extract_answer(completion) == letter


def test_the_answer_is_the_last_option_letter_standing_alone():
    """The first capital letter was the answer: ``I think it is B`` gave I (no option) and ``A is
    smaller, so B`` gave A; a lower-case ``b`` gave none. Options are A-E here."""
    task = build_task(SPEC)
    assert task.extract_answer("Answer: I think it is B") == "B"
    assert task.extract_answer("Answer: A is smaller, so B") == "B"
    assert task.extract_answer("Answer: b") == "B" and task.extract_answer("Answer: (d).") == "D"
    assert task.extract_answer("Answer: **C**") == "C"
    assert task.extract_answer("Answer: B is a bigger number") == "B"  # a capital letter before the article
    assert task.extract_answer("Answer: F") is None and task.extract_answer("Answer: I think so") is None


def test_verifier_scores_letters_in_its_isolated_process():
    with Verifier(SPEC, timeout_s=5.0) as v:
        assert v.score("The largest is 40.\nAnswer: (E)", "E").verdict == "correct"
        assert v.score("Answer: A", "E").verdict == "wrong"
        assert v.score("I think 40", "E").verdict == "no_answer"


def test_config_selects_it_and_checks_its_settings():
    cfg = load_config("tests", ["task.name=choice", "task.settings={options: 3, size: 30}"])
    assert build_task(cfg.task).settings.options == 3
    with pytest.raises(ValueError, match=r"task.settings.options = 9 is not allowed; expected a number in \[2, 8\]"):
        load_config("tests", ["task.name=choice", "task.settings={options: 9}"])
