"""The run's own Ray (``launch.local_ray.init_ray``, in a fresh interpreter as ``rredcot train`` starts
it) runs its workers at the driver's priority, not Ray's default niceness of 15, under which any
other busy process on the machine starves the run; and it prestarts no idle workers, which the run's
actors (each with a runtime_env) could not take."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import contextlib, os, time

    import psutil

    from rredcot.common.config import load_config
    from rredcot.launch.local_ray import init_ray

    with contextlib.ExitStack() as stack:
        init_ray(load_config("tests"), stack)
        import ray

        time.sleep(3)  # Ray prestarts its workers within a second of the first driver's connection
        workers = [p for p in psutil.Process().children(recursive=True) if "ray::IDLE" in " ".join(p.cmdline())]
        print("idle", len(workers), flush=True)
        worker = ray.get(ray.remote(lambda: os.nice(0)).options(num_cpus=0).remote())
        print("niceness", os.nice(0), worker, flush=True)
    """
)


def test_the_runs_ray_workers_run_at_the_drivers_priority_and_none_starts_idle() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_prestart_worker_first_driver"}  # tests/conftest.py's
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True, env=env
    )
    assert out.stdout.split()[:2] == ["idle", "0"], out.stdout
    driver, worker = (int(v) for v in out.stdout.split("niceness", 1)[1].split())
    assert worker == driver, f"Ray workers at niceness {worker}, the driver at {driver}"
