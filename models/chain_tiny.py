"""``tiny-chain``: the positive-control study's policy (docs/study.md), a 3M-parameter Llama that
reads and writes bytes (ByT5's tokenizer, which ships inside transformers), trained from scratch on
long chains: 2 to 16 steps in the ``steps`` layout, each line in one of three phrasings, values in
[0, 30] (``CHAIN_TASK``).

Its one weakness is planted: in its training lines a product's result is off by 1 or 2 three times
in ten (``SLIP``), the later lines carrying the slip forward, so the model writes a wrong product
about that often while its sums and differences stay right. A policy whose one kind of mistake is
known is what a positive control needs (credit that lands on the product's line should learn
faster), and a model this small trains for 100 RL steps on 2 cores in minutes, where SmolLM2-135M
on 16-line chains would take hours. Built once per machine (several minutes on 2 cores) and cached
like the other builtins; ``seed`` is the build's, the same model for every run.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from rredcot.common.config import DataConfig, TaskConfig
from rredcot.common.registry import MODELS
from rredcot.models.store import build_once, cache_dir, digest, recipe_dir
from rredcot.tasks.arith import solution_text
from rredcot.tasks.chain import OPS, parse_chain, step_line
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.task import build_task

NAME = "tiny-chain"
CHAIN_TASK = {"op": "chain", "layout": "steps", "phrasings": 3, "value_max": 30, "operand_min": 2, "operand_max": 9}
LENGTHS = tuple(range(2, 17))
SLIP = {"op": "*", "rate": 0.3, "deltas": (-2, -1, 1, 2)}
ARCH = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "max_positions": 1024}
SFT = {"steps": 800, "lr": 2e-3, "batch": 16, "warmup": 50, "seed": 1, "per_length": 800}
# the prompt as plain text: the instruction, a blank line, the question, a newline
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
PROMPT = DataConfig(eval_size=0, prompt_style="chat")


def byte_tokenizer() -> Any:
    """ByT5's byte tokenizer (vocabulary 384, ``</s>`` ends a completion) with the plain template."""
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


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
    """(prompt, planted solution + ``</s>``) byte ids: ``per_length`` problems of every length."""
    rng = np.random.default_rng([seed, 1])
    pairs = []
    for n in LENGTHS:
        task = build_task(TaskConfig("arith", {**CHAIN_TASK, "chain_steps": n, "size": per_length}))
        for p in task.problems(PROMPT, seed):
            solution = planted_solution(p, rng) + tok.eos_token
            pairs.append((prompt_ids(p, task, PROMPT, tok), tok(solution, add_special_tokens=False)["input_ids"]))
    return pairs


@cache
def recipe() -> dict[str, Any]:
    """What the model depends on: the constants and a digest of its first training pairs (a changed
    task text builds a new model)."""
    head = sft_pairs(byte_tokenizer(), 4, SFT["seed"])
    return {"builtin": NAME, "task": CHAIN_TASK, "slip": SLIP, "arch": ARCH, **SFT, "pairs": digest(head)}


def build(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rredcot.models.store import save_model_dir
    from rredcot.models.warmstart import sft

    tok = byte_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=ARCH["hidden"],
        intermediate_size=3 * ARCH["hidden"],
        num_hidden_layers=ARCH["layers"],
        num_attention_heads=ARCH["heads"],
        num_key_value_heads=ARCH["kv_heads"],
        max_position_embeddings=ARCH["max_positions"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(SFT["seed"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    pairs = sft_pairs(tok, SFT["per_length"], SFT["seed"])
    steps = {k: SFT[k] for k in ("steps", "lr", "batch", "warmup", "seed")} | {"bucketed": True}
    progress = out.with_name(out.name + ".log")
    with progress.open("w") as f:
        sft(model, tok, pairs, **steps, log=lambda step, loss: print(step, round(loss, 4), file=f, flush=True))
    save_model_dir(model, tok, out)


@MODELS.register(NAME)
def tiny_chain_dir(name: str = NAME, seed: int = 0, root: str | Path | None = None) -> Path:
    """The built model's directory (built on first use; ``seed``: one model for every run)."""
    folder = Path(root or cache_dir() / "models")
    return build_once(recipe_dir(folder, NAME, recipe()), build, recipe())
