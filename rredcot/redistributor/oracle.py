"""``oracle``: a positive control for credit. The task's slip checker (``Task.first_slip``) names
the first wrong line of a wrong trace's working, and all of σ's mass above the uniform floor goes
on that line: σ = λ/|o| + (1 − λ)/|line| on its tokens, λ/|o| elsewhere (Σσ = 1). A wrong trace whose
working the checker passes (or whose steps are missing) is blamed on its answer line; a correct
trace gets σ = 1/|o|. It needs the run's tokenizer and its task's problems, no scorer: it costs
what ``grpo`` costs, plus reading the blamed traces' lines."""

from __future__ import annotations

from typing import Any

import numpy as np

from rredcot.common.config import Config
from rredcot.common.records import RolloutRecord
from rredcot.redistributor.blame import run_problems, takes_blame
from rredcot.redistributor.credit import uniform_sigma
from rredcot.redistributor.lines import answer_line_start, content_texts, slipped_line
from rredcot.redistributor.methods import OracleSettings
from rredcot.redistributor.registry import CreditContext, SampleCredit
from rredcot.redistributor.sigma import token_sigma
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task


def task_problem(cfg: Config, prompt_id: str) -> tuple[Task, Problem]:
    """The run's task (``cfg.task``) and its problem ``prompt_id`` (a ``ValueError`` naming it when
    the task, as configured with ``data`` and ``run.seed``, has no such problem)."""
    task, problems = run_problems(cfg)
    if prompt_id not in problems:
        raise ValueError(
            f"credit method 'oracle': prompt {prompt_id!r} is no problem of task {cfg.task.name!r} as configured "
            f"(task.settings, data, run.seed); the slip checker has nothing to check its trace against"
        )
    return task, problems[prompt_id]


def blamed_span(task: Task, problem: Problem, texts: list[str], think_start: str, think_end: str) -> tuple[int, int]:
    """Token span [lo, hi) of the line to blame in a wrong trace's content ``texts``: the first wrong
    line of working the checker names, else the answer line to the end (empty when there is none)."""
    spans, slip = slipped_line(task, problem, texts, think_start, think_end)
    if slip is not None:
        return spans[slip]
    return answer_line_start(texts, task.answer_template), len(texts)


def sample_sigma(ctx: CreditContext, s: RolloutRecord, task: Task, problem: Problem) -> SampleCredit:
    """A wrong trace's σ: the blamed line's tokens take the mass above the floor λ/|o| (uniform with
    fallback ``no_line`` when there is no line to blame)."""
    tok: Any = ctx.tokenizer
    n = len(s.completion_ids)
    texts = content_texts(tok, s.completion_ids.tolist())
    lo, hi = blamed_span(task, problem, texts, ctx.cfg.model.think_start, ctx.cfg.model.think_end)
    if hi <= lo:
        return SampleCredit(uniform_sigma(n), fallback="no_line")
    lam = (ctx.settings or OracleSettings()).uniform_mix
    return SampleCredit(token_sigma(n, np.array([0, lo, hi, n]), np.array([0.0, 1.0, 0.0]), lam))


def oracle(ctx: CreditContext) -> list[SampleCredit]:
    """σ on the checker's line for each wrong trace that takes blame (A < 0); 1/|o| for the others."""
    if ctx.tokenizer is None:
        raise ValueError(f"credit method {ctx.cfg.credit.method!r} needs the run's tokenizer")
    out = []
    for s, a in zip(ctx.group.samples, ctx.advantages, strict=True):
        if takes_blame(s, a):
            out.append(sample_sigma(ctx, s, *task_problem(ctx.cfg, ctx.group.prompt_id)))
        else:
            out.append(SampleCredit(uniform_sigma(len(s.completion_ids))))
    return out
