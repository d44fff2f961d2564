import pytest

from rredcot.common.config import ConfigError, load_config
from rredcot.launch.plan import PlanError, bundles, check_plan, demand, local_ray_cpus


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
    assert demand(cfg) == {"CPU": 7.0, "GPU": 5.0}
    check_plan(cfg, {"CPU": 16, "GPU": 8})


def test_too_many_gpus_says_what_to_change():
    cfg = load_config("tests", ["cluster.generators=4", "cluster.gpus_per_generator=1", "cluster.gpus_per_learner=2"])
    with pytest.raises(PlanError) as e:
        check_plan(cfg, {"CPU": 64, "GPU": 4})
    msg = str(e.value)
    assert "needs 6 GPUs" in msg and "has 4" in msg and "generators 4 x 1" in msg and "gpus_per_<tier>" in msg


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
