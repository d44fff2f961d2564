"""The pipeline on a fake two-node Ray cluster (``ray.cluster_utils.Cluster``), as a cluster user starts
it: no ``redis.url`` (the driver's own Redis, with a password), tiers spread over the nodes, two learner
ranks on different nodes, weights through the collective transport, GRPO, η = 0, held-out
evaluations, on docs/extending.md's example task (a module outside rredcot named in the config, which
the workers import as a user's package). The second node has two GPUs (Ray's resource only: its
engines still run on this CPU): the generator and the evaluator take one each there, from the plan's
bundles. One run, since each costs a Ray cluster and every tier's start-up (rredcot credit, η = 2 and
the shared-memory slots: test_pipeline.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ray

from rredcot.common.config import load_config
from rredcot.launch.driver import train

ROOT = Path(__file__).resolve().parents[2]


def test_two_nodes_spread_tiers_and_learner_ranks_and_train_every_sample_once(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    # the nodes' workers import the config's own module (tests.extensions.double) as a user's package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    # 7 CPUs for 7 bundle CPUs: the GPU node holds the generator's and the evaluator's bundles and one
    # learner rank's (2 CPUs), the head the other rank's and the redistributor's: ranks cannot share a node
    gpu_node = cluster.add_node(num_cpus=4, num_gpus=2)
    try:
        cfg = load_config(
            "tests",
            [
                f"run.dir={tmp_path / 'run'}",
                "run.name=two-nodes",
                "logging.progress=false",
                "data.eval_size=5",
                "run.steps=2",
                "task.name=tests.extensions.double",
                "credit.method=grpo",
                "staleness.eta=0",
                "learner.skip_zero_advantage=false",
                "cluster.nodes=2",
                "cluster.placement=spread",
                "cluster.learner_ranks=2",
                "cluster.cpus_per_learner=2",
                "cluster.gpus_per_generator=1",  # a cluster's GPUs, which this machine need not have
                "generation.weight_transport=collective",
                f"cluster.address={cluster.address}",
            ],
        )
        train(cfg)
    finally:
        ray.shutdown()
        cluster.shutdown()
    run = tmp_path / "run"
    summary = json.loads((run / "report" / "summary.json").read_text())
    placement = json.loads((run / "placement.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == cfg.run.steps
    assert set(placement) == {"gen0", "red0", "learner0", "learner1", "eval"}
    assert placement["learner0"] != placement["learner1"]  # one rank on each node
    assert placement["gen0"] == placement["eval"] == gpu_node.node_id  # the GPU bundles
    assert [e["step"] for e in summary["evaluations"]] == [0, cfg.run.steps]
    prompts = cfg.run.steps * cfg.generation.prompts_per_step
    ledger, workers = summary["ledger"], summary["workers"]
    assert ledger["balanced"] and ledger["admitted"] == ledger["trained"] == prompts and not ledger["missing"]
    assert (ledger["dead"], ledger["rejected"], ledger["in_flight"]) == (0, 0, 0)
    gens = [v for v in workers.values() if v["tier"] == "generator"]
    learners = [v for v in workers.values() if v["tier"] == "learner"]
    generated = sum(v["samples"] for v in gens)
    assert generated == prompts * cfg.generation.group_size
    # every sample once into each rank's global batch, within η updates of the policy that sampled it
    assert sum(v["samples_consumed"] for v in learners) == generated  # each rank reads its share
    assert all(v["samples_trained"] == generated and v["duplicates"] == 0 for v in learners)  # the global batch
    assert all(v["step"] == v["version"] == cfg.run.steps for v in learners)
    assert max(v["staleness_max"] for v in learners) <= cfg.staleness.eta
    # every version went over the group, the last one included, with no fallback to files
    assert workers["learner0"]["broadcast_fallbacks"] == 0 and workers["learner0"]["broadcast_send_s_total"] > 0
    assert [g["version"] for g in gens] == [cfg.run.steps]
    assert all(g["weight_updates"] >= cfg.run.steps for g in gens)
    report = run / "report"
    assert (report / "curves.png").stat().st_size > 10_000 and (report / "final_model" / "config.json").exists()
    driver_log = (run / "logs" / "driver.log").read_text()
    assert "embedded Redis at redis://:***@" in driver_log and "password: random for this run" in driver_log
