"""The pipeline on a fake two-node Ray cluster (``ray.cluster_utils.Cluster``), tiers spread over nodes."""

from __future__ import annotations

import json

import ray

from tests.integration.test_pipeline import _run, _workers


def test_fake_two_node_cluster_places_tiers_on_different_nodes(redis_server, redis_client, run_id, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        _, _ = _run(
            tmp_path,
            redis_server,
            run_id,
            "cluster.nodes=2",
            "cluster.placement=spread",
            "run.steps=2",
            "credit.method=grpo",
            "learner.skip_zero_advantage=false",
        )
        placement = json.loads((tmp_path / run_id / "placement.json").read_text())
        assert set(placement) == {"gen0", "red0", "learner0"}
        assert len(set(placement.values())) == 2  # the tiers really ran on both nodes
        _, _, learner = _workers(redis_client, run_id)
        assert learner["step"] == 2 and learner["samples_trained"] == 2 * 2 * 4
    finally:
        ray.shutdown()
        cluster.shutdown()
