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
    assert snap["gen0"].pop("cpu_s") >= 0  # every snapshot carries the worker's CPU seconds since its first
    assert snap["gen0"] == {"tier": "generator", "tokens": 25.0, "reward_mean": 0.5}
    assert snap["learner0"]["step"] == 3.0
    assert RunControl(redis_client, run_id + "x").all_metrics() == {}  # namespaced by run
