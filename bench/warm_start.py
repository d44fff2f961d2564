"""Warm-start benchmark: how often a config's policy is right on its first training problems, and how
many of its groups are mixed (a group whose samples are all right or all wrong carries no credit).

For each config: the policy as ``model.path`` resolves it (a builtin is built, or rebuilt when its
recipe changed), ``generation.group_size`` samples at the config's temperature and one greedy
completion per problem, scored by the run's verifier. Last line: one JSON object.

    rredcot bench warm_start [--configs study_cpu tests] [--problems 32]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rredcot.actors.engine import Engine, EngineSpec  # noqa: E402
from rredcot.common.config import load_config  # noqa: E402
from rredcot.common.precision import cpu_info, resolve_dtype  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.evaluate import evaluate  # noqa: E402
from rredcot.tasks.data import train_and_held_out  # noqa: E402
from rredcot.tasks.verifier import Verifier  # noqa: E402


def measure(config: str, problems: int) -> dict[str, object]:
    cfg = load_config(config)
    engine = Engine(EngineSpec.from_config(cfg))
    verifier = Verifier.from_config(cfg)
    try:
        train, _ = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)
        res = evaluate(engine, train[:problems], cfg, verifier)
    finally:
        verifier.close()
        engine.close()
    per_problem = res.sampled_per_problem
    return {
        "config": config,
        "model": cfg.model.path,
        "dtype": resolve_dtype(cfg.model.dtype).dtype,
        "problems": len(per_problem),
        "samples": cfg.generation.group_size,
        "sampled": res.sampled,
        "greedy": res.greedy,
        "mixed": sum(0 < a < 1 for a in per_problem),
        "seconds": res.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["study_cpu", "tests"])
    parser.add_argument("--problems", type=bounded_int(1, 10**6), default=32)
    args = parser.parse_args()
    rows = [measure(c, args.problems) for c in args.configs]
    print(f"CPU: {cpu_info().describe()}")
    print(f"{'config':<12} {'model':<22} {'dtype':<9} {'sampled':>8} {'greedy':>7} {'mixed groups':>13} {'s':>5}")
    for r in rows:
        mixed = f"{r['mixed']} of {r['problems']}"
        print(
            f"{r['config']:<12} {r['model']:<22} {r['dtype']:<9} {r['sampled']:>8.3f} {r['greedy']:>7.3f} "
            f"{mixed:>13} {r['seconds']:>5.0f}"
        )
    print(json.dumps({"cpu": cpu_info().describe(), "rows": rows}))


if __name__ == "__main__":
    main()
