"""What every stage holds of its run: the Redis client, the control plane, the ledger, the lineage."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from rredcot.common.config import Config, ConfigError
from rredcot.common.control import RunControl
from rredcot.common.ledger import Ledger
from rredcot.common.lineage import VersionLineage
from rredcot.common.streams import connect


@dataclass
class RunContext:
    """The run's shared state in Redis, as a stage worker reaches it."""

    run_id: str
    client: redis.Redis
    control: RunControl  # the stop flag and the workers' metrics
    ledger: Ledger  # each admitted prompt's outcome
    lineage: VersionLineage  # weight versions renumbered by learner restarts

    @classmethod
    def connect(cls, cfg: Config, stage: str) -> RunContext:
        """Connect to ``redis.url`` for ``stage`` (e.g. "a generator"); a clear error when it is unset."""
        if not cfg.redis.url:
            raise ConfigError(f"redis.url is not set: {stage} needs the run's Redis server (redis.url=redis://...)")
        client, run_id = connect(cfg.redis.url), cfg.run.name
        return cls(run_id, client, RunControl(client, run_id), Ledger(client, run_id), VersionLineage(client, run_id))
