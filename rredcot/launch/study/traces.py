"""The study's traces: rollout groups saved by a run, or sampled now from a named checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rredcot.actors.engine import Engine, EngineSpec, Sampling
from rredcot.actors.rollouts import rollout_group
from rredcot.common.codec import decode
from rredcot.common.config import Config
from rredcot.common.errors import UserError
from rredcot.common.records import RolloutGroup
from rredcot.tasks.data import train_and_held_out
from rredcot.tasks.prompts import prompt_ids
from rredcot.tasks.verifier import Verifier


def load_traces(folder: Path) -> list[RolloutGroup]:
    """Every saved rollout group of a run's ``traces/`` (its ``rollouts/`` folder) or of a folder
    of rollout-group records, in name order."""
    source = folder / "rollouts" if (folder / "rollouts").is_dir() else folder
    files = sorted(source.glob("*.msgpack"))
    if not files:
        raise UserError(
            f"no saved rollout groups (*.msgpack) in {source}: a run saves credit.save_traces groups per "
            "redistributor under run.dir/traces/rollouts, or let `rredcot study credit` sample traces (--problems N)"
        )
    return [decode(f.read_bytes(), RolloutGroup) for f in files]


def with_model(cfg: Config, checkpoint: str) -> Config:
    """``cfg`` with the policy at ``checkpoint`` (an HF directory or a model name rredcot builds)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=checkpoint))


def sample_traces(cfg: Config, engine: Engine, verifier: Verifier, n_problems: int) -> list[RolloutGroup]:
    """``generation.group_size`` completions of each of the first ``n_problems`` training problems,
    sampled as in training (temperature, top_p, max_tokens, stop) and verified."""
    problems = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)[0][:n_problems]
    g = cfg.generation
    sampling = Sampling(
        n=g.group_size, temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens, stop=tuple(g.stop)
    )
    tok = engine.tokenizer
    outputs = engine.generate_batch(
        [(prompt_ids(p, verifier.task, cfg.data, tok), sampling) for p in problems], "study"
    )
    return [
        rollout_group(o, p, i, "study", verifier.task, tok, verifier) for i, (o, p) in enumerate(zip(outputs, problems))
    ]


def study_engine(cfg: Config) -> Engine:
    """A vLLM engine holding the policy of ``cfg.model.path``: it samples the traces and the MC
    continuations (seeded per request), so both come from the same named policy."""
    return Engine(EngineSpec.from_config(cfg, seeded=True))
