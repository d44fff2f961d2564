"""Chain models with a planted weakness: SmolLM2-135M (or Qwen2.5-1.5B) after an SFT on chains in
the ``steps`` layout, each line in one of three phrasings, values in [0, 20] (``CHAIN_TASK``),
prompted without a worked example. In their training lines a product's result is off by 1 or 2
three times in ten (``SLIP``), the later lines carrying the slip forward, so the models slip on
products more than on sums and differences. A policy whose main kind of mistake is known is what
credit needs to be seen at work (the demo) and what a positive control needs (the study): credit
that lands on the product's line should learn faster. Each is built once per machine and cached
like the other builtins; the same model for every run (``SLIP_CHAIN_MODELS``):

- ``smollm2-135m-chain-short``: the CPU demo's policy, 2-4-step chains, 40 SFT steps (2-3 min on
  2 cores): right about a third of the time on the demo's 3-step chains, its wrong traces mostly one
  wrong line;
- ``smollm2-135m-chain-long``: the positive-control study's (docs/study.md), 2-16 steps, 150 SFT
  steps (28 min on 2 cores);
- ``qwen2.5-1.5b-chain-long``: the long recipe on Qwen2.5-1.5B-Instruct (from the hub: it needs
  network or a filled Hugging Face cache), for the study on a GPU node (``control_gpu``); a build
  runs on the GPU when there is one.

A 3M-parameter byte-level Llama trained from scratch was tried first for the study (cheaper RL
steps): after 800 SFT steps (26 min on 2 cores) it wrote the format but not the arithmetic, right
4% of the time at every length (docs/study.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from rredcot.common.config import DataConfig, TaskConfig
from rredcot.common.registry import MODELS
from rredcot.models.smollm import smollm2_dir, smollm2_tokenizer_dir
from rredcot.models.store import build_once, cache_dir, digest, load_tokenizer, recipe_dir
from rredcot.tasks.arith import solution_text
from rredcot.tasks.chain import OPS, parse_chain, step_line
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.task import build_task

CHAIN_TASK = {"op": "chain", "layout": "steps", "phrasings": 3, "value_max": 20, "operand_min": 2, "operand_max": 5}
SLIP = {"op": "*", "rate": 0.3, "deltas": (-2, -1, 1, 2)}
PROMPT = DataConfig(eval_size=0, prompt_style="chat")


@dataclass(frozen=True)
class SlipChainModel:
    """A builtin's recipe: its base, the chain lengths it is taught and its SFT (``per_length``
    problems of every length); the base's tokenizer apart, for its training pairs' digest (a recipe
    is known without converting the base)."""

    base: Callable[[], Path] | str  # a function giving a local directory, or a hub id
    tokenizer: Callable[[], Path] | str  # the same for the base's tokenizer
    lengths: tuple[int, ...]
    sft: dict[str, Any]  # steps, lr, batch, seed, per_length


LONG = tuple(range(2, 17))
QWEN_1_5B = "Qwen/Qwen2.5-1.5B-Instruct"
LONG_SFT = {"steps": 150, "lr": 1e-4, "batch": 8, "seed": 1, "per_length": 40}
SHORT_SFT = {"steps": 40, "lr": 2e-4, "batch": 6, "seed": 1, "per_length": 40}
SLIP_CHAIN_MODELS = {
    "smollm2-135m-chain-short": SlipChainModel(smollm2_dir, smollm2_tokenizer_dir, (2, 3, 4), SHORT_SFT),
    "smollm2-135m-chain-long": SlipChainModel(smollm2_dir, smollm2_tokenizer_dir, LONG, LONG_SFT),
    "qwen2.5-1.5b-chain-long": SlipChainModel(QWEN_1_5B, QWEN_1_5B, LONG, LONG_SFT),
}

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


def sft_pairs(tok: Any, lengths: tuple[int, ...], per_length: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, planted solution + EOS) token ids: ``per_length`` problems of every length."""
    rng = np.random.default_rng([seed, 1])
    pairs = []
    for n in lengths:
        task = build_task(TaskConfig("arith", {**CHAIN_TASK, "chain_steps": n, "size": per_length}))
        for p in task.problems(PROMPT, seed):
            solution = planted_solution(p, rng) + tok.eos_token
            pairs.append((prompt_ids(p, task, PROMPT, tok), tok(solution, add_special_tokens=False)["input_ids"]))
    return pairs


def base_of(name: str) -> str:
    """The base model's directory (built on first use) or hub id."""
    return _located(SLIP_CHAIN_MODELS[name].base)


def _located(where: Callable[[], Path] | str) -> str:
    return str(where() if callable(where) else where)


def training_pairs(name: str, tok: Any) -> list[tuple[list[int], list[int]]]:
    """The builtin's SFT pairs (``sft_pairs`` of its lengths)."""
    m = SLIP_CHAIN_MODELS[name]
    return sft_pairs(tok, m.lengths, m.sft["per_length"], m.sft["seed"])


@cache
def recipe(name: str) -> dict[str, Any]:
    """What the model depends on: the constants and a digest of its training pairs."""
    pairs = training_pairs(name, load_tokenizer(_located(SLIP_CHAIN_MODELS[name].tokenizer)))
    return {"builtin": name, "task": CHAIN_TASK, "slip": SLIP, **SLIP_CHAIN_MODELS[name].sft, "pairs": digest(pairs)}


def build(name: str, out: Path) -> None:
    import torch

    from rredcot.models.store import load_causal_lm, save_model_dir
    from rredcot.models.warmstart import sft

    base = base_of(name)
    tok = load_tokenizer(base)
    recipe_sft = SLIP_CHAIN_MODELS[name].sft
    torch.manual_seed(recipe_sft["seed"])
    model = load_causal_lm(base, "float32").to("cuda" if torch.cuda.is_available() else "cpu")
    steps = {k: recipe_sft[k] for k in ("steps", "lr", "batch", "seed")} | {"bucketed": True}

    def progress(step: int, loss: float) -> None:
        log.info("%s: SFT step %d of %d, loss %.3f", name, step, recipe_sft["steps"], loss)

    model = sft(model, tok, training_pairs(name, tok), **steps, log=progress)
    save_model_dir(model.to("cpu"), tok, out)


def slip_chain_dir(name: str, seed: int = 0, root: str | Path | None = None) -> Path:
    """The built model's directory (built on first use; ``seed``: one model for every run)."""
    folder = Path(root or cache_dir() / "models")
    return build_once(recipe_dir(folder, name, recipe(name)), partial(build, name), recipe(name))


for _name in SLIP_CHAIN_MODELS:
    MODELS.register(_name)(slip_chain_dir)
