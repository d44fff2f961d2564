"""Held-out evaluation: accuracy at the sampling temperature and greedy, with 95% intervals.

Samples of one problem are correlated, so the interval treats problems as the unit: the mean of
per-problem accuracies ± 1.96 standard errors across problems (clipped to [0, 1]).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from rredcot.actors.engine import Engine, EngineSpec, Sampling
from rredcot.common.config import Config, from_dict
from rredcot.common.data import Problem, train_and_held_out
from rredcot.common.prompts import prompt_ids
from rredcot.common.streams import connect
from rredcot.common.verifier import Verifier
from rredcot.common.weight_sync import latest_manifest, read_weights


def mean_ci(values: list[float], z: float = 1.96, clip: tuple[float, float] | None = (0.0, 1.0),
            ) -> tuple[float, float, float]:
    """(mean, low, high) of a normal-approximation interval, clipped to ``clip`` (accuracies: [0, 1]);
    a single value has a zero-width one."""
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    m = sum(values) / n
    if n == 1:
        return m, m, m
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = z * sd / math.sqrt(n)
    if clip is None:
        return m, m - half, m + half
    return m, max(clip[0], m - half), min(clip[1], m + half)


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(engine: Engine, problems: list[Problem], cfg: Config, verifier: Verifier) -> EvalResult:
    start = time.perf_counter()
    g = cfg.generation
    prompts = [prompt_ids(p, cfg.data, engine.tokenizer) for p in problems]
    sampled = engine.generate(prompts, Sampling(n=g.group_size, temperature=g.temperature, top_p=g.top_p,
                                                max_tokens=g.max_tokens, stop=tuple(g.stop)), prefix="eval-s")
    greedy = engine.generate(prompts, Sampling(n=1, temperature=0.0, max_tokens=g.max_tokens, stop=tuple(g.stop)),
                             prefix="eval-g")

    def accuracy(group: Any, problem: Problem) -> float:
        texts = [engine.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in group.completions]
        return sum(verifier.score(t, problem.answer).reward for t in texts) / len(texts)

    per_problem = [accuracy(grp, p) for grp, p in zip(sampled, problems)]
    s = mean_ci(per_problem)
    gr = mean_ci([accuracy(grp, p) for grp, p in zip(greedy, problems)])
    return EvalResult(engine.version, len(problems), g.group_size, *s, *gr, time.perf_counter() - start,
                      per_problem)


def paired_change(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """Mean change of per-problem accuracy on the same problems, with its 95% interval.

    Problem difficulty cancels in the differences, so this interval is much tighter than the gap
    between two independent intervals: the honest test of "did training help on held-out data".
    """
    return mean_ci([a - b for b, a in zip(before, after, strict=True)], clip=None)


class Evaluator:
    """Ray actor body: a vLLM engine that follows the run's published weights for evaluations."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = from_dict(cfg)
        c = self.cfg
        self.engine = Engine(EngineSpec.from_config(c, seed_offset=1))
        self.client = connect(c.redis.url) if c.redis.url else None
        self.problems = train_and_held_out(c.data, c.run.seed)[1]
        self.verifier = Verifier(c.generation.verifier_timeout_s)

    def evaluate_latest(self) -> dict[str, Any]:
        """Load the newest published weights (if newer) and evaluate the held-out problems."""
        manifest = latest_manifest(self.client, self.cfg.run.name, newer_than=self.engine.version) \
            if self.client else None
        if manifest is not None:
            self.engine.load_weights_bytes(read_weights(manifest), manifest.version)
        return evaluate(self.engine, self.problems, self.cfg, self.verifier).as_dict()
