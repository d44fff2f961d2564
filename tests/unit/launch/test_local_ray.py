"""The run's local Ray is checked against the machine before it starts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.checks.doctor import check_services
from rredcot.launch.local_ray import init_ray, local_ray_env
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


@pytest.mark.parametrize(("named", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_a_local_rays_processes_start_with_the_workers_wait_policy(monkeypatch, named, expected):
    """OpenMP reads its wait policy once, as it loads: in the environment a local Ray's processes start
    with, no preloaded OpenMP can miss it. A policy the driver's environment names is kept."""
    for name in ("RAY_gcs_rpc_server_reconnect_timeout_s", "RAY_prestart_worker_first_driver", "RAY_worker_niceness"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # put back as they were after the test
    if named is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", named)
    local_ray_env(load_config("tests"))
    assert os.environ["OMP_WAIT_POLICY"] == expected


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
