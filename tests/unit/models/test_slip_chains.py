"""The slip-chain builtins' recipes: their training solutions slip only on products, about as often
as planted; their training pairs hold the prompt without a worked example and the solution with EOS,
at the recipe's lengths; a recipe's digest moves with what its model depends on."""

import numpy as np

from rredcot.common.config import TaskConfig
from rredcot.models.slip_chains import CHAIN_TASK, PROMPT, SLIP, SLIP_CHAIN_MODELS, planted_solution, recipe, sft_pairs
from rredcot.models.smollm import smollm2_tokenizer_dir
from rredcot.models.store import digest, load_tokenizer
from rredcot.tasks.chain import checked_steps, first_slip
from rredcot.tasks.task import build_task


def test_planted_slips_fall_on_products_at_the_planted_rate_and_nowhere_else():
    task = build_task(TaskConfig("arith", {**CHAIN_TASK, "chain_steps": 16, "size": 300}))
    rng = np.random.default_rng(0)
    kinds: dict[str, list[int]] = {}
    first_on_product = 0
    for p in task.problems(PROMPT, 0):
        lines = planted_solution(p, rng).splitlines()[:-1]
        for kind, right in checked_steps(lines):
            kinds.setdefault(kind, [0, 0])[0] += not right
            kinds[kind][1] += 1
        slip = first_slip(p, lines)
        first_on_product += slip is not None and " * " in p.problem.splitlines()[slip + 1]
        assert slip is None or not checked_steps([lines[slip]])[0][1]  # the checker's line is the slipped one
    assert kinds["+"][0] == kinds["-"][0] == 0
    wrong, made = kinds["*"]
    assert made > 300 and abs(wrong / made - SLIP["rate"]) < 0.06
    assert first_on_product > 0


def test_the_training_pairs_hold_the_question_alone_and_the_solution_with_eos():
    tok = load_tokenizer(smollm2_tokenizer_dir())
    pairs = sft_pairs(tok, SLIP_CHAIN_MODELS["smollm2-135m-chain-long"].lengths, 2, seed=1)
    assert len(pairs) == 2 * 15
    prompt, solution = pairs[-1]
    text = tok.decode(prompt)
    assert "Solve the problem." in text and "Step 16: " in text and text.count("Start with") == 1  # no example
    assert solution[-1] == tok.eos_token_id and tok.decode(solution[:-1]).splitlines()[-1].startswith("Answer: ")


def test_the_demo_model_is_taught_short_chains_and_the_study_model_keeps_its_recipe():
    """The demo's builtin learns 2-4-step chains only; the study's recipe digest is the one its
    results were measured with (a change would rebuild it and detach docs/study.md from its model)."""
    tok = load_tokenizer(smollm2_tokenizer_dir())
    short = sft_pairs(tok, SLIP_CHAIN_MODELS["smollm2-135m-chain-short"].lengths, 3, seed=1)
    steps = [tok.decode(prompt).count("\nStep ") for prompt, _ in short]
    assert sorted(set(steps)) == [2, 3, 4] and len(short) == 9
    assert digest(recipe("smollm2-135m-chain-long")) == "686e004fea57"
    assert recipe("smollm2-135m-chain-short")["pairs"] != recipe("smollm2-135m-chain-long")["pairs"]
