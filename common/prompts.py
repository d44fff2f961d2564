"""Prompt formatting: chat messages (optionally with one worked example) → prompt token ids.

A one-shot example of the same task is what makes a small instruct model write the final
``Answer: N`` line the verifier reads (PLATFORM.md: ~1% without, 75-85% with).
"""

from __future__ import annotations

from typing import Any

from rredcot.common.config import DataConfig
from rredcot.common.data import Problem

INSTRUCTION = "Solve the problem. Show your steps, then give the final line as 'Answer: <number>'."
EXAMPLE = Problem(id="example", problem="What is 7 * 8?", solution="7 * 8 = 56.\nAnswer: 56", answer="56")


def messages(problem: Problem, cfg: DataConfig) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    if cfg.prompt_style == "chat_one_shot":
        msgs += [
            {"role": "user", "content": f"{INSTRUCTION}\n\n{EXAMPLE.problem}"},
            {"role": "assistant", "content": EXAMPLE.solution},
        ]
    return msgs + [{"role": "user", "content": f"{INSTRUCTION}\n\n{problem.problem}"}]


def prompt_text(problem: Problem, cfg: DataConfig, tokenizer: Any) -> str:
    if cfg.prompt_style == "plain":
        return f"{INSTRUCTION}\n\n{EXAMPLE.problem}\n{EXAMPLE.solution}\n\n{problem.problem}\n"
    return tokenizer.apply_chat_template(messages(problem, cfg), tokenize=False, add_generation_prompt=True)


def prompt_ids(problem: Problem, cfg: DataConfig, tokenizer: Any) -> list[int]:
    return tokenizer(prompt_text(problem, cfg, tokenizer), add_special_tokens=False)["input_ids"]
