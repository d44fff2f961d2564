"""The memory pre-check's estimate against a real run: ``launch.checks.memory.plan_memory`` of a
config, beside what ``rredcot train`` of that config holds.

Runs ``rredcot train CONFIG run.steps=STEPS`` and samples every second the machine's used memory
(MemTotal − MemAvailable, above what was used before the start), its shared memory (``/dev/shm``:
the weight versions) and the proportional set size (PSS: shared pages split between the processes
that map them) of every process the run starts. After the run each worker's pid is read from its
metrics; the rest (the driver, Ray's daemons, Redis) are the services. Prints per part the estimate
and the measured peak, then the totals; the last line is one JSON object. A model built on first use
is built inside the run, as a user's first run builds it.

    rredcot bench plan_memory [--config demo_cpu --steps 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

from rredcot.common.config import load_config
from rredcot.common.precision import cpu_info
from rredcot.launch.arguments import bounded_int
from rredcot.launch.checks import GIB
from rredcot.launch.checks.memory import plan_memory
from rredcot.models.shape import model_shape

# a worker's tier, as its metrics name it -> the plan's part
PARTS = {"generator": "generators", "redistributor": "redistributors", "learner": "learner", "evaluator": "evaluator"}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default="demo_cpu", help="a config name or YAML path")
    p.add_argument("--steps", type=bounded_int(1, 1000), default=4, help="training steps of the run")
    return p.parse_args()


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}


def sample(run: subprocess.Popen, peaks: dict[int, int]) -> tuple[int, int]:
    """The machine's used and shared memory now; each of the run's processes' PSS into ``peaks``."""
    for proc in [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]:
        try:
            peaks[proc.pid] = max(peaks.get(proc.pid, 0), proc.memory_full_info().pss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    m = meminfo()
    return m["MemTotal"] - m["MemAvailable"], m["Shmem"]


def worker_pids(metrics: Path) -> dict[int, str]:
    """pid -> the plan's part, from the run's metrics (a restarted worker's pids all count)."""
    parts = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if (pid := row["values"].get("pid")) and row["tier"] in PARTS:
            parts[int(pid)] = PARTS[row["tier"]]
    return parts


def main() -> None:
    args = parse()
    cfg = load_config(args.config)
    plan = plan_memory(cfg, model_shape(cfg.model.path))
    run_dir = Path(tempfile.mkdtemp(prefix="plan-memory-"))
    before = meminfo()
    command = [sys.executable, "-m", "rredcot.launch.cli", "train", args.config, f"run.steps={args.steps}"]
    command += [f"run.dir={run_dir}", "logging.progress=false"]
    peaks: dict[int, int] = {}
    used_peak = shm_peak = 0
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        while run.poll() is None:
            used, shm = sample(run, peaks)
            used_peak, shm_peak = max(used_peak, used), max(shm_peak, shm)
            time.sleep(1)
    if run.returncode:
        sys.exit(f"the run failed ({run.returncode}): {log.name}")
    owner = worker_pids(run_dir / "report" / "metrics.jsonl")
    measured: dict[str, int] = defaultdict(int)
    for pid, pss in peaks.items():  # a part's processes' peaks, summed (they need not coincide: errs high)
        measured[owner.get(pid, "services")] += pss
    measured["weight versions"] = shm_peak - before["Shmem"]
    used = used_peak - (before["MemTotal"] - before["MemAvailable"])
    print(f"{args.config}, {args.steps} steps, on {cpu_info().describe()}; GiB")
    print(f"{'part':>16} {'estimate':>9} {'peak':>7}")
    for part in sorted(plan.parts, key=lambda k: -plan.parts[k]):
        print(f"{part:>16} {plan.parts[part] / GIB:>9.2f} {measured.get(part, 0) / GIB:>7.2f}")
    print(f"{'total':>16} {plan.total / GIB:>9.2f} {used / GIB:>7.2f}  (the machine's used memory at its peak)")
    summary = {k: round(v / GIB, 3) for k, v in measured.items()}
    print(json.dumps({"config": args.config, "steps": args.steps, "cpu": cpu_info().describe(), "estimate_gib":
          round(plan.total / GIB, 3), "used_peak_gib": round(used / GIB, 3), "parts_peak_gib": summary}))  # fmt: skip


if __name__ == "__main__":
    main()
