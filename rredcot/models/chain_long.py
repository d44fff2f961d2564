"""``smollm2-135m-chain-long``: the positive-control study's policy (docs/study.md), SmolLM2-135M
after an SFT on long chains: 2 to 16 steps in the ``steps`` layout, each line in one of three
phrasings, values in [0, 20] (``CHAIN_TASK``), prompted without a worked example.
``qwen2.5-1.5b-chain-long`` is the same recipe on Qwen2.5-1.5B-Instruct (from the hub: it needs network
or a filled Hugging Face cache), for the study on a GPU node (``control_gpu``); a build runs on the GPU
when there is one.

Its one weakness is planted: in its training lines a product's result is off by 1 or 2 three times
in ten (``SLIP``), the later lines carrying the slip forward, so the model slips on products more
than on sums and differences. A policy whose main kind of mistake is known is what a positive
control needs: credit that lands on the product's line should learn faster. Built once per machine
(minutes on 2 cores) and cached like the other builtins; the same model for every run.

A 3M-parameter byte-level Llama trained from scratch was tried first (cheaper RL steps): after 800
SFT steps (26 min on 2 cores) it wrote the format but not the arithmetic, right 4% of the time at
every length (docs/study.md).
"""

from __future__ import annotations

import logging
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from rredcot.common.config import DataConfig, TaskConfig
from rredcot.common.registry import MODELS
from rredcot.models.smollm import smollm2_dir
from rredcot.models.store import build_once, cache_dir, digest, load_tokenizer, recipe_dir
from rredcot.tasks.arith import solution_text
from rredcot.tasks.chain import OPS, parse_chain, step_line
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.task import build_task

NAME = "smollm2-135m-chain-long"
# builtin name -> its base: a function giving a local directory, or a hub id
BASES: dict[str, Any] = {NAME: smollm2_dir, "qwen2.5-1.5b-chain-long": "Qwen/Qwen2.5-1.5B-Instruct"}
CHAIN_TASK = {"op": "chain", "layout": "steps", "phrasings": 3, "value_max": 20, "operand_min": 2, "operand_max": 5}
LENGTHS = tuple(range(2, 17))
SLIP = {"op": "*", "rate": 0.3, "deltas": (-2, -1, 1, 2)}
SFT = {"steps": 150, "lr": 1e-4, "batch": 8, "seed": 1, "per_length": 40}
PROMPT = DataConfig(eval_size=0, prompt_style="chat")

log = logging.getLogger(__name__)


def planted_solution(problem: Any, rng: np.random.Generator) -> str:
    """The problem's working, each line phrased at random, with ``SLIP``'s planted slips."""
    ops, operands = parse_chain(problem)
    value, lines = operands[0], []
    for i, (op, b) in enumerate(zip(ops, operands[1:])):
        new = OPS[op](value, b)
        if op == SLIP["op"] and rng.random() < SLIP["rate"]:
            new += int(rng.choice(SLIP["deltas"]))
        lines.append(step_line(i, value, op, b, new, int(rng.integers(0, 3)), labelled=True))
        value = new
    return solution_text(lines, value, think=False)


def sft_pairs(tok: Any, per_length: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, planted solution + EOS) token ids: ``per_length`` problems of every length."""
    rng = np.random.default_rng([seed, 1])
    pairs = []
    for n in LENGTHS:
        task = build_task(TaskConfig("arith", {**CHAIN_TASK, "chain_steps": n, "size": per_length}))
        for p in task.problems(PROMPT, seed):
            solution = planted_solution(p, rng) + tok.eos_token
            pairs.append((prompt_ids(p, task, PROMPT, tok), tok(solution, add_special_tokens=False)["input_ids"]))
    return pairs


def base_of(name: str) -> str:
    """The base model's directory (built on first use) or hub id."""
    base = BASES[name]
    return str(base() if callable(base) else base)


@cache
def recipe(name: str = NAME) -> dict[str, Any]:
    """What the model depends on: the constants and a digest of its training pairs."""
    pairs = sft_pairs(load_tokenizer(base_of(name)), SFT["per_length"], SFT["seed"])
    return {"builtin": name, "task": CHAIN_TASK, "slip": SLIP, **SFT, "pairs": digest(pairs)}


def build(name: str, out: Path) -> None:
    import torch

    from rredcot.models.store import load_causal_lm, save_model_dir
    from rredcot.models.warmstart import sft

    base = base_of(name)
    tok = load_tokenizer(base)
    torch.manual_seed(SFT["seed"])
    model = load_causal_lm(base, "float32").to("cuda" if torch.cuda.is_available() else "cpu")
    steps = {k: SFT[k] for k in ("steps", "lr", "batch", "seed")} | {"bucketed": True}

    def progress(step: int, loss: float) -> None:
        log.info("%s: SFT step %d of %d, loss %.3f", name, step, SFT["steps"], loss)

    model = sft(model, tok, sft_pairs(tok, SFT["per_length"], SFT["seed"]), **steps, log=progress)
    save_model_dir(model.to("cpu"), tok, out)


@MODELS.register(NAME)
@MODELS.register("qwen2.5-1.5b-chain-long")
def chain_long_dir(name: str = NAME, seed: int = 0, root: str | Path | None = None) -> Path:
    """The built model's directory (built on first use; ``seed``: one model for every run)."""
    folder = Path(root or cache_dir() / "models")
    return build_once(recipe_dir(folder, name, recipe(name)), partial(build, name), recipe(name))
