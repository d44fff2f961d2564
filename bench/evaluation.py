"""Held-out evaluation benchmark: one evaluation of a config's model at several evaluator KV-cache sizes.

The evaluator's engine (``launch.evaluate.evaluator_spec``: the run's model, dtype and seed) with
``logging.eval_kv_cache_bytes`` set to each size in turn, then ``launch.evaluate.evaluate`` of the
config's held-out problems (``data.eval_size`` × (``generation.group_size`` sampled + 1 greedy)
completions asked at once), ``--repeats`` times per size, the sizes interleaved. A bigger cache holds
more of the completions at once: fewer, wider decoding steps. The accuracies differ between sizes
only by sampling noise (the batch decides which random numbers each completion draws). Prints a
table; the last line is one JSON object.

    rredcot bench evaluation [--config demo_cpu] [--kv-mib 256 1024] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rredcot.actors.engine import Engine  # noqa: E402
from rredcot.common.config import load_config  # noqa: E402
from rredcot.common.precision import cpu_info, resolve_dtype  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.evaluate import evaluate, evaluator_spec  # noqa: E402
from rredcot.tasks.data import train_and_held_out  # noqa: E402
from rredcot.tasks.verifier import Verifier  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default="demo_cpu", help="a config name or YAML path (its model, task and sizes)")
    p.add_argument("--kv-mib", type=bounded_int(1, 2**20), nargs="+", default=[256, 1024], help="KV sizes (MiB)")
    p.add_argument("--repeats", type=bounded_int(1, 100), default=1, help="evaluations per size")
    return p.parse_args()


def main() -> None:
    args = parse()
    runs: dict[int, list[dict]] = {mib: [] for mib in args.kv_mib}
    for _ in range(args.repeats):
        for mib in args.kv_mib:
            cfg = load_config(args.config, [f"logging.eval_kv_cache_bytes={mib * 2**20}"])
            engine = Engine(evaluator_spec(cfg))
            with Verifier.from_config(cfg) as verifier:
                _, held = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)
                start = time.perf_counter()
                result = evaluate(engine, held, cfg, verifier)
                seconds = time.perf_counter() - start
            engine.close()
            completions = result.problems * (result.samples_per_problem + 1)
            runs[mib].append({"seconds": seconds, "completions": completions, "sampled": result.sampled})
    best = {mib: min(r["seconds"] for r in rs) for mib, rs in runs.items()}
    first = best[args.kv_mib[0]]
    dtype = resolve_dtype(cfg.model.dtype)
    cpu = cpu_info().describe()
    print(f"{args.config} on {cpu}: {dtype.dtype} ({dtype.reason}); best of {args.repeats}")
    print(f"{'KV MiB':>8} {'seconds':>8} {'completions/s':>14} {'sampled':>8} {'vs first':>9}")
    for mib, rs in runs.items():
        r = min(rs, key=lambda r: r["seconds"])
        rate = r["completions"] / r["seconds"]
        print(f"{mib:>8} {r['seconds']:>8.1f} {rate:>14.2f} {r['sampled']:>8.3f} {first / best[mib]:>8.2f}×")
    measured = {str(mib): rs for mib, rs in runs.items()}
    print(json.dumps({"config": args.config, "cpu": cpu, "dtype": dtype.dtype, "runs": measured}))


if __name__ == "__main__":
    main()
