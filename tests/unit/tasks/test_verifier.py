import time

import numpy as np
import pytest

from rredcot.common.config import TaskConfig, load_config
from rredcot.tasks.verifier import Verdict, Verifier, checked


@pytest.fixture(scope="module")
def verifier():
    with Verifier(TaskConfig("math"), timeout_s=1.0) as v:
        yield v


@pytest.mark.parametrize(
    ("completion", "gold", "verdict"),
    [
        ("2 * 6 = 12\nAnswer: 12", "12", "correct"),
        (r"Thus \boxed{\frac{1}{2}}", "0.5", "correct"),
        ("Answer: 13", "12", "wrong"),
        ("I give up", "12", "no_answer"),
    ],
)
def test_scores(verifier, completion, gold, verdict):
    v = verifier.score(completion, gold)
    assert v.verdict == verdict
    assert v.reward == (1.0 if verdict == "correct" else 0.0)


def test_the_answer_is_read_after_the_thinking(verifier):
    """A guess inside the thinking is no answer, and a thought never closed (truncated) has none."""
    revised = "<think>\nSo the answer is: 12, hmm wait.\nActually 13.\n</think>\n\nThe result is \\boxed{13}."
    assert verifier.score(revised, "13").verdict == "correct"
    assert verifier.score("<think>\nLet me guess the answer: 84\nWait, check", "84") == Verdict(0.0, "no_answer")
    with Verifier(TaskConfig("math"), think=("<r>", "</r>")) as own:  # the model's own tags
        assert own.score("<r>Answer: 84</r>I am not sure", "84") == Verdict(0.0, "no_answer")


def test_the_runs_verifier_reads_the_models_tags_and_timeout():
    cfg = load_config("tests", ["model.think_start=<r>", "model.think_end=</r>", "generation.verifier_timeout_s=2.5"])
    with Verifier.from_config(cfg) as v:
        assert v.timeout_s == 2.5 and v.think == ("<r>", "</r>")
        assert v.score("<r>Answer: 84</r>Answer: 85", "85").verdict == "correct"


def test_pathological_input_times_out_and_verifier_recovers(verifier):
    before = verifier.timeouts
    t0 = time.monotonic()
    v = verifier.score(r"Answer: \boxed{9^{9^{9^{9}}}}", "1")
    assert (v.reward, v.verdict) == (0.0, "timeout")
    assert time.monotonic() - t0 < 4.0  # the hard timeout (1 s), not math-verify's own 5 s
    assert verifier.timeouts == before + 1
    assert verifier.score("Answer: 5", "5").verdict == "correct"  # a fresh child took over


def test_a_checker_that_crashes_hangs_or_raises_gives_reward_0_and_the_next_check_works():
    """A task's own checker (tests/extensions/fragile.py) kills its process, hangs, or raises: each
    sample gets reward 0 and is counted, and the verifier goes on with a fresh process."""
    with Verifier(TaskConfig("tests.extensions.fragile"), timeout_s=1.0) as v:
        assert v.score("Answer: crash", "1") == Verdict(0.0, "error")
        assert v.score("Answer: 1", "1") == Verdict(1.0, "correct")
        assert v.score("Answer: hang", "1") == Verdict(0.0, "timeout")
        assert v.score("Answer: raise", "1") == Verdict(0.0, "error")
        assert v.score("Answer: 2", "1") == Verdict(0.0, "wrong")
        assert (v.errors, v.timeouts) == (2, 1)


@pytest.mark.parametrize("answer", ["nan", "-inf", "0.3", "no", "yes"])
def test_a_checker_that_answers_with_anything_but_a_bool_is_an_error_not_correct(answer, caplog):
    """NaN, -inf, 0.3 and the strings "no" and "yes" are truthy or not, never verdicts: each is a
    verifier error with reward 0, and the log names the task and the value."""
    with Verifier(TaskConfig("tests.extensions.fragile"), timeout_s=5.0) as v, caplog.at_level("WARNING"):
        assert v.score(f"Answer: {answer}", "1") == Verdict(0.0, "error")
        assert v.errors == 1 and v.score("Answer: 1", "1") == Verdict(1.0, "correct")
    assert "'tests.extensions.fragile'" in caplog.text and "not a bool" in caplog.text


def test_checked_takes_bools_of_both_kinds_and_nothing_else():
    assert checked("t", True) == (True, None) and checked("t", np.bool_(False)) == (False, None)
    for value in (1, 1.0, "True", None):
        ok, error = checked("t", value)
        assert not ok and error is not None and repr(value) in error
