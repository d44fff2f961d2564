"""The pipeline on a fake two-node Ray cluster (``ray.cluster_utils.Cluster``), tiers spread over nodes:
rredcot credit, η = 1, weights as files; every sample trained once (the checks of test_pipeline).
The head has no GPU and the other node two (Ray's resource only: their engines still run on this
CPU): the generator and the evaluator take one each there, from the plan's bundles. Then the run as a
cluster user starts it: no redis.url (the driver's own Redis, with a password), two learner ranks on
different nodes, weights through the collective transport."""

from __future__ import annotations

import json
from pathlib import Path

import ray

from tests.integration.test_pipeline import _run, assert_every_sample_trained_once


def test_fake_two_node_cluster_places_tiers_on_different_nodes(redis_server, redis_client, run_id, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=2)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cfg, _ = _run(
            tmp_path,
            redis_server,
            run_id,
            "cluster.nodes=2",
            "cluster.placement=spread",
            "run.steps=2",
            "credit.method=rredcot",
            "staleness.eta=1",
            "generation.weight_transport=file",
            "learner.skip_zero_advantage=false",
            f"cluster.address={cluster.address}",  # a cluster, whose GPUs this machine need not have
            "cluster.gpus_per_generator=1",
            "data.eval_size=5",
        )
        placement = json.loads((tmp_path / run_id / "placement.json").read_text())
        assert set(placement) == {"gen0", "red0", "learner0", "eval"}
        assert len(set(placement.values())) == 2  # the tiers really ran on both nodes
        assert placement["gen0"] == placement["eval"] == gpu_node.node_id
        summary = json.loads((tmp_path / run_id / "report" / "summary.json").read_text())
        assert [e["step"] for e in summary["evaluations"]] == [0, cfg.run.steps]
        assert_every_sample_trained_once(redis_client, run_id, cfg, eta=1)
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_two_learner_ranks_on_two_nodes_with_the_drivers_own_redis(tmp_path):
    from ray.cluster_utils import Cluster

    from rredcot.common.config import load_config
    from rredcot.launch.driver import train

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    cluster.add_node(num_cpus=3)
    try:
        cfg = load_config(
            "tests",
            [
                f"run.dir={tmp_path / 'run'}",
                "run.name=two-ranks",
                "logging.progress=false",
                "data.eval_size=0",
                "run.steps=2",
                "cluster.nodes=2",
                "cluster.placement=spread",
                "cluster.learner_ranks=2",
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
    assert summary["status"] == "finished" and summary["steps"] == 2
    assert placement["learner0"] != placement["learner1"]  # one rank on each node
    ledger, workers = summary["ledger"], summary["workers"]
    assert ledger["admitted"] == ledger["trained"] == 2 * cfg.generation.prompts_per_step and not ledger["missing"]
    generated = sum(v["samples"] for v in workers.values() if v["tier"] == "generator")
    consumed = sum(v["samples_consumed"] for v in workers.values() if v["tier"] == "learner")
    assert generated == consumed == 2 * cfg.generation.prompts_per_step * cfg.generation.group_size
    assert all(v["broadcast_fallbacks"] == 0 for w, v in workers.items() if w == "learner0")  # the group carried them
    driver_log = Path(run / "logs" / "driver.log").read_text()
    assert "embedded Redis at redis://:***@" in driver_log and "password: random for this run" in driver_log
