import pytest

from rredcot.common.config import ConfigError, load_config
from rredcot.launch.plan import PlanError, bundles, check_fit, check_plan, demand, evaluator_tier, local_ray_cpus


def test_bundles_follow_the_plan():
    cfg = load_config(
        "tests",
        [
            "cluster.generators=3",
            "cluster.redistributors=2",
            "cluster.learner_ranks=2",
            "cluster.gpus_per_generator=1",
            "cluster.gpus_per_learner=1",
        ],
    )
    tiers = [t for t, _, _ in bundles(cfg)]
    assert tiers == ["generator"] * 3 + ["redistributor"] * 2 + ["learner"] * 2
    assert demand(cfg) == {"CPU": 8.0, "GPU": 6.0}  # and a generator's bundle for the evaluator
    check_plan(cfg, {"CPU": 16, "GPU": 8})


def test_too_many_gpus_says_what_to_change():
    cfg = load_config("tests", ["cluster.generators=4", "cluster.gpus_per_generator=1", "cluster.gpus_per_learner=2"])
    with pytest.raises(PlanError) as e:
        check_plan(cfg, {"CPU": 64, "GPU": 4})
    msg = str(e.value)
    assert "needs 7 GPUs" in msg and "has 4" in msg and "generators 4 x 1" in msg and "gpus_per_<tier>" in msg


def test_cpu_plan_must_fit_cpus():
    cfg = load_config("tests", ["cluster.cpus_per_generator=8"])
    with pytest.raises(PlanError, match="needs 10 CPUs"):
        check_plan(cfg, {"CPU": 4})


def test_nodes_must_be_alive():
    cfg = load_config("tests", ["cluster.nodes=3"])
    with pytest.raises(PlanError, match="cluster.nodes = 3 but the Ray cluster has 1"):
        check_plan(cfg, {"CPU": 64}, nodes=1)


def test_zero_generators_rejected_by_config():
    with pytest.raises(ConfigError, match="cluster.generators = 0"):
        load_config("tests", ["cluster.generators=0"])


def test_a_local_ray_needs_the_plan_to_fit_the_machines_cores():
    demo = load_config("demo_cpu")  # 4 CPUs: the tiers share 2 cores
    assert local_ray_cpus(demo, cores=2) == 5
    assert local_ray_cpus(load_config("tests"), cores=16) == 16
    with pytest.raises(PlanError) as e:
        local_ray_cpus(load_config("tests", ["cluster.generators=4"]), cores=2)
    msg = str(e.value)
    assert "needs 6 CPUs (generators 4 x 1 + redistributors 1 x 1 + learner_ranks 1 x 1)" in msg
    assert "has 2 cores" in msg and "at most 2 per core (4)" in msg
    assert "cluster.generators" in msg and "cluster.cpus_per_<tier>" in msg and "cluster.address" in msg


def test_a_gpu_plan_gives_the_evaluator_a_generators_bundle():
    """Ray would start a GPU-less evaluator beside whatever holds GPU 0 of its node (or on a CPU-only
    head, where vLLM's GPU build cannot run); on CPU it keeps taking no bundle."""
    cfg = load_config("tests", ["cluster.gpus_per_generator=1", "cluster.cpus_per_generator=3"])
    assert evaluator_tier(cfg).bundle() == {"CPU": 3.0, "GPU": 1.0}
    assert demand(cfg) == {"CPU": 8.0, "GPU": 2.0}  # 1 generator + its twin for the evaluations
    assert [t for t, _, _ in bundles(cfg)] == ["generator", "redistributor", "learner"]  # the stage workers
    with pytest.raises(PlanError, match=r"needs 2 GPUs \(generators 1 x 1 \+ evaluator 1 x 1\).*data.eval_size=0"):
        check_plan(cfg, {"CPU": 8, "GPU": 1})
    check_plan(load_config("tests", ["cluster.gpus_per_generator=1", "data.eval_size=0"]), {"CPU": 8, "GPU": 1})
    assert evaluator_tier(load_config("tests")) is None


def test_tiers_sharing_one_gpu_can_share_it_with_the_evaluator_too():
    """The one-GPU layout (generator and learner on halves of it) has no room for a bundle of its own:
    ``cluster.gpus_per_evaluator=0`` runs the evaluator on the GPU its node shows, as before."""
    shared = ["cluster.gpus_per_learner=0.5", "cluster.gpus_per_generator=0.5"]
    with pytest.raises(PlanError, match=r"needs 1.5 GPUs.*cluster.gpus_per_evaluator=0 shares"):
        check_plan(load_config("tests", shared), {"CPU": 8, "GPU": 1})
    cfg = load_config("tests", [*shared, "cluster.gpus_per_evaluator=0"])
    assert evaluator_tier(cfg) is None and demand(cfg)["GPU"] == 1.0
    check_plan(cfg, {"CPU": 8, "GPU": 1})


@pytest.mark.parametrize("name", ["qwen3-4b-numina-25k", "qwen2.5-1.5b-openrs"])
def test_the_shipped_gpu_configs_fit_their_nodes_of_8_gpus(name):
    """Their nodes × 8 GPUs, with 96 cores a node (p4d.24xlarge has 96 vCPUs, a DGX H100 224 threads)."""
    cfg = load_config(name)
    nodes = cfg.cluster.nodes
    check_plan(cfg, {"GPU": 8 * nodes, "CPU": 96 * nodes}, nodes=nodes)
    assert demand(cfg)["GPU"] == 8 * nodes  # no GPU left idle
    check_fit(cfg, {f"10.0.0.{i}": {"GPU": 8, "CPU": 96} for i in range(nodes)})  # and every node is used whole


FOUR_GENERATORS_AND_A_LEARNER_OF_4 = [
    "cluster.generators=4",
    "cluster.gpus_per_generator=1",
    "cluster.gpus_per_learner=4",
    "cluster.gpus_per_evaluator=0",
]


def test_totals_that_fit_but_free_gpus_per_node_that_do_not():
    """2 free GPUs on each of 4 nodes: 8 in all, but a learner of 4 GPUs has no node to go on."""
    cfg = load_config("tests", FOUR_GENERATORS_AND_A_LEARNER_OF_4)
    free = {f"10.0.0.{i}": {"GPU": 2.0, "CPU": 32.0} for i in range(4)}
    check_plan(cfg, {"GPU": 8, "CPU": 128}, nodes=4)  # the totals say yes
    with pytest.raises(PlanError) as e:
        check_fit(cfg, free)
    msg = str(e.value)
    assert "a learner needs 4 GPU and 1 CPU on one node" in msg and "10.0.0.3: 2 GPU, 32 CPU" in msg
    assert "cluster.gpus_per_learner" in msg and "\n" not in msg
    check_fit(cfg, {**free, "10.0.0.0": {"GPU": 4.0, "CPU": 32.0}, "10.0.0.1": {"GPU": 0.0, "CPU": 32.0}})


def test_best_fit_keeps_the_big_node_for_the_big_bundle():
    """Largest bundle first: the 4-GPU learner takes the 4-GPU node, the four 1-GPU generators the rest;
    placed in plan order (generators first, each on the first node with room) it would not fit."""
    cfg = load_config("tests", FOUR_GENERATORS_AND_A_LEARNER_OF_4)
    check_fit(cfg, {"a": {"GPU": 4.0, "CPU": 8.0}, "b": {"GPU": 2.0, "CPU": 8.0}, "c": {"GPU": 2.0, "CPU": 8.0}})
    with pytest.raises(PlanError, match="a generator needs 1 GPU"):
        check_fit(cfg, {"a": {"GPU": 4.0, "CPU": 8.0}, "b": {"GPU": 3.0, "CPU": 8.0}})
    cpus_apart = {"a": {"GPU": 4.0, "CPU": 0.5}, "b": {"GPU": 4.0, "CPU": 8.0}}  # CPUs count per node too
    check_plan(cfg, {"GPU": 8.0, "CPU": 8.5})  # the totals say yes
    with pytest.raises(PlanError, match="a generator needs 1 GPU and 1 CPU on one node"):
        check_fit(cfg, cpus_apart)
