"""The run's local Ray is checked against the machine before it starts."""

from __future__ import annotations

import contextlib

import pytest

from rredcot.common.config import load_config
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
