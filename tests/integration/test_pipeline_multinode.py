"""The pipeline on a fake two-node Ray cluster (``ray.cluster_utils.Cluster``), tiers spread over nodes:
rredcot credit, η = 1, weights as files; every sample trained once (the checks of test_pipeline)."""

from __future__ import annotations

import json

import ray

from tests.integration.test_pipeline import _run, assert_every_sample_trained_once


def test_fake_two_node_cluster_places_tiers_on_different_nodes(redis_server, redis_client, run_id, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
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
        )
        placement = json.loads((tmp_path / run_id / "placement.json").read_text())
        assert set(placement) == {"gen0", "red0", "learner0"}
        assert len(set(placement.values())) == 2  # the tiers really ran on both nodes
        assert_every_sample_trained_once(redis_client, run_id, cfg, eta=1)
    finally:
        ray.shutdown()
        cluster.shutdown()
