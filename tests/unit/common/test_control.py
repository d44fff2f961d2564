import os

from rredcot.common.control import RunControl


def test_stop_flag_and_metrics_snapshots(redis_client, run_id):
    ctl = RunControl(redis_client, run_id)
    assert not ctl.stop_requested()
    ctl.request_stop("budget reached")
    assert RunControl(redis_client, run_id).stop_requested()
    ctl.clear_stop()
    assert not ctl.stop_requested()

    ctl.publish_metrics("gen0", "generator", {"tokens": 10, "reward_mean": 0.5})
    ctl.publish_metrics("gen0", "generator", {"tokens": 25})
    ctl.publish_metrics("learner0", "learner", {"step": 3})
    snap = ctl.all_metrics()
    assert snap["gen0"].pop("pid") == os.getpid()  # and the process that published it
    assert snap["gen0"].pop("cpu_s") >= 0  # every snapshot carries the worker's CPU seconds since its first
    assert snap["gen0"] == {"tier": "generator", "tokens": 25.0, "reward_mean": 0.5}
    assert snap["learner0"]["step"] == 3.0
    assert RunControl(redis_client, run_id + "x").all_metrics() == {}  # namespaced by run


def test_metrics_come_from_the_runs_registry_not_a_key_pattern(redis_client, run_id):
    RunControl(redis_client, run_id).publish_metrics("gen0", "generator", {"tokens": 1})
    redis_client.hset(f"rredcot:{run_id}:metrics:ghost", mapping={"tier": "generator"})  # no worker of the run
    assert set(RunControl(redis_client, run_id).all_metrics()) == {"gen0"}
    assert RunControl(redis_client, f"{run_id[:-1]}?").all_metrics() == {}  # a glob in the id matches nothing
