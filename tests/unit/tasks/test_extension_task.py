"""docs/extending.md's example task (tests/extensions/double.py), picked by its module path."""

import pytest

from rredcot.common.config import ConfigError, DataConfig, load_config
from rredcot.tasks.prompts import messages
from rredcot.tasks.task import build_task
from rredcot.tasks.verifier import Verifier

OVERRIDES = ["task.name=tests.extensions.double", "task.settings={largest: 12}", "data.eval_size=2"]


def test_config_names_the_module_and_its_settings_are_checked():
    cfg = load_config("tests", OVERRIDES)
    task = build_task(cfg.task)
    probs = task.problems(cfg.data, seed=0)
    assert len(probs) == 12 and probs[3].problem == "What is twice 4?" and probs[3].answer == "8"
    assert messages(probs[3], task, DataConfig())[0]["content"].endswith("What is twice 7?")  # its own example
    with pytest.raises(
        ConfigError, match=r"task.settings.largest = 0 is not allowed; expected a number in \[1, 1000000\]"
    ):
        load_config("tests", [*OVERRIDES[:1], "task.settings={largest: 0}"])


def test_its_own_answer_check_runs_in_the_verifier():
    cfg = load_config("tests", OVERRIDES)
    with Verifier(cfg.task, timeout_s=5.0) as v:
        assert v.score("4 * 2 = 8.\nAnswer: 8", "8").verdict == "correct"
        assert v.score("Answer: 8.0", "8").verdict == "wrong"  # exact integers: math-verify would accept it
        assert v.score("eight", "8").verdict == "no_answer"
