"""The run's local Ray is checked against the machine before it starts."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.checks.doctor import check_services
from rredcot.launch.local_ray import init_ray
from rredcot.launch.plan import PlanError, local_cores


def test_a_local_plan_beyond_the_cores_fails_before_ray_starts():
    """The local Ray used to be sized to the plan, so no plan could fail; now it is checked against
    the real cores first."""
    import ray

    generators = 2 * local_cores() + 1
    cfg = load_config("tests", [f"cluster.generators={generators}"])
    with contextlib.ExitStack() as stack, pytest.raises(PlanError) as e:
        init_ray(cfg, stack)
    assert not ray.is_initialized()
    assert f"needs {generators + 2} CPUs (generators {generators} x 1" in str(e.value)
    assert f"has {local_cores()} cores" in str(e.value) and "cluster.generators" in str(e.value)


@pytest.mark.slow
def test_a_ray_this_process_already_has_is_not_claimed_as_the_runs_own():
    """``train`` in a process that has a Ray (tests, notebooks) must not record that Ray's session as
    the run's: the run's next start would end its processes (``launch.leftovers``). The doctor says
    the run uses that Ray; it used to warn that the run would start another beside it."""
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        (check,) = [c for c in check_services(load_config("tests")) if c.topic == "ray"]
        assert (check.level, check.found) == ("ok", "the run uses the Ray this process has already started (ray.init)")
        with contextlib.ExitStack() as stack:
            assert init_ray(load_config("tests"), stack) is None
        assert ray.is_initialized()  # and left running: not the run's to shut down
    finally:
        ray.shutdown()
    with contextlib.ExitStack() as stack:
        session = init_ray(load_config("tests"), stack)
        assert session is not None and Path(session).is_dir()  # one it started: its own
