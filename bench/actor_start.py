"""Actor start-up benchmark: what a ``runtime_env`` costs each Ray actor's start.

A local Ray of 2 CPUs (loopback, no dashboard) starts ``--actors`` actors at once and waits until
each has answered: first plain, as a local run's stage workers start now
(``launch.stages.process_options`` gives them nothing); then with an ``env_vars`` runtime_env, as every
worker started before 2026-12-06 and as a cluster's still do (Ray runs each through
``setup_worker.py``, a second process that imports Ray, then execs the worker). The kinds alternate,
``--repeats`` times; each start's wall time and the machine's busy CPU seconds (``/proc/stat``) over
it. Prints a table; the last line is one JSON object.

    rredcot bench actor_start [--actors 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from rredcot.common.config import load_config
from rredcot.launch.arguments import bounded_int
from rredcot.launch.stages import process_options


def kinds() -> dict[str, dict]:
    """The Ray options of a local run's actor and of a cluster's (``launch.stages.process_options``)."""
    local, cluster = load_config("tests"), load_config("tests", ["cluster.address=10.0.0.1:6379"])
    return {"plain": process_options(local), "runtime_env": process_options(cluster)}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--actors", type=bounded_int(1, 16), default=3, help="actors started at once (a run's tiers)")
    p.add_argument("--repeats", type=bounded_int(1, 50), default=3, help="starts of each kind")
    return p.parse_args()


def busy_cpu_s() -> float:
    """The machine's CPU seconds spent outside idle and I/O wait since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class Ready:
    def pid(self) -> int:
        return os.getpid()


def start(ray, options: dict, actors: int) -> dict[str, float]:
    """``actors`` actors started at once with ``options``, until each has answered; then ended."""
    cpu, t = busy_cpu_s(), time.perf_counter()
    handles = [ray.remote(Ready).options(num_cpus=0, **options).remote() for _ in range(actors)]
    ray.get([h.pid.remote() for h in handles])
    took = {"wall_s": time.perf_counter() - t, "cpu_s": busy_cpu_s() - cpu}
    for h in handles:
        ray.kill(h)
    time.sleep(2)  # their processes gone before the next start
    return took


def main() -> None:
    args = parse()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only (launch.local_ray)
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    import ray

    from rredcot.common.precision import cpu_info

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        options_of = kinds()
        runs: dict[str, list[dict]] = {kind: [] for kind in options_of}
        for _ in range(args.repeats):
            for kind, options in options_of.items():
                runs[kind].append(start(ray, options, args.actors))
    finally:
        ray.shutdown()
    median = {k: {m: statistics.median(r[m] for r in rs) for m in ("wall_s", "cpu_s")} for k, rs in runs.items()}
    print(f"{args.actors} actors started at once on {cpu_info().describe()}; median of {args.repeats}")
    print(f"{'actors':>12} {'wall s':>7} {'CPU s':>7} {'CPU vs plain':>13}")
    for kind, m in median.items():
        print(f"{kind:>12} {m['wall_s']:7.2f} {m['cpu_s']:7.2f} {m['cpu_s'] / median['plain']['cpu_s']:12.2f}x")
    print(json.dumps({"actors": args.actors, "repeats": args.repeats, "median": median, "runs": runs}))


if __name__ == "__main__":
    main()
