"""Where a wrong trace's σ puts its most blame, against the line the task's slip checker names (a
task with ``checks_slips``): the redistributor counts it over every trace (``WorkerMetrics``), the
run report prints the share and picks a heatmap that shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rredcot.common.config import Config
from rredcot.common.records import RolloutRecord, WeightedSample
from rredcot.redistributor.lines import content_texts, line_mass, line_texts, slipped_line, top_share
from rredcot.tasks.data import Problem
from rredcot.tasks.task import Task, build_task

# the run's task and its problems by id, built once per process (keyed by what determines them)
_PROBLEMS: dict[str, tuple[Task, dict[str, Problem]]] = {}


def run_problems(cfg: Config) -> tuple[Task, dict[str, Problem]]:
    """The run's task (``cfg.task``) and its problems by id."""
    key = repr((cfg.task, cfg.data, cfg.run.seed))
    if key not in _PROBLEMS:
        task = build_task(cfg.task)
        _PROBLEMS.clear()
        _PROBLEMS[key] = task, {p.id: p for p in task.problems(cfg.data, cfg.run.seed)}
    return _PROBLEMS[key]


def takes_blame(record: RolloutRecord, advantage: float) -> bool:
    """A wrong trace whose σ spreads a negative advantage: blame."""
    return advantage < 0 and record.verdict != "correct"


@dataclass(frozen=True)
class SlipBlame:
    """A wrong trace's first wrong line of working, as the checker names it, and σ's blame on it."""

    slip: int  # its index among the working lines
    text: str  # that line
    span: tuple[int, int]  # its completion tokens [lo, hi)
    lines: int  # the working lines (a line picked at random is the slip's 1 time in ``lines``)
    top: float  # 1 when σ's mass is largest on that line, 1/k when k lines share the largest, else 0


@dataclass(frozen=True)
class SlipChecker:
    """The run's slip checker over weighted samples, with the tokenizer that reads their lines."""

    task: Task
    problems: dict[str, Problem]
    tokenizer: Any
    think_start: str
    think_end: str

    @classmethod
    def of(cls, cfg: Config, tokenizer: Any) -> SlipChecker | None:
        """The checker of ``cfg``'s task; None when the task has none."""
        if not build_task(cfg.task).checks_slips:
            return None
        return cls(*run_problems(cfg), tokenizer, cfg.model.think_start, cfg.model.think_end)

    def blame(self, sample: WeightedSample, prompt_id: str) -> SlipBlame | None:
        """Where a wrong trace taking blame first slips and whether σ blames that line most; None for
        any other trace, a prompt that is no problem of the task, or working the checker passes."""
        problem = self.problems.get(prompt_id)
        if problem is None or not takes_blame(sample.rollout, sample.advantage):
            return None
        texts = content_texts(self.tokenizer, sample.rollout.completion_ids.tolist())
        spans, slip = slipped_line(self.task, problem, texts, self.think_start, self.think_end)
        if slip is None:
            return None
        (text,) = line_texts(texts, spans[slip : slip + 1])
        return SlipBlame(slip, text, spans[slip], len(spans), top_share(line_mass(sample.sigma, spans), slip))
