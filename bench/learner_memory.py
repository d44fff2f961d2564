"""Learner RSS over many steps: does it grow, and is it the data or the allocator?

The soak (``bench/soak.py``) saw the demo learner's RSS saw between 3 and 7 GiB and its peaks rise.
This runs the learner of a config (its model, ``learner`` settings and dtype) alone on the same
random batches, shaped like the config's steps (``prompts_per_step`` × ``group_size`` samples,
completions of 1 to ``max_tokens`` tokens), once per mode, each in a fresh process:
``plain``, and ``trim``, which hands the C heap's free pages back to the OS after every step
(glibc ``malloc_trim(0)``). A thread samples RSS every 20 ms: per step its peak, and the RSS after
it. Same seed in every mode, so a difference between modes is the allocator's, not the data's.
``trim+cache1024`` is ``trim`` with oneDNN's primitive cache at its default of 1,024 primitives
instead of the engine's 128 (``common.onednn``): a CPU's bf16 matmuls keep one per sequence length.
``mmap1m`` trims nothing but fixes glibc's mmap threshold at 1 MiB (by default it rises to 32 MiB
as large blocks are freed, and such blocks then stay in the heap): every tensor of 1 MiB or more is
its own mapping, returned to the OS when freed, at the price of fresh zeroed pages on each allocation.
``--batch fixed`` trains the first step's batch at every step: then a rising peak cannot be the data.
Prints a table; the last line is one JSON object.

Usage: python -P bench/learner_memory.py [--config demo_cpu --steps 20 --modes plain trim mmap1m --batch random]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bench.trend, tests.learner_samples

from bench.trend import RssPeak, child_rows, print_results, slope  # noqa: E402
from rredcot.common.onednn import PRIMITIVE_CACHE_ENV  # noqa: E402

CHILD_ENV = {
    "trim+cache1024": {PRIMITIVE_CACHE_ENV: "1024"},  # read by oneDNN at its first primitive
    "mmap1m": {"MALLOC_MMAP_THRESHOLD_": str(2**20)},  # glibc: blocks of 1 MiB or more mmap'd, unmapped when freed
}
MODES = ["plain", "trim", *CHILD_ENV]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="demo_cpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    p.add_argument("--batch", default="random", choices=["random", "fixed"], help="new batch per step, or one")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    return p.parse_args()


def child(config: str, steps: int, mode: str, batch: str) -> None:
    """One mode in this process: a JSON line per step."""
    from rredcot.common.config import load_config
    from rredcot.common.heap import trim_heap
    from rredcot.learner.engine import LearnerEngine, load_policy
    from rredcot.models.store import resolve_model_path
    from tests.learner_samples import random_samples

    cfg = load_config(config, [])
    torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_learner)))
    engine = LearnerEngine(load_policy(resolve_model_path(cfg.model.path, seed=cfg.run.seed), cfg.learner), cfg.learner)
    g = cfg.generation
    rng = np.random.default_rng(0)
    rss = RssPeak()
    for step in range(steps):
        if batch == "random" or step == 0:
            lengths = [int(x) for x in rng.integers(1, g.max_tokens + 1, g.prompts_per_step * g.group_size)]
            samples = random_samples(len(lengths), seed=step, lengths=lengths, prompt=120)
        t0 = time.perf_counter()
        engine.train_step(samples)
        if mode.startswith("trim"):
            trim_heap()
        peak, after = rss.take()
        row = {"step": step, "peak": peak, "after": after, "s": time.perf_counter() - t0, "tokens": sum(lengths)}
        print(json.dumps(row), flush=True)


def main() -> None:
    args = parse()
    if args.child:
        child(args.config, args.steps, args.child, args.batch)
        return
    from rredcot.common.precision import cpu_info

    print(
        f"# {args.config}, {args.steps} steps per mode, {args.batch} batches; CPU: {cpu_info().describe()}", flush=True
    )
    results = {}
    for mode in args.modes:
        cmd = [sys.executable, "-P", __file__, "--config", args.config, "--steps", str(args.steps)]
        cmd += ["--batch", args.batch, "--child", mode]
        rows = child_rows(cmd, os.environ | CHILD_ENV.get(mode, {}))
        half = len(rows) // 2
        results[mode] = {
            "after_first": rows[0]["after"],
            "after_last": rows[-1]["after"],
            "peak_1st_half": max(r["peak"] for r in rows[:half]),
            "peak_2nd_half": max(r["peak"] for r in rows[half:]),
            "after_slope_2nd_half_per_10_steps": 10 * slope([r["after"] for r in rows[half:]]),
            "peak_slope_2nd_half_per_10_steps": 10 * slope([r["peak"] for r in rows[half:]]),
            "s_per_step": float(np.median([r["s"] for r in rows[1:]])),
        }
        print(f"# {mode} done", flush=True)
    print_results(results)


if __name__ == "__main__":
    main()
