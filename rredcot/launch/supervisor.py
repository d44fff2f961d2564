"""The run's stage actors on Ray, and what the driver does when one of them dies.

One ``StageWorker`` actor per worker of the plan, each in its own placement-group bundle. Ray
restarts a dead generator or redistributor in place (``stages.restart_options``). A learner rank
cannot rejoin its torch.distributed group alone, so when a learner rank's process dies the driver
restarts the whole learner tier: it kills the surviving ranks, waits a back-off (1, 2, 4 … s, at
most 30), and starts every rank again with a fresh rendezvous id (``learner.rendezvous``). The new
ranks restore the newest checkpoint and first retrain what was trained after it
(``learner.replay``), so nothing trained is lost. At most ``cluster.max_restarts`` times; then the
run stops and says how to resume it.

A learner rank that *raises* is a failure of the run, unless a peer's process died with it (a
rank's collective fails when its peer dies): the driver gives the peers ``PEER_DEATH_WAIT_S`` to
show that. A peer on a lost node shows its death as soon as its RPC socket closes (unavailable,
``process_died``) or once Ray declares the node dead, after its health checks fail (by default 5
checks 3 s apart: 15 s, more on a loaded head), so the wait is longer than that: a shorter one
stopped the run where a restart would have gone on.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from rredcot.common.config import Config, to_dict
from rredcot.common.control import RunControl
from rredcot.launch.observe.logs import WorkerFailed, headline, what_failed
from rredcot.launch.stages import WORKER_PREFIX, StageWorker, process_options, restart_options, stage_env

log = logging.getLogger(__name__)

PEER_DEATH_WAIT_S = 45.0  # a learner rank raised: how long its peers get to show that one of them died
MAX_BACKOFF_S = 30.0


class StageActors:
    """Every stage worker of the run: starts them, runs them, and restarts a lost learner tier.

    ``refs`` maps each running worker's ``run()`` ref to its (tier, rank); the driver's report
    shares the same dict, so a stop always waits on the current learner ranks.
    """

    def __init__(
        self,
        cfg: Config,
        pg: Any,
        plan: list[tuple[str, int, dict[str, float]]],
        control: RunControl,
        stack: contextlib.ExitStack,
        refs: dict[Any, tuple[str, int]],
    ) -> None:
        self.cfg, self.pg, self.plan, self.control, self.stack, self.refs = cfg, pg, plan, control, stack, refs
        self.cfg_dict = to_dict(cfg)
        self.actors: dict[tuple[str, int], Any] = {}
        self.learner_restarts = 0

    # ----- starting -----
    def start(self) -> None:
        """Create every worker (their set-up runs while the driver evaluates the starting model)."""
        self._create(tiers={t for t, _, _ in self.plan}, incarnation=0)

    def run(self) -> None:
        """Call every worker's ``run()``."""
        for (tier, rank), actor in self.actors.items():
            self.refs[actor.run.remote()] = (tier, rank)

    def _create(self, tiers: set[str], incarnation: int) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        rendezvous = learner_address(self.pg, [t for t, _, _ in self.plan].index("learner")), uuid.uuid4().hex
        for index, (tier, rank, bundle) in enumerate(self.plan):
            if tier not in tiers:
                continue
            name = f"rredcot-{self.cfg.run.name}-{tier}{rank}" + (f"-{incarnation}" if incarnation else "")
            actor = (
                ray.remote(StageWorker)
                .options(
                    num_cpus=bundle.get("CPU", 0),
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index),
                    name=name,
                    **restart_options(self.cfg, tier),
                    **process_options(self.cfg),
                )
                .remote(tier, self.cfg_dict, rank, stage_env(self.cfg, tier, rank, rendezvous), incarnation)
            )
            self.actors[(tier, rank)] = actor
            self.stack.callback(ray.kill, actor)

    # ----- watching -----
    def pending(self) -> list[Any]:
        return list(self.refs)

    def learning(self) -> bool:
        """Whether a learner rank is still running."""
        return any(tier == "learner" for tier, _ in self.refs.values())

    def collect(self, ref: Any) -> None:
        """A worker's ``run()`` ended: forget it, or restart the learner tier if a rank's process died;
        any other failure raises (the driver then stops the run)."""
        import ray

        tier, rank = self.refs.pop(ref)
        try:
            ray.get(ref)
        except Exception as e:
            died = self._learner_death(rank, e) if tier == "learner" else None
            if died is None:
                name = f"{WORKER_PREFIX[tier]}{rank}"
                raise WorkerFailed(name, e, Path(self.cfg.run.dir).resolve() / "logs" / f"{name}.log") from e
            self.restart_learners(died)

    def _learner_death(self, rank: int, error: Exception) -> str | None:
        """Which learner rank's process died and how, or None if rank ``rank`` failed on its own."""
        if process_died(error):
            return f"learner{rank}: {headline(error)}"
        peers = {ref: peer for ref, (tier, peer) in self.refs.items() if tier == "learner"}
        if peers:
            log.warning(
                "learner%d failed (%s); waiting up to %.0f s for its peers to show whether one of them died",
                rank,
                what_failed(error),
                PEER_DEATH_WAIT_S,
            )
        return peer_death(peers, PEER_DEATH_WAIT_S)

    def restart_learners(self, cause: str) -> None:
        """Kill every learner rank, wait the back-off, start them all again from the newest checkpoint."""
        import ray

        limit = self.cfg.cluster.max_restarts
        if self.learner_restarts >= limit:
            raise RuntimeError(
                f"a learner rank's process died ({cause}) and the learner tier has used its {limit} restart(s) "
                "(cluster.max_restarts); resume the run with run.resume=auto"
            )
        self.learner_restarts += 1
        wait = min(2.0 ** (self.learner_restarts - 1), MAX_BACKOFF_S)
        log.warning(
            "a learner rank's process died (%s); restarting all %d learner rank(s) "
            "from the newest checkpoint in %.0f s (%d/%d)",
            cause,
            self.cfg.cluster.learner_ranks,
            wait,
            self.learner_restarts,
            limit,
        )
        for ref in [r for r, (tier, _) in self.refs.items() if tier == "learner"]:
            del self.refs[ref]
        for (tier, _), actor in self.actors.items():
            if tier == "learner":
                ray.kill(actor, no_restart=True)
        time.sleep(wait)
        self._create(tiers={"learner"}, incarnation=self.learner_restarts)
        for (tier, rank), actor in self.actors.items():
            if tier == "learner":
                self.refs[actor.run.remote()] = (tier, rank)
        self.control.publish_metrics("driver", "driver", {"learner_restarts": float(self.learner_restarts)})


def learner_address(pg: Any, bundle_index: int) -> str:
    """The address of the node holding learner rank 0's bundle (its group's store is hosted there)."""
    import ray
    from ray.util.placement_group import placement_group_table

    node_id = placement_group_table(pg)["bundles_to_node_id"][bundle_index]
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return "127.0.0.1" if len(nodes) == 1 else nodes[node_id]


def peer_death(peers: dict[Any, int], wait_s: float) -> str | None:
    """The first of the learner ranks' ``run()`` refs (ref -> rank) to fail by its process's death within
    ``wait_s``, as ``learner<rank>: <its error>``; None if none did (a rank that fails on its own leaves
    its peers blocked in a collective: they are waited for no longer than ``wait_s``)."""
    import ray

    pending, deadline = list(peers), time.monotonic() + wait_s
    while pending and (left := deadline - time.monotonic()) > 0:
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - this peer failed too; another may have died
                if process_died(e):
                    return f"learner{peers[ref]}: {headline(e)}"
    return None


def process_died(error: BaseException) -> bool:
    """Whether a worker's call failed because its process died or became unreachable (killed, out of
    memory, a GPU fault, its node lost), which a restart can cure; not when its constructor raised (a
    bad checkpoint, a missing model): that would fail again at every restart.

    A rank on a lost node often fails first as *unavailable* (``ActorUnavailableError``: its RPC
    socket closed), seconds before Ray declares its node dead; its call's result is lost either way
    and its group's collectives are broken, so it counts as a death. (Taken as a failure of its own, it
    stopped a run that a restart of the learner tier would have carried on: the node-lost test under
    the suite's load.)"""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    if isinstance(error, ActorUnavailableError):
        return True
    return isinstance(error, ActorDiedError) and not error.actor_init_failed
