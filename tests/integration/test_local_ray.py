"""The run's own Ray (``launch.local_ray.init_ray``, in a fresh interpreter as ``rredcot train`` starts
it) runs its workers at the driver's priority, not Ray's default niceness of 15, under which any
other busy process on the machine starves the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import contextlib, os

    from rredcot.common.config import load_config
    from rredcot.launch.local_ray import init_ray

    with contextlib.ExitStack() as stack:
        init_ray(load_config("tests"), stack)
        import ray

        worker = ray.get(ray.remote(lambda: os.nice(0)).options(num_cpus=0).remote())
        print("niceness", os.nice(0), worker, flush=True)
    """
)


def test_the_runs_ray_workers_run_at_the_drivers_priority() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    driver, worker = (int(v) for v in out.stdout.split("niceness", 1)[1].split())
    assert worker == driver, f"Ray workers at niceness {worker}, the driver at {driver}"
