"""Held-out evaluation: accuracy at the sampling temperature and greedy, with 95% intervals.

Samples of one problem are correlated, so the interval treats problems as the unit: the mean of
per-problem accuracies ± 1.96 standard errors across problems (clipped to [0, 1]).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from rredcot.common.config import Config
from rredcot.common.run_context import RunContext
from rredcot.common.sampling import seed_of
from rredcot.common.startup_gc import collector_off
from rredcot.launch.observe.intervals import mean_ci
from rredcot.launch.stages import start_worker_process
from rredcot.tasks.data import Problem, train_and_held_out
from rredcot.tasks.prompts import opens_thought, prompt_ids
from rredcot.tasks.task import Task, working
from rredcot.tasks.verifier import Verifier
from rredcot.transports import weight_receiver

if TYPE_CHECKING:  # the engine's module imports torch: here only where an engine is built or asked
    from rredcot.actors.engine import Engine, EngineSpec, Sampling

log = logging.getLogger(__name__)

WEIGHTS_WAIT_S = 60.0  # how long an evaluation waits for the learner's newest version to be published


@dataclass
class EvalResult:
    version: int
    problems: int
    samples_per_problem: int
    sampled: float
    sampled_low: float
    sampled_high: float
    greedy: float
    greedy_low: float
    greedy_high: float
    seconds: float
    sampled_per_problem: list[float]  # for paired comparisons between evaluations of the same problems
    too_long: int = 0  # held-out problems left out: their prompt fills model.max_model_len
    # where the task checks its lines (``Task.checks_slips``): per kind of step, [wrong, checked] over
    # the sampled completions ("all") and over the wrong ones ("in_wrong"); None otherwise
    steps: dict[str, dict[str, list[int]]] | None = None
    same_draws: bool = False  # each problem's samples from its own seed (``logging.eval_same_draws``)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def eval_requests(
    problems: list[Problem], prompts: list[list[int]], cfg: Config, draws: int | None = None
) -> list[tuple[list[int], Sampling]]:
    """Each problem's ``generation.group_size`` samples, then each one's greedy completion.

    With ``draws``, problem p's samples use the seed ``seed_of(draws, p.id)`` (sample j: + j): every
    evaluation with the same ``draws`` gives p the same random numbers, whatever else shares the
    batch. Two evaluations of one problem then differ by what changed the policy, not by the draw
    (common random numbers), which narrows their paired change."""
    from rredcot.actors.engine import Sampling

    g = cfg.generation
    sampled = Sampling(
        n=g.group_size, temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens, stop=tuple(g.stop)
    )
    greedy = Sampling(n=1, temperature=0.0, max_tokens=g.max_tokens, stop=tuple(g.stop))
    seeded = [sampled if draws is None else replace(sampled, seed=seed_of(draws, p.id)) for p in problems]
    return [*zip(prompts, seeded), *((ids, greedy) for ids in prompts)]


def step_counts(task: Task, scored: list[tuple[str, float]]) -> dict[str, dict[str, list[int]]]:
    """Per kind of step, [wrong, checked] lines of working (``Task.checked_steps``) over the
    (completion, reward) pairs ``scored`` ("all") and over those with reward 0 ("in_wrong")."""
    counts: dict[str, dict[str, list[int]]] = {"all": {}, "in_wrong": {}}
    for text, reward in scored:
        for kind, right in task.checked_steps(working(text)[0]):
            for part in ("all", "in_wrong") if reward <= 0 else ("all",):
                tally = counts[part].setdefault(kind, [0, 0])
                tally[0] += not right
                tally[1] += 1
    return counts


def evaluate(
    engine: Engine,
    problems: list[Problem],
    cfg: Config,
    verifier: Verifier,
    progress: Callable[[int, int], None] | None = None,
    draws: int | None = None,
) -> EvalResult:
    """Sampled (``generation.group_size`` per problem) and greedy accuracy, generated as one batch;
    ``progress(samples done, samples in all)`` as generation goes. A problem whose prompt fills the
    model's context is left out (counted in ``too_long``, the same ones every time). ``draws``: each
    problem's samples from its own seed (``eval_requests``), the engine built ``EngineSpec(seeded=True)``."""
    start = time.perf_counter()
    g = cfg.generation
    every = [(p, prompt_ids(p, verifier.task, cfg.data, engine.tokenizer)) for p in problems]
    fitting = [(p, ids) for p, ids in every if engine.fits(ids)]
    if len(fitting) < len(every):
        log.warning(
            "evaluation: %d problem(s) left out, their prompt fills model.max_model_len (%d): %s",
            len(every) - len(fitting),
            engine.max_model_len,
            ", ".join(p.id for p, ids in every if not engine.fits(ids))[:500],
        )
    problems, prompts = [p for p, _ in fitting], [ids for _, ids in fitting]
    total = len(prompts) * (g.group_size + 1)
    groups = engine.generate_batch(
        eval_requests(problems, prompts, cfg, draws),
        "eval",
        None if progress is None else lambda done: progress(done, total),
    )

    scored: list[tuple[str, float]] = []  # the sampled completions and their rewards

    def accuracy(group: Any, problem: Problem, keep: bool = False) -> float:
        texts = [engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group.completions]
        opened = opens_thought(group.prompt_ids, engine.tokenizer, verifier.think[0])
        rewards = [verifier.score(t, problem.answer, opened).reward for t in texts]
        if keep:
            scored.extend(zip(texts, rewards))
        return sum(rewards) / len(texts)

    per_problem = [accuracy(grp, p, keep=True) for grp, p in zip(groups[: len(prompts)], problems)]
    s = mean_ci(per_problem)
    gr = mean_ci([accuracy(grp, p) for grp, p in zip(groups[len(prompts) :], problems)])
    seconds = time.perf_counter() - start
    return EvalResult(
        engine.version,
        len(problems),
        g.group_size,
        *s,
        *gr,
        seconds,
        per_problem,
        too_long=len(every) - len(fitting),
        steps=step_counts(verifier.task, scored) if verifier.task.checks_slips else None,
        same_draws=draws is not None,
    )


def evaluator_spec(cfg: Config) -> EngineSpec:
    """The evaluator's engine: the run's (``EngineSpec.from_config``, its own seed) on its own GPUs, with
    ``logging.eval_kv_cache_bytes`` of KV cache when that is set, taking seeded requests with
    ``logging.eval_same_draws``."""
    from rredcot.actors.engine import EngineSpec

    log_cfg = cfg.logging
    return EngineSpec.from_config(
        cfg,
        seed_offset=1,
        seeded=log_cfg.eval_same_draws,
        gpus=cfg.cluster.gpus_per_evaluator,
        kv_cache_bytes=log_cfg.eval_kv_cache_bytes,
    )


def eval_draws(cfg: Config, spec: EngineSpec) -> int | None:
    """``evaluate``'s ``draws`` for the evaluator's engine ``spec``: its seed with
    ``logging.eval_same_draws`` (the same in every evaluation of a run, and in runs of the same
    ``run.seed`` and ``run.sampling_seed``, whatever their method), None otherwise."""
    return spec.seed if cfg.logging.eval_same_draws else None


class Evaluator:
    """Ray actor body: a vLLM engine that follows the run's published weights for evaluations,
    started like every stage's worker (``launch.stages.start_worker_process``: ``logs/eval.log``,
    the driver's ``stage_env(cfg, "evaluator")``) and connected to the run through ``RunContext``.

    While it evaluates it publishes its progress as worker ``eval`` (tier ``evaluator``): samples
    done and in all, for the driver's progress display."""

    def __init__(self, cfg: dict[str, Any], env: dict[str, str]) -> None:
        self.cfg = c = start_worker_process("eval", cfg, env)
        from rredcot.actors.engine import Engine

        run = RunContext.connect(c, "the evaluator")  # before the engine: a missing redis.url fails at once
        spec = evaluator_spec(c)
        self.draws = eval_draws(c, spec)
        with collector_off():  # an engine that lives as long as the evaluator
            self.engine = Engine(spec)
        self.control = run.control
        self.verifier = Verifier.from_config(c)
        train, self.problems = train_and_held_out(self.verifier.task, c.data, c.run.seed)
        self.train_problems = train[: c.logging.eval_train]  # ``logging.eval_train``: what the policy fits
        self.receiver = weight_receiver(c, run.client, self.engine)
        self._published = 0.0

    def _progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._published > 1.0 or done == total:
            self._published = now
            self.control.publish_metrics("eval", "evaluator", {"samples_done": done, "samples_total": total})

    def _evaluate(self, problems: list[Problem], before: int, total: int) -> dict[str, Any]:
        """``evaluate`` of ``problems``, its progress counted after the ``before`` samples of the others."""
        return evaluate(
            self.engine,
            problems,
            self.cfg,
            self.verifier,
            lambda done, _: self._progress(before + done, total),
            self.draws,
        ).as_dict()

    def evaluate_latest(self, at_least: int = 0) -> dict[str, Any]:
        """Load the newest published weights, waiting up to ``WEIGHTS_WAIT_S`` for version ``at_least``
        (the learner's step may be reported before its version is published), and evaluate the
        held-out problems; with ``logging.eval_train``, also the first training problems (``train``)."""
        per_problem = self.cfg.generation.group_size + 1
        held, total = len(self.problems) * per_problem, (len(self.problems) + len(self.train_problems)) * per_problem
        self._progress(0, total)  # not the last one's count
        deadline = time.monotonic() + WEIGHTS_WAIT_S
        self.receiver.poll()
        while self.engine.version < at_least and time.monotonic() < deadline:
            time.sleep(0.2)
            self.receiver.poll()
        if self.engine.version < at_least:
            log.warning(
                "evaluation: v%d not published within %.0f s; evaluating v%d",
                at_least,
                WEIGHTS_WAIT_S,
                self.engine.version,
            )
        result = self._evaluate(self.problems, 0, total)
        if self.train_problems:
            result["train"] = self._evaluate(self.train_problems, held, total)
        return result
