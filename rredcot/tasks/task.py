"""A task (domain): its problems, its prompt, how an answer is read and checked, its reference split.

Tasks are registered by name (``common.registry.TASKS``) and chosen with ``task.name``; a task's
own settings are a dataclass (``Settings``) filled from ``task.settings``. The generator, the
evaluator and Monte-Carlo credit all score completions through ``tasks.verifier.Verifier``,
which runs ``answers_match`` of the run's task in an isolated process with a timeout.

Subclass ``Task``, decorate it with ``@TASKS.register("name")`` and override what differs:
``problems`` (required), ``instruction`` and ``example`` (the prompt), ``extract_answer`` and
``answers_match`` (the verifier), ``reference`` (the (u, y) split used by RREDCoT's values).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from rredcot.common.config import Config, ConfigError, DataConfig, TaskConfig
from rredcot.common.registry import make_task
from rredcot.tasks.data import Problem

# one way to match each whitespace run (``answer\s*(?:is)?\s*`` split a run between two ``\s*``:
# quadratic backtracking on a long run without a colon)
_ANSWER_LINE = re.compile(r"answer\s*(?:is\s*)?[:=]\s*(.+)", re.IGNORECASE)


def answer_text(completion: str, think_start: str, think_end: str, opened: bool = False) -> str | None:
    """The part of a completion that may state its answer: the text after its last ``think_end``, the
    whole completion without thinking tags, None when a thought was opened and never closed (a
    truncated trace gives no answer; what its thinking tried is no answer). ``opened``: the prompt
    opened the thought (``tasks.prompts.opens_thought``), so the completion must close it."""
    _, closed, after = completion.rpartition(think_end)
    return None if think_start in after or (opened and not closed) else after


def answer_line(completion: str) -> str | None:
    """The text after the last ``Answer: ...`` line, without a trailing period or the markdown
    emphasis around it (``**56**``, ``__56__``, ``*56*``). None if absent, or if that text has no
    letter or digit (``**Final Answer:**`` followed by a displayed ``\\boxed{}``): the caller
    then falls back to another form."""
    for line in reversed(completion.strip().splitlines()):
        m = _ANSWER_LINE.search(line)
        if m:
            found = m.group(1).strip().rstrip(".").strip(" *_").rstrip(".").strip()
            return found if any(c.isalnum() for c in found) else None
    return None


def working(text: str) -> tuple[list[str], list[int]]:
    """A completion's non-blank lines before its last answer line, and where each starts in ``text``."""
    lines, starts, at = [], [], 0
    for line in text.splitlines(keepends=True):
        if line.strip():
            lines.append(line.rstrip("\r\n"))
            starts.append(at)
        at += len(line)
    end = next((i for i in reversed(range(len(lines))) if answer_line(lines[i]) is not None), len(lines))
    return lines[:end], starts[:end]


class Task:
    """Base class of every task; the defaults fit answers written on a final ``Answer: ...`` line."""

    Settings: ClassVar[type | None] = None  # dataclass of ``task.settings`` (None: takes none)
    instruction: ClassVar[str] = "Solve the problem. Show your steps, then give the final line as 'Answer: <answer>'."
    example: ClassVar[Problem | None] = None  # the worked example of ``data.prompt_style=chat_one_shot``
    # what precedes the answer itself on the answer line (``reference``'s y starts with it): RREDCoT's
    # branches force it without scoring it, and a completion's answer part starts at its last such line
    answer_template: ClassVar[str] = "Answer: "
    reads_dataset: ClassVar[bool] = False  # True: problems come from ``data.path``; False: generated

    def __init__(self, settings: Any = None) -> None:
        self.settings = settings if settings is not None or self.Settings is None else self.Settings()

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        """Every problem of the task (training and held-out), deterministic in (data, seed)."""
        raise NotImplementedError

    def first_problems(self, data: DataConfig, seed: int, n: int) -> list[Problem]:
        """The first ``n`` problems, checked as ``problems`` checks them: what a run reads before it
        starts any service. Override when reading them all is slow (a large dataset)."""
        return self.problems(data, seed)[:n]

    def check(self, cfg: Config) -> None:
        """Cross-field rules of this task (raise ``ConfigError`` naming the key)."""

    def extract_answer(self, completion: str) -> str | None:
        """The final answer written in a completion (None: no answer given)."""
        return answer_line(completion)

    def answers_match(self, predicted: str, gold: str) -> bool:
        """Whether ``predicted`` is the gold answer. Runs in the verifier's process, under a timeout."""
        return predicted.strip().casefold() == gold.strip().casefold()

    @property
    def checks_slips(self) -> bool:
        """Whether ``first_slip`` can name the first wrong line of a trace's working (the ``oracle``
        credit method and the slip reports need it)."""
        return False

    def first_slip(self, problem: Problem, lines: Sequence[str]) -> int | None:
        """The index of the first wrong line of working in ``lines`` (the trace's non-blank lines before
        its answer line); ``len(lines)`` when steps are missing; None when the working is right."""
        raise NotImplementedError(f"task {type(self).__name__} has no slip checker")

    def checked_steps(self, lines: Sequence[str]) -> list[tuple[str, bool]]:
        """Each line of working that reads as a step: its kind and whether it is right in itself
        (the evaluator's per-kind slip rates, where ``checks_slips``)."""
        raise NotImplementedError(f"task {type(self).__name__} has no slip checker")

    def reference(self, problem: Problem) -> tuple[str, str]:
        """(u, y): the reference solution without its final answer line, and the answer line."""
        lines = problem.solution.rstrip().splitlines()
        if lines and answer_line(lines[-1]) is not None:
            lines = lines[:-1]
        return "\n".join(lines) + "\n", f"Answer: {problem.answer}"


def check_eval_fits(cfg: Config, size: int, distinct: int | None = None) -> None:
    """A generated task's rule: the held-out set leaves problems to train on, and ``data.train_size``
    and ``logging.eval_train`` ask for no more of them than there are. ``size``:
    ``task.settings.size``; ``distinct``: how many different problems the settings can make, when
    the task generates no more than that."""
    count = size if distinct is None else min(size, distinct)
    if cfg.data.eval_size >= count:
        made = (
            f"task.settings.size ({size})"
            if count == size
            else f"{count}, the distinct problems task.settings can make (task.settings.size = {size})"
        )
        raise ConfigError(
            f"data.eval_size = {cfg.data.eval_size} is not allowed; expected < {made} "
            "so that some problems remain for training"
        )
    pool = count - cfg.data.eval_size
    if cfg.data.train_size > pool:
        raise ConfigError(
            f"data.train_size = {cfg.data.train_size} is not allowed; expected 0 (every problem not held out) "
            f"or <= {pool}, the problems left to train on after data.eval_size = {cfg.data.eval_size}"
        )
    pool = cfg.data.train_size or pool
    if cfg.logging.eval_train > pool:
        raise ConfigError(
            f"logging.eval_train = {cfg.logging.eval_train} is not allowed; expected <= {pool}, "
            "the problems the run trains on"
        )


def build_task(spec: TaskConfig) -> Task:
    """The task ``spec.name`` with its typed settings (raises ``RegistryError`` on a bad name or key)."""
    return make_task(spec.name, spec.settings)
