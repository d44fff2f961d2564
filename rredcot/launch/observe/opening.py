"""The run's opening lines: what it trains and why, then what starts, in which dtype, for how long."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from rredcot.common.config import Config, redact_url
from rredcot.common.precision import cpu_info, dtype_settings, planned_dtype
from rredcot.launch.observe.monitor import fmt_duration
from rredcot.launch.observe.run_times import expected_seconds


def first_line(cfg: Config, run_dir: Path) -> str:
    """What starts, with which dtype, and how long it is expected to take."""
    choice, learner = (planned_dtype(requested, on_gpu) for _, requested, on_gpu in dtype_settings(cfg))
    dtype = choice.dtype if learner.dtype == choice.dtype else f"{choice.dtype} (learner {learner.dtype})"
    redis = f"Redis at {redact_url(cfg.redis.url)}" if cfg.redis.url else "an embedded Redis"
    ray = f"Ray at {cfg.cluster.address}" if cfg.cluster.address else "a local Ray"
    c = cfg.cluster
    expected = expected_seconds(cfg)
    when = (
        f"expected ~{fmt_duration(expected)} (the last run of this config here)"
        if expected
        else "an ETA follows the first training step"
    )
    return (
        f"run {cfg.run.name!r}: starting {redis}, {ray}, {c.generators} generator(s) + {c.redistributors} "
        f"redistributor(s) + {c.learner_ranks} learner rank(s) for {cfg.run.steps} steps; dtype {dtype} on "
        f"{cpu_info().describe()}: {choice.reason}; {when}; logs in {run_dir / 'logs'}"
    )


def opening_lines(cfg: Config, run_dir: Path) -> Iterator[str]:
    """The run's first lines: what it trains and why (``run.about``), then ``first_line`` (made only
    once the first is out: choosing the dtype logs its own line)."""
    if cfg.run.about:
        yield cfg.run.about
    yield first_line(cfg, run_dir)
