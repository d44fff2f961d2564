"""The resource plan: how many workers each tier gets, and the Ray bundles that hold them.

``cluster.*`` names counts and per-worker GPUs/CPUs for the three tiers; with held-out evaluations
the plan also holds a bundle of ``cluster.gpus_per_evaluator`` GPUs (by default a generator's) for
the evaluator's engine (with none, as on CPU, it takes no bundle: it runs while the tiers wait).
``check_plan`` compares
the plan with what the Ray cluster offers and fails — before any actor starts — with a message
that says what to change. On CPU the same plan maps to CPU-only bundles. A local Ray is sized by
``local_ray_cpus``, which first checks the plan against this machine's real cores.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rredcot.common.config import Config, ConfigError
from rredcot.launch.stages import WORKER_PREFIX, process_options


class PlanError(ConfigError):
    """A resource plan the cluster cannot hold."""


@dataclass(frozen=True)
class Tier:
    name: str  # generator | redistributor | learner | evaluator
    key: str  # the config key of its count
    count: int
    gpus: float
    cpus: float

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus}
        if self.gpus:
            b["GPU"] = self.gpus
        return b


def tiers(cfg: Config) -> list[Tier]:
    c = cfg.cluster
    return [
        Tier("generator", "generators", c.generators, c.gpus_per_generator, c.cpus_per_generator),
        Tier("redistributor", "redistributors", c.redistributors, c.gpus_per_redistributor, c.cpus_per_redistributor),
        Tier("learner", "learner_ranks", c.learner_ranks, c.gpus_per_learner, c.cpus_per_learner),
    ]


def evaluator_tier(cfg: Config) -> Tier | None:
    """The evaluations' engine, when there are evaluations and it has GPUs of its own: Ray would
    otherwise start it with no GPU, beside whatever runs on GPU 0 of its node."""
    c = cfg.cluster
    if not cfg.data.eval_size or not c.gpus_per_evaluator:
        return None
    return Tier("evaluator", "evaluator", 1, c.gpus_per_evaluator, c.cpus_per_generator)


def _resource_tiers(cfg: Config) -> list[Tier]:
    evaluator = evaluator_tier(cfg)
    return tiers(cfg) + ([evaluator] if evaluator else [])


def bundles(cfg: Config) -> list[tuple[str, int, dict[str, float]]]:
    """One bundle per stage worker: (tier, rank within the tier, resources)."""
    return [(t.name, rank, t.bundle()) for t in tiers(cfg) for rank in range(t.count)]


def demand(cfg: Config) -> dict[str, float]:
    """Resources of every bundle, the evaluator's included."""
    total: dict[str, float] = {}
    for t in _resource_tiers(cfg):
        for k, v in t.bundle().items():
            total[k] = total.get(k, 0.0) + t.count * v
    return total


# A local Ray may promise each real core to this many CPUs of the plan: the tiers take turns (the
# CPU demo asks 4 CPUs on 2 cores), but beyond it the workers thrash and run out of memory.
LOCAL_CPUS_PER_CORE = 2


def local_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _parts(ts: list[Tier], resource: str) -> str:
    """``generators 4 x 1 + …``: each tier's share of ``resource``."""
    return " + ".join(
        f"{t.key} {t.count} x {t.gpus if resource == 'GPU' else t.cpus:g}"
        for t in ts
        if (t.gpus if resource == "GPU" else t.cpus)
    )


def local_ray_cpus(cfg: Config, cores: int) -> int:
    """CPUs to give a local Ray on a machine with ``cores`` cores: the plan's demand (plus one), at
    least ``cores``. Raise ``PlanError`` when the plan needs more than ``LOCAL_CPUS_PER_CORE`` per core."""
    need = demand(cfg).get("CPU", 0.0)
    limit = LOCAL_CPUS_PER_CORE * cores
    if need > limit:
        raise PlanError(
            f"the resource plan needs {need:g} CPUs ({_parts(_resource_tiers(cfg), 'CPU')}) but this machine has "
            f"{cores} cores, and a local Ray runs at most {LOCAL_CPUS_PER_CORE} per core ({limit}): lower "
            "cluster.generators, cluster.redistributors, cluster.learner_ranks or cluster.cpus_per_<tier>, "
            "or set cluster.address to a Ray cluster"
        )
    return max(cores, math.ceil(need) + 1)


def check_plan(cfg: Config, available: dict[str, float], nodes: int = 1) -> None:
    """Raise ``PlanError`` if the cluster (``available`` resources, ``nodes`` alive) cannot hold the plan."""
    ts = _resource_tiers(cfg)  # counts >= 1 are already enforced by the config schema
    need = demand(cfg)
    for resource in ("GPU", "CPU"):
        want, have = need.get(resource, 0.0), available.get(resource, 0.0)
        if want > have:
            per = "gpus" if resource == "GPU" else "cpus"
            evaluator = (
                " (the evaluator's bundle: cluster.gpus_per_evaluator=0 shares the GPUs of its node, "
                "data.eval_size=0 drops the evaluations)"
                if ts[-1].name == "evaluator"
                else ""
            )
            raise PlanError(
                f"the resource plan needs {want:g} {resource}s ({_parts(ts, resource)}) but the cluster has {have:g}: "
                f"lower cluster.<tier> counts or cluster.{per}_per_<tier>, or add nodes{evaluator}"
            )
    if cfg.cluster.nodes > nodes:
        raise PlanError(
            f"cluster.nodes = {cfg.cluster.nodes} but the Ray cluster has {nodes} alive node(s): "
            "start the worker nodes first (deploy/ray/ray_worker.sh) or lower cluster.nodes"
        )


def describe_free(free_per_node: dict[str, dict[str, float]]) -> str:
    """``10.0.0.1: 2 GPU, 30 CPU; …``"""
    return "; ".join(f"{n}: {f.get('GPU', 0.0):g} GPU, {f.get('CPU', 0.0):g} CPU" for n, f in free_per_node.items())


def _fits(bundle: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) >= v for k, v in bundle.items())


def check_fit(cfg: Config, free_per_node: dict[str, dict[str, float]]) -> None:
    """Raise ``PlanError`` unless every bundle fits on one node's *free* resources
    (``free_per_node``: a node's address → what is free on it now). A bundle never spans nodes, so
    cluster totals can hide a plan that does not fit: 2 nodes with 4 free GPUs each cannot hold
    a learner of 8. Bundles are placed largest first, each on the node with the least room left
    that holds it (best fit decreasing: exact for the plans' few bundle sizes in practice)."""
    ts = _resource_tiers(cfg)
    left = {node: dict(free) for node, free in free_per_node.items()}
    for t in sorted(ts, key=lambda t: (t.gpus, t.cpus), reverse=True):
        for rank in range(t.count):
            b = t.bundle()
            nodes = [n for n, free in left.items() if _fits(b, free)]
            if not nodes:
                raise PlanError(
                    f"a {t.name} needs {b.get('GPU', 0.0):g} GPU and {b.get('CPU', 0.0):g} CPU on one node, and "
                    f"the plan's bundles do not fit the free resources per node ({describe_free(free_per_node)}; "
                    f"{t.name} {rank} of {t.count} found no room): free the nodes' GPUs (other jobs hold them), lower "
                    f"cluster.gpus_per_{t.name} or the counts, or add nodes"
                )
            best = min(nodes, key=lambda n: (left[n].get("GPU", 0.0) - b.get("GPU", 0.0), left[n].get("CPU", 0.0)))
            for k, v in b.items():
                left[best][k] = left[best].get(k, 0.0) - v


def write_placement(pg: Any, plan: list[tuple[str, int, dict[str, float]]], out: Path) -> None:
    """Which node holds each worker's bundle (``placement.json`` in the run dir)."""
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg)["bundles_to_node_id"]
    names = ["eval" if t == "evaluator" else f"{WORKER_PREFIX[t]}{r}" for t, r, _ in plan]
    out.write_text(json.dumps({name: nodes[i] for i, name in enumerate(names)}, indent=1))


def evaluator_options(cfg: Config, pg: Any, index: int, tier: Tier | None) -> dict[str, Any]:
    """Ray options of the evaluator: bundle ``index`` of ``pg`` when the plan gives it one
    (``cluster.gpus_per_evaluator``), else no resources (it runs while the tiers wait)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if tier is None:
        return {"num_cpus": 0, **process_options(cfg)}
    return {
        **process_options(cfg),
        "num_cpus": tier.cpus,
        "num_gpus": tier.gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
    }
