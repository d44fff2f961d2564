"""MC continuations from the policy: ``common.sampling.ContinuationSampler`` on the vLLM adapter.

Each request is one vLLM group of ``n = m`` (the prefix is prefilled once and shared) with the
request's budget and its own seed, so continuations do not depend on what else is in the batch.
The engine must be dedicated to this sampler (``Engine.run`` drains every request it holds) and
built with ``EngineSpec(seeded=True)``. With a receiver of the run's weight transport, ``sync``
brings the engine to the newest published policy version (``launch`` wires this into the
redistributor for ``credit.method=mc``, and a fixed prover's engine for ``progress``: ``from_config``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rredcot.actors.engine import Engine, EngineSpec, Sampling
from rredcot.common.config import Config
from rredcot.common.sampling import ContinuationRequest, seed_of
from rredcot.common.streams import connect
from rredcot.models.store import resolve_model_path
from rredcot.transports import weight_receiver

MC_SEED_OFFSET = 2  # engine seed run.seed + 2 (generators + 0, the evaluator + 1); requests carry their own


class VLLMContinuations:
    """Samples continuations with the engine's current weights (``version``)."""

    def __init__(
        self,
        engine: Engine,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop: tuple[str, ...] = (),
        receiver: Any = None,
    ) -> None:
        """``seed``: the run's, mixed into every request's seed; ``receiver``: a weight receiver of
        ``engine`` (``transports``), or None for fixed weights."""
        if not engine.seeded:
            raise ValueError("VLLMContinuations needs an engine built with EngineSpec(seeded=True)")
        self.engine, self.temperature, self.top_p, self.seed, self.stop = engine, temperature, top_p, seed, stop
        self.receiver = receiver
        self._calls = 0

    @classmethod
    def from_config(cls, cfg: Config, prover: str = "policy") -> VLLMContinuations:
        """A dedicated engine sampling like the generators. ``prover``: ``policy``, ``model.path``
        following the run's published weights (outside the learner's weight group: it reads the
        weight files); ``initial``, ``model.path``'s weights, fixed; else the model at that path, fixed."""
        spec = EngineSpec.from_config(
            cfg, seed_offset=MC_SEED_OFFSET, seeded=True, gpus=cfg.cluster.gpus_per_redistributor
        )
        if prover not in ("policy", "initial"):
            spec = dataclasses.replace(spec, model=resolve_model_path(prover, seed=cfg.run.seed))
        engine = Engine(spec)
        receiver = None
        if prover == "policy":
            receiver = weight_receiver(cfg, connect(cfg.redis.url), engine, name="prover")
        g = cfg.generation
        return cls(engine, g.temperature, g.top_p, cfg.run.seed, tuple(g.stop), receiver)

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def generated_tokens(self) -> int:
        return self.engine.generated_tokens

    def sync(self) -> bool:
        return self.receiver is not None and self.receiver.poll() is not None

    def sample(self, requests: Sequence[ContinuationRequest]) -> list[list[list[int]]]:
        """For each request, its ``m`` continuations (ids after the prefix)."""
        self._calls += 1
        greedy = self.temperature == 0.0  # vLLM refuses n > 1 when greedy: sample once, repeat
        batch = [
            (
                r.prefix,
                Sampling(
                    n=1 if greedy else r.m,
                    temperature=self.temperature,
                    top_p=self.top_p,
                    max_tokens=r.max_tokens,
                    stop=self.stop,
                    seed=None if greedy else seed_of(self.seed, r.seed),
                ),
            )
            for r in requests
        ]
        groups = self.engine.generate_batch(batch, prefix=f"mc{self._calls}")
        return [[c.token_ids for c in g.completions] * (r.m if greedy else 1) for g, r in zip(groups, requests)]

    def close(self) -> None:
        """Release the receiver and the engine."""
        if self.receiver is not None:
            self.receiver.close()
        self.engine.close()
