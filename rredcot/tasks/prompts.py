"""Prompt formatting: a task's instruction (optionally after its worked example) → prompt token ids.

A one-shot example of the same task is what makes a small instruct model write the final
``Answer: ...`` line the verifier reads (SmolLM2-135M-Instruct writes it ~1% of the time without, 75-85% with).
"""

from __future__ import annotations

from typing import Any

from rredcot.common.config import DataConfig
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task


def messages(problem: Problem, task: Task, cfg: DataConfig) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    if cfg.prompt_style == "chat_one_shot" and task.example is not None:
        msgs += [
            {"role": "user", "content": f"{task.instruction}\n\n{task.example.problem}"},
            {"role": "assistant", "content": task.example.solution},
        ]
    return msgs + [{"role": "user", "content": f"{task.instruction}\n\n{problem.problem}"}]


def prompt_text(problem: Problem, task: Task, cfg: DataConfig, tokenizer: Any) -> str:
    if cfg.prompt_style == "plain":
        shot = f"{task.example.problem}\n{task.example.solution}\n\n" if task.example is not None else ""
        return f"{task.instruction}\n\n{shot}{problem.problem}\n"
    return tokenizer.apply_chat_template(messages(problem, task, cfg), tokenize=False, add_generation_prompt=True)


def prompt_ids(problem: Problem, task: Task, cfg: DataConfig, tokenizer: Any) -> list[int]:
    return tokenizer(prompt_text(problem, task, cfg, tokenizer), add_special_tokens=False)["input_ids"]


def opens_thought(prompt_ids: Any, tokenizer: Any, think_start: str) -> bool:
    """Whether the prompt opens the thought (its chat template ends it with ``think_start``,
    DeepSeek-R1-Distill style): its completions then hold only the closing tag. Only the prompt's
    last tokens are decoded: the tag is at its end."""
    return tokenizer.decode(prompt_ids[-16:], skip_special_tokens=False).rstrip().endswith(think_start)
