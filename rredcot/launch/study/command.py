"""``rredcot study credit CONFIG --checkpoint PATH``: credit methods against Monte Carlo on a policy."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rredcot.actors.continuations import VLLMContinuations
from rredcot.actors.engine import Engine
from rredcot.common.config import Config
from rredcot.common.precision import cpu_info
from rredcot.launch.study.credit import TraceCredit, study_group
from rredcot.launch.study.report import write_report
from rredcot.launch.study.traces import load_traces, sample_traces, study_engine, with_model
from rredcot.redistributor.worker import build_scorer, verifier_reward
from rredcot.tasks.verifier import Verifier

log = logging.getLogger("rredcot.study")


def _log_to(out: Path) -> logging.Handler:
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "study.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def credit_study(
    cfg: Config,
    config_name: str,
    checkpoint: str,
    out: Path,
    traces_dir: Path | None = None,
    problems: int = 16,
    mc_samples: int = 16,
) -> Path:
    """Traces of the policy at ``checkpoint`` (saved under ``traces_dir``, or ``problems`` groups
    sampled now), every credit method and MC on each, and the report under ``out``; returns the
    report's path. Progress goes to the console and ``out/study.log``."""
    handler = _log_to(out)
    cfg = with_model(cfg, checkpoint)
    engine = study_engine(cfg)
    try:
        path = _study(cfg, config_name, checkpoint, out, engine, traces_dir, problems, mc_samples)
    finally:  # the engine and this study's log file are released whatever happened
        engine.close()
        log.removeHandler(handler)
        handler.close()
    return path


def _study(
    cfg: Config,
    config_name: str,
    checkpoint: str,
    out: Path,
    engine: Engine,
    traces_dir: Path | None,
    problems: int,
    mc_samples: int,
) -> Path:
    with Verifier.from_config(cfg) as verifier:
        if traces_dir is not None:
            groups, source = load_traces(traces_dir), f"`{traces_dir}`"
        else:
            log.info("study: sampling %d groups of %d at %s", problems, cfg.generation.group_size, checkpoint)
            groups, source = sample_traces(cfg, engine, verifier, problems), f"{problems} problems sampled now"
        scorer = build_scorer(cfg)
        g = cfg.generation
        sampler = VLLMContinuations(engine, g.temperature, g.top_p, cfg.run.seed, tuple(g.stop))
        reward_fn = verifier_reward(verifier, scorer.tokenizer)
        traces: list[TraceCredit] = []
        start = time.monotonic()
        for n, group in enumerate(groups, start=1):
            traces += study_group(group, cfg, scorer, sampler, reward_fn, mc_samples)
            elapsed = time.monotonic() - start
            log.info(
                "study: group %d/%d, %d traces, %.0f s, ETA %.0f s",
                n,
                len(groups),
                len(traces),
                elapsed,
                elapsed / n * (len(groups) - n),
            )
    if not traces:
        raise RuntimeError("no trace with a non-zero advantage: every group's rewards were equal (sample more)")
    meta = {
        "checkpoint": checkpoint,
        "config": config_name,
        "source": source,
        "mc_samples": mc_samples,
        "machine": cpu_info().describe(),
    }
    path = write_report(traces, meta, out)
    log.info("study: report %s", path)
    return path
