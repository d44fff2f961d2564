"""Soak: a long real run of the pipeline, sampling every worker's memory and the streams' lengths.

Starts ``rredcot train CONFIG`` (more steps than it will reach), samples every ``--every`` seconds
the resident memory (RSS) of each worker (the pid in its metrics, with its children: the verifier;
and alone, ``<worker>.self``) and of the driver process, and the ``rollouts``/``batches`` stream
lengths; after ``--minutes`` it sends SIGTERM (the run checkpoints and writes its report). Prints
per worker the RSS slope (MiB per 10 minutes, least squares over the second half, after the
warm-up), the same slope of its per-minute minima (the floor, which transient peaks do not move), the
first/last RSS and the peak of each half (a worker whose RSS saws up and down with its batches, like
the learner, shows a trend in its peaks and floor, not in a slope), and the stream peaks against
``redis.maxlen`` (+ one entry per producer); goal: flat within noise, streams bounded. The last line
is one JSON object; the samples go to ``<run.dir>/soak.csv``. ``--heap-trace S`` has every worker
write the growth of its Python heap every S seconds to ``<run.dir>/logs/<worker>.heap.txt``.
``--no-ray`` runs the same workers without Ray: each stage as a plain process (``rredcot generate``,
``redistribute``, ``learn``) on an embedded Redis, with the environment its Ray actor would get; a
worker's trend with and without Ray tells whether its Ray actor's process adds to it.
``--memray FILE`` (with ``--no-ray``) runs the generator under memray's tracker with native stacks
(``pip install memray``), to attribute native memory that ``--heap-trace`` cannot see
(``bench/memray_growth.py FILE`` reads it).

    python -P bench/soak.py [--config demo_cpu --minutes 30 --every 10 --heap-trace 0 --no-ray --memray FILE]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TextIO

import numpy as np
import psutil
from omegaconf import DictConfig, OmegaConf

from rredcot.common.config import load_config, to_dict
from rredcot.common.control import RunControl
from rredcot.common.precision import cpu_info
from rredcot.common.streams import BATCHES, ROLLOUTS, connect, key
from rredcot.launch.arguments import bounded_float
from rredcot.launch.observe.heap_trace import ENV as HEAP_TRACE_ENV
from rredcot.launch.services import EmbeddedRedis
from rredcot.launch.stages import node_env, stage_env


def rss_mib(pid: int, children: bool = True) -> float | None:
    """RSS of ``pid`` (and its descendants) in MiB; None once it is gone."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)] if children else [proc]
        return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**20
    except psutil.NoSuchProcess:
        return None


def slope_mib_per_10min(t: list[float], rss: list[float]) -> float:
    """Least-squares slope of the second half of the samples, in MiB per 10 minutes."""
    half = len(t) // 2
    if len(t) - half < 3:
        return float("nan")
    return float(np.polyfit(np.asarray(t[half:]), np.asarray(rss[half:]), 1)[0] * 600)


def floor_slope_mib_per_10min(t: list[float], rss: list[float]) -> float:
    """Slope of the per-minute minima (second half), in MiB per 10 minutes: the memory a worker keeps
    between its transient peaks (a learner's batch, a generator's weight update), which the
    sampled slope mixes with whichever peaks the samples happened to catch."""
    lows: dict[int, float] = {}
    for ti, r in zip(t, rss):
        lows[int(ti // 60)] = min(r, lows.get(int(ti // 60), r))
    minutes = sorted(lows)
    return slope_mib_per_10min([60.0 * m for m in minutes], [lows[m] for m in minutes])


def start_train(
    config: str, overrides: list[str], run_dir: Path, env: dict[str, str], console: TextIO
) -> tuple[dict[str, subprocess.Popen[bytes]], DictConfig]:
    """``rredcot train``: the driver, its local Ray and its Ray actors; returns once its config is written."""
    cmd = [sys.executable, "-m", "rredcot.launch.cli", "train", config, *overrides]
    driver = subprocess.Popen(cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    while not (run_dir / "config.yaml").exists():
        if driver.poll() is not None:
            sys.exit(f"the run ended before it started: see {console.name}")
        time.sleep(1)
    return {"driver": driver}, OmegaConf.load(run_dir / "config.yaml")


def start_processes(
    config: str,
    overrides: list[str],
    run_dir: Path,
    env: dict[str, str],
    console: TextIO,
    memray: Path | None = None,
) -> tuple[dict[str, subprocess.Popen[bytes]], DictConfig]:
    """Each stage as a plain process (``rredcot generate|redistribute|learn``) on an embedded Redis,
    with the environment a Ray actor of its tier gets (``stage_env``): the same workers without Ray;
    with ``memray``, the generator runs under memray's native tracker, writing to that file."""
    server = EmbeddedRedis(run_dir / "redis").start()
    overrides = [*overrides, f"redis.url={server.url}"]
    cfg = load_config(config, overrides)
    rendezvous = ("127.0.0.1", uuid.uuid4().hex)
    procs = {}
    for command, tier in (("learn", "learner"), ("redistribute", "redistributor"), ("generate", "generator")):
        cmd = [sys.executable, "-m", "rredcot.launch.cli", command, config, *overrides]
        if memray is not None and tier == "generator":
            cmd[1:1] = ["-m", "memray", "run", "--native", "--force", "-o", str(memray)]
        stage = env | stage_env(cfg, tier, 0, rendezvous) | node_env()
        procs[tier] = subprocess.Popen(
            cmd, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=stage
        )
    return procs, OmegaConf.create(to_dict(cfg))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="demo_cpu")
    p.add_argument("--minutes", type=bounded_float(0, 10**5, lo_open=True), default=30.0)
    p.add_argument("--every", type=bounded_float(0, 86400, lo_open=True), default=10.0, help="seconds between samples")
    p.add_argument("--run-dir", default="runs/soak")
    p.add_argument(
        "--heap-trace",
        type=bounded_float(0, 604800),
        default=0.0,
        help="seconds between each worker's Python-heap snapshots (0: off)",
    )
    p.add_argument(
        "--no-ray",
        action="store_true",
        help="each stage as a plain process (rredcot generate/redistribute/learn) on an embedded Redis, not Ray actors",
    )
    p.add_argument("--memray", type=Path, help="with --no-ray: trace the generator's allocations into this file")
    args, overrides = p.parse_known_args()
    if args.memray and not args.no_ray:
        p.error("--memray traces a plain generator process: add --no-ray")
    if args.memray and importlib.util.find_spec("memray") is None:
        p.error("--memray needs memray in this environment: pip install memray")
    run_dir = Path(args.run_dir).resolve()
    overrides = [f"run.dir={run_dir}", "run.name=soak", "run.steps=100000", "data.eval_size=0", *overrides]
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    if args.heap_trace:  # each worker writes logs/<worker>.heap.txt (rredcot/launch/observe/heap_trace.py)
        env[HEAP_TRACE_ENV] = str(args.heap_trace)
    run_dir.mkdir(parents=True, exist_ok=True)
    console = (run_dir.parent / "soak-console.log").open("w")
    if args.no_ray:
        procs, cfg = start_processes(args.config, overrides, run_dir, env, console, args.memray)
    else:
        procs, cfg = start_train(args.config, overrides, run_dir, env, console)
    client = connect(cfg.redis.url)
    control = RunControl(client, cfg.run.name)
    t0 = time.monotonic()
    samples: list[dict[str, float]] = []
    while time.monotonic() - t0 < args.minutes * 60 and all(p.poll() is None for p in procs.values()):
        # the driver alone: the local Ray's daemons and workers are its descendants
        row = {"t": time.monotonic() - t0} | {
            name: rss_mib(p.pid, children=False) or 0.0 for name, p in procs.items() if name == "driver"
        }
        for worker, snap in control.all_metrics().items():
            if "pid" not in snap or snap.get("tier") == "driver":
                continue
            rss, own = rss_mib(int(snap["pid"])), rss_mib(int(snap["pid"]), children=False)
            if rss is not None and own is not None:
                row[worker], row[f"{worker}.self"] = rss, own  # with its children (the verifier), and alone
        row |= {f"queue_{s}": float(client.xlen(key(cfg.run.name, s))) for s in (ROLLOUTS, BATCHES)}
        row["step"] = float(control.all_metrics().get("learner0", {}).get("step", 0.0))
        samples.append(row)
        time.sleep(args.every)
    ended = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
    control.request_stop("soak over")
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
    names = sorted({k for row in samples for k in row} - {"t"})
    with (run_dir / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["t", *names])
        writer.writeheader()
        writer.writerows(samples)
    result: dict[str, object] = {"minutes": args.minutes, "samples": len(samples), "ray": not args.no_ray}
    result["ended_early"] = ended  # a process that exited before the soak's end, with its exit code
    header = ("first", "last", "peak 1st half", "peak 2nd half", "slope/10min", "floor slope/10min")
    print(f"{'MiB':<12} {header[0]:>7} {header[1]:>7} {header[2]:>14} {header[3]:>14} {header[4]:>12} {header[5]:>18}")
    for name in [n for n in names if not n.startswith("queue_") and n != "step"]:
        t = [r["t"] for r in samples if name in r]
        rss = [r[name] for r in samples if name in r]
        half = len(rss) // 2
        row = {"first": rss[0], "last": rss[-1], "peak_1st_half": max(rss[:half], default=rss[0])}
        row |= {"peak_2nd_half": max(rss[half:]), "slope_mib_per_10min": slope_mib_per_10min(t, rss)}
        row["floor_slope_mib_per_10min"] = floor_slope_mib_per_10min(t, rss)
        result[f"rss_{name}"] = row
        print(
            f"{name:<12} {row['first']:>7.0f} {row['last']:>7.0f} {row['peak_1st_half']:>14.0f} "
            f"{row['peak_2nd_half']:>14.0f} {row['slope_mib_per_10min']:>12.1f} "
            f"{row['floor_slope_mib_per_10min']:>18.1f}"
        )
    producers = {ROLLOUTS: cfg.cluster.generators, BATCHES: cfg.cluster.redistributors}
    for s, n in producers.items():
        peak = max((r[f"queue_{s}"] for r in samples), default=0.0)
        result[f"peak_{s}"] = peak
        print(f"stream {s:<8} peak {peak:.0f} entries (bound: maxlen {cfg.redis.maxlen} + {n} producer(s))")
    result["steps"] = max((r["step"] for r in samples), default=0.0)
    info = cpu_info()
    result["cpu"] = {"model": info.model, "flags": info.speed_flags()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
