"""The stage interface and its Ray actor: every tier is ``Stage(cfg, name, rank=rank).run() -> dict``.

A stage class takes the run's ``Config``, its worker name (``gen0``, ``red1``, ``learner0``) and
its rank within the tier; ``run()`` works until the run's prompt budget is done or its stop flag
is raised, and returns the worker's summary (a flat dict of numbers). ``StageWorker`` is the one
Ray actor body for all tiers: the config crosses as a plain dict (never a pickled object).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from rredcot.common.config import Config, ConfigError, CreditSpec, resolve_credit
from rredcot.common.control import RunControl
from rredcot.common.net import loopback_interface
from rredcot.common.startup_gc import collector_off
from rredcot.launch.observe.heap_trace import ENV as HEAP_TRACE_ENV
from rredcot.launch.observe.heap_trace import HeapTrace, heap_trace_period
from rredcot.launch.observe.logs import redirect_output
from rredcot.transports import deployment

log = logging.getLogger(__name__)

# tier -> (module, class) of its stage
STAGE_CLASSES = {
    "generator": ("rredcot.actors.generator", "Generator"),
    "redistributor": ("rredcot.redistributor.worker", "Redistributor"),
    "learner": ("rredcot.learner.trainer", "Trainer"),
}
WORKER_PREFIX = {"generator": "gen", "redistributor": "red", "learner": "learner"}


class Stage(Protocol):
    """A tier's worker, as ``StageWorker`` builds and runs it: ``cls(cfg, name, rank=rank, **parts)``
    (``parts``: what ``stage_parts`` wires in), connected to the run through ``RunContext`` (its
    ``control`` counts restarts and carries the stop flag); ``run()`` works until the run's budget is
    done or the stop flag is raised, and returns the worker's summary."""

    control: RunControl

    def run(self) -> dict[str, float]: ...


def restart_options(cfg: Config, tier: str) -> dict[str, int]:
    """Ray actor options that supervise a worker of ``tier``: Ray restarts a dead generator or
    redistributor up to ``cluster.max_restarts`` times and retries its run(); the new one reclaims
    what the dead one held (in-flight prompts, pending stream entries). Never a learner rank: the
    ranks of a torch.distributed group cannot rejoin it one by one, so the driver restarts the whole
    learner tier (``launch.supervisor``)."""
    n = cfg.cluster.max_restarts if tier != "learner" else 0
    return {"max_restarts": n, "max_task_retries": n}


WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_policy() -> str:
    """OpenMP's wait policy for the run's workers: passive unless the driver's environment names one. On
    a node whose cores the workers share, a thread that spins at a barrier while its team-mate is
    descheduled burns the core the others need (``bench/omp_wait.py``: beside two busy processes, a
    2-thread learner step took 1.4× as long spinning as passive, and up to 1.6× the CPU time)."""
    return os.environ.get(WAIT_POLICY, "PASSIVE")


def process_options(cfg: Config) -> dict[str, Any]:
    """Ray actor options that fix what a worker's process must hold from its exec. OpenMP reads its wait
    policy once, as it loads: a worker sets it before it imports torch (``stage_env``), but a node may
    preload OpenMP (``LD_PRELOAD``, as vLLM-CPU's guides advise), and then only the environment the process
    started with counts. A local Ray's processes start with the driver's (``launch.local_ray``); a
    cluster's node has its own, so there the policy goes in a ``runtime_env``, which costs every actor a
    second process importing Ray before its own (docs/benchmarks.md)."""
    return {"runtime_env": {"env_vars": {WAIT_POLICY: wait_policy()}}} if cfg.cluster.address else {}


def stage_parts(tier: str, cfg: Config, credit: CreditSpec | None = None) -> dict[str, Any]:
    """What launch builds for a stage beyond its config. A redistributor gets the credit method
    resolved once (``credit``, or resolved here: the method, its settings, its prover), and when the
    method samples continuations (``mc``, ``progress``) a dedicated vLLM engine
    (``VLLMContinuations``), built before the stage's scorer: the policy following the run's published
    weights, or the fixed prover the method declares (``progress``: its settings' ``prover``)."""
    if tier != "redistributor":
        return {}
    credit = credit or resolve_credit(cfg)
    if credit.prover is None:
        return {"credit": credit}
    from rredcot.actors.continuations import VLLMContinuations

    return {"credit": credit, "sampler": VLLMContinuations.from_config(cfg, credit.prover)}


def build_stage(tier: str, cfg: Config, rank: int) -> Stage:
    """Worker ``<prefix><rank>`` of ``tier`` (``gen2``, ``red0``, ``learner1``) with what launch wires into it,
    imported and built under ``collector_off``: objects that live as long as the worker."""
    module, cls = STAGE_CLASSES[tier]
    with collector_off():
        stage_class: type[Stage] = getattr(importlib.import_module(module), cls)
        return stage_class(cfg, f"{WORKER_PREFIX[tier]}{rank}", rank=rank, **stage_parts(tier, cfg))


def run_stage(cfg: Config, tier: str, rank: int = 0) -> dict[str, float]:
    """``rredcot generate|redistribute|learn CONFIG``: one worker of ``tier`` in this process, against
    ``redis.url``, until the run's budget is done or its stop flag is raised; returns its summary. A
    generator must fit in its transport's weight group, if the transport holds one (sized when the run
    started)."""
    if tier == "generator" and (n := deployment(cfg).group_size(cfg)) is not None and rank >= n:
        raise ConfigError(
            f"--index {rank}: the {cfg.generation.weight_transport} transport's weight group, sized when the run "
            f"started, has room for --index 0..{n - 1}; add generators by hand with generation.weight_transport=file"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stage = build_stage(tier, cfg, rank)
    try:
        summary = stage.run()
    finally:
        if (close := getattr(stage, "close", None)) is not None:  # a generator's engine, verifier and Redis
            close()
    log.info("%s%d done: %s", WORKER_PREFIX[tier], rank, summary)
    return summary


def start_worker_process(name: str, cfg: dict[str, Any], env: dict[str, str]) -> Config:
    """What every worker's Ray actor does first, a tier's and the evaluator's alike: take the
    environment the driver chose (``stage_env``), send its output to ``logs/<name>.log``, start the
    heap trace when asked, size torch's threads (every core when the driver named none), set what
    depends on this node (``node_env``), and rebuild the run's ``Config`` from its plain dict; its imports
    under ``collector_off``. The environment comes before torch loads OpenMP, which reads its wait policy
    then: the actors' modules (this one, ``launch.evaluate``) import no torch, so neither does Ray's
    worker before this runs (``process_options`` for a node that preloads OpenMP)."""
    with collector_off():
        os.environ.update(env)
        logs = Path(cfg["run"]["dir"]).resolve() / "logs"
        redirect_output(logs / f"{name}.log")
        if (every_s := heap_trace_period()) is not None:
            HeapTrace(logs / f"{name}.heap.txt", every_s).start()
        import torch

        # (before any engine starts: vLLM-CPU refuses set_num_threads afterwards)
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]) if "OMP_NUM_THREADS" in env else _cores())
        os.environ.update(node_env())
        from rredcot.common.config import from_dict

        return from_dict(cfg)


class StageWorker:
    """Ray actor body for any tier: builds the stage object from a plain-dict config and runs it."""

    def __init__(self, tier: str, cfg: dict[str, Any], rank: int, env: dict[str, str], incarnation: int = 0) -> None:
        """``incarnation``: how many times the driver has started this worker before (a learner tier
        it restarted); a worker that Ray restarted in place knows it from its runtime context."""
        name = f"{WORKER_PREFIX[tier]}{rank}"
        config = start_worker_process(name, cfg, env)
        import ray

        reconstructed = ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed
        restarted = incarnation > 0 or reconstructed
        if restarted:
            why = "with its learner tier" if incarnation else "after its process died"
            log.warning("%s restarted %s; it reclaims what it held", name, why)
            config = dataclasses.replace(config, run=dataclasses.replace(config.run, resume="auto"))
        self.stage = build_stage(tier, config, rank)
        if restarted:
            self.stage.control.count_restart(name)

    def run(self) -> dict[str, float]:
        return self.stage.run()


def node_env() -> dict[str, str]:
    """What a worker sets on its own node, not the driver's: DeepSpeed's accelerator follows the GPUs
    Ray gave this process (a driver on a CPU head node must not put GPU learners on the CPU)."""
    import torch

    return {} if torch.cuda.is_available() else {"DS_ACCELERATOR": "cpu"}


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sees_gpus(cfg: Config, tier: str) -> bool:
    """Whether a worker of ``tier`` may use its node's GPUs. Ray shows a GPU-less actor every GPU of
    its node, so a tier without GPUs is kept off them; the one exception is an evaluator without GPUs
    of its own on a plan with GPU generators, which evaluates on its node's first GPU beside them
    (``launch.plan.evaluator_tier``)."""
    c = cfg.cluster
    if tier == "evaluator" and not c.gpus_per_evaluator:
        return bool(c.gpus_per_generator)
    return bool(getattr(c, f"gpus_per_{tier}"))


def stage_env(cfg: Config, tier: str, rank: int = 0, rendezvous: tuple[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker's process, as the driver decides it (``node_env`` adds what
    depends on the worker's node), OpenMP's wait policy (``wait_policy``) among it. A learner rank's also
    names its group's rendezvous:
    ``(rank 0's node address, the id of this start of the learner tier)`` (``learner.rendezvous``).
    The evaluator gets no thread count: its evaluations use every core of its node."""
    cpus = {
        "generator": cfg.cluster.cpus_per_generator,
        "redistributor": cfg.cluster.cpus_per_redistributor,
        "learner": cfg.cluster.cpus_per_learner,
        "evaluator": None,
    }[tier]
    env = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    env[WAIT_POLICY] = wait_policy()
    if cpus is not None:
        env["OMP_NUM_THREADS"] = str(max(1, int(cpus)))
    if not cfg.cluster.address:  # one machine: gloo's devices (learner ranks, weight group) on loopback, not
        env["GLOO_SOCKET_IFNAME"] = loopback_interface()  # the address the host name resolves to (often the LAN's)
    if not sees_gpus(cfg, tier):
        env["CUDA_VISIBLE_DEVICES"] = ""
    if heap_trace_period() is not None:
        env[HEAP_TRACE_ENV] = os.environ[HEAP_TRACE_ENV]  # the driver's diagnostic setting, on every node
    if tier == "learner":
        from rredcot.learner.rendezvous import ENV as RENDEZVOUS_ENV

        assert rendezvous is not None, "a learner rank needs its group's rendezvous"
        env |= {
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(cfg.cluster.learner_ranks),
            "MASTER_ADDR": rendezvous[0],
            RENDEZVOUS_ENV: rendezvous[1],
        }
    return env
