"""The driver's waiting: polls metrics, shows progress, keeps the embedded Redis up, runs periodic
evaluations, and surfaces any worker's failure at once."""

from __future__ import annotations

import logging
from typing import Any

from rredcot.common.config import Config
from rredcot.common.streams import BATCHES, ROLLOUTS, key
from rredcot.launch.interrupts import raise_if_interrupted
from rredcot.launch.observe.monitor import Monitor, Progress
from rredcot.launch.run_lock import NameLease
from rredcot.launch.services import EmbeddedRedis
from rredcot.launch.supervisor import StageActors

log = logging.getLogger(__name__)


class Watch:
    """The driver's waiting: polls metrics, shows progress, and surfaces any actor's failure at once."""

    def __init__(
        self,
        cfg: Config,
        monitor: Monitor,
        progress: Progress,
        client: Any,
        server: EmbeddedRedis | None,
        lease: NameLease | None = None,
    ) -> None:
        self.cfg, self.monitor, self.progress, self.client, self.server = cfg, monitor, progress, client, server
        self.lease = lease  # the run's lease on its name in a redis.url server (renewed by its own thread)
        self.redis_restarts = 0

    def tick(self, evals_left: int) -> None:
        raise_if_interrupted()
        if self.lease is not None:
            self.lease.check()  # another driver took the name: stop before both write the same keys
        self._keep_redis()
        self.monitor.poll()
        depths = {s: self.client.xlen(key(self.cfg.run.name, s)) for s in (ROLLOUTS, BATCHES)}
        self.progress.update(self.monitor, depths, evals_left)

    def _keep_redis(self) -> None:
        """Restart the embedded Redis if it died: same port, its append-only file replayed (every
        acknowledged write survives a killed process), so the workers' clients, which retry with
        back-off, carry on; at most ``cluster.max_restarts`` times."""
        if self.server is None or self.server.alive():
            return
        code = self.server.proc.returncode if self.server.proc is not None else None
        if self.redis_restarts >= self.cfg.cluster.max_restarts:
            raise RuntimeError(
                f"the embedded Redis server died (exit {code}) after {self.redis_restarts} restart(s); "
                "resume the run with run.resume=auto"
            )
        self.redis_restarts += 1
        log.warning(
            "the embedded Redis server died (exit %s); restarting it on port %d from its append-only file (%d/%d)",
            code,
            self.server.port,
            self.redis_restarts,
            self.cfg.cluster.max_restarts,
        )
        self.server.start()
        self.monitor.control.publish_metrics("driver", "driver", {"redis_restarts": float(self.redis_restarts)})

    def wait(self, ref: Any, evals_left: int) -> Any:
        """The result of ``ref`` (an evaluation), with progress while it runs."""
        import ray

        while not ray.wait([ref], timeout=1.0)[0]:
            self.tick(evals_left)
        self.tick(evals_left)
        return ray.get(ref)

    def training(self, actors: StageActors, next_eval: int, evaluate: Any) -> None:
        """Until every learner rank returns (a lost learner tier is restarted on the way);
        evaluations every ``next_eval`` steps when set."""
        import ray

        every = next_eval
        next_eval = next_eval_step(self.monitor.step, every) if every else 0  # a resumed run: after its step
        final_eval = int(evaluate is not None)
        while actors.learning():
            done, _ = ray.wait(actors.pending(), num_returns=1, timeout=1.0)
            for r in done:
                actors.collect(r)  # raises a worker's failure (the error path tears everything down)
            self.tick(final_eval)
            # the last step's evaluation is the final one, after the learner has published its last version
            final_step = self.monitor.step >= self.cfg.run.steps
            if next_eval and self.monitor.step >= next_eval and actors.learning() and not final_step:
                step = self.monitor.step  # labelled with the step whose weights it evaluates, not the step it ends at
                self.monitor.add_eval(self.wait(evaluate(self.monitor.version), final_eval), step)
                next_eval = next_eval_step(self.monitor.step, every)


def next_eval_step(step: int, every: int) -> int:
    """The step of the next periodic evaluation after one at ``step``: the next multiple of ``every``
    (a resumed run far past ``every`` evaluates once, not once per multiple it skipped)."""
    return (step // every + 1) * every
