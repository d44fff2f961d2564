"""The pipeline on a fake two-node Ray cluster (``ray.cluster_utils.Cluster``), tiers spread over nodes:
rredcot credit, η = 1, weights as files; every sample trained once (the checks of test_pipeline).
The head has no GPU and the other node two (Ray's resource only: their engines still run on this
CPU): the generator and the evaluator take one each there, from the plan's bundles."""

from __future__ import annotations

import json

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
