"""``tiny-qwen3-arith``: the tiny random Qwen3, taught the answer format by a short SFT.

A random-initialised model never writes ``Answer: N``, so every reward is 0, every advantage is 0
and an end-to-end test would exercise nothing past the verifier. A few dozen supervised steps on
the synthetic task's reference solutions (small products, chat prompt) give a model that writes
the format and is right part of the time — mixed groups, real advantages, real updates — while
staying tiny enough for CPU tests. Built once per machine and cached like the other builtins.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

from rredcot import tasks
from rredcot.common.config import DataConfig, TaskConfig
from rredcot.common.files import files_digest
from rredcot.common.heap import retained_heap
from rredcot.models.store import digest, qwen_tokenizer_dir
from rredcot.tasks.prompts import prompt_text
from rredcot.tasks.task import build_task

ARITH_TASK = TaskConfig("arith", {"op": "mul", "operand_min": 2, "operand_max": 6, "size": 25})
CHAT = DataConfig(eval_size=0, prompt_style="chat")


ARITH_SFT = {"steps": 150, "lr": 3e-3, "batch": 16, "unique": True}


def sft_arith(model: Any, tokenizer: Any, seed: int = 0) -> Any:
    """The tiny model's warm start: ``sft`` on small products with the chat prompt."""
    return sft(model, tokenizer, sft_pairs(tokenizer, ARITH_TASK, CHAT, seed), seed=seed, **ARITH_SFT)


@cache
def arith_recipe(seed: int) -> str:
    """What ``sft_arith`` depends on, as a digest: the task, the SFT constants, the tokenizer's files
    and the code that makes the training pairs and takes the steps (``rredcot/tasks``, this module);
    a change to any of them builds the model anew. (The tokenized pairs themselves were the digest
    once: a second tokenizer load, ~1 s of CPU in every process that resolves the model's path.)"""
    return digest([asdict(ARITH_TASK), asdict(CHAT), seed, ARITH_SFT, files_digest(recipe_files())])


def recipe_files() -> list[Path]:
    """The files ``arith_recipe`` digests: ``rredcot/tasks``' code, this module, the tokenizer's files."""
    code = sorted(Path(tasks.__file__).parent.glob("*.py")) + [Path(__file__)]
    return code + sorted(f for f in qwen_tokenizer_dir().iterdir() if f.is_file())


def sft_pairs(tokenizer: Any, task_cfg: TaskConfig, data: DataConfig, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, reference solution + EOS) token ids of ``task_cfg``'s problems, prompted as
    ``data.prompt_style``."""
    task = build_task(task_cfg)
    return [
        (
            tokenizer(prompt_text(p, task, data, tokenizer), add_special_tokens=False)["input_ids"],
            tokenizer(p.solution + tokenizer.eos_token, add_special_tokens=False)["input_ids"],
        )
        for p in task.problems(data, seed)
    ]


@retained_heap()  # the logits and their gradient: the same large blocks every step
def sft(
    model: Any,
    tokenizer: Any,
    pairs: list[tuple[list[int], list[int]]],
    steps: int,
    lr: float,
    batch: int,
    seed: int,
    warmup: int = 0,
    bucketed: bool = False,
    unique: bool = False,
    log: Any = None,
) -> Any:
    """Supervised steps on (prompt, solution) token id ``pairs`` (``sft_pairs``); loss on solution
    tokens only. ``warmup`` > 0 (a model trained from scratch): the learning rate rises over that many
    steps, then falls on a cosine to 0, with gradients clipped to norm 1. ``bucketed``: a batch is
    ``batch`` pairs of neighbouring lengths (little padding where lengths vary). ``unique`` (pairs drawn
    with replacement): each distinct pair of a batch goes forward once, its tokens' loss counted as
    often as it was drawn: the same loss for less work where pairs are few (the tiny model's 15, drawn 16
    at a time, are 10 distinct on average). ``log(step, loss)`` every 50 steps."""
    import math
    from collections import Counter

    import torch
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    shape = (lambda t: min(1.0, (t + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * t / steps))) if warmup else None
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, shape) if shape else None
    model.train()
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    by_length = sorted(pairs, key=lambda pair: len(pair[0]) + len(pair[1])) if bucketed else pairs
    for step in range(steps):
        if bucketed:
            first = int(torch.randint(0, len(pairs) - batch + 1, (1,), generator=gen))
            chosen = by_length[first : first + batch]
            drawn = None
        else:
            picks = torch.randint(0, len(pairs), (batch,), generator=gen).tolist()
            counts = Counter(picks) if unique else None
            chosen = [pairs[i] for i in (counts or picks)]
            drawn = list(counts.values()) if counts else None
        width = max(len(a) + len(b) for a, b in chosen)
        ids = torch.full((len(chosen), width), pad)
        targets = torch.full((len(chosen), width), -1)
        for row, (a, b) in enumerate(chosen):
            ids[row, : len(a) + len(b)] = torch.tensor(a + b)
            targets[row, len(a) - 1 : len(a) + len(b) - 1] = torch.tensor(b)  # position t predicts t+1
        ids, targets = ids.to(device), targets.to(device)
        where = targets >= 0
        hidden = model.model(input_ids=ids).last_hidden_state[where]
        logits = model.lm_head(hidden)
        if drawn is None:
            loss = F.cross_entropy(logits, targets[where])
        else:
            times = torch.tensor(drawn, device=device, dtype=logits.dtype)[:, None].expand(where.shape)[where]
            loss = (F.cross_entropy(logits, targets[where], reduction="none") * times).sum() / times.sum()
        opt.zero_grad()
        loss.backward()
        if schedule is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if schedule is not None:
            schedule.step()
        if log is not None and step % 50 == 0:
            log(step, loss.item())
    return model.eval()
