"""A paired held-out change measured with independent draws and with the same draws, on a finished run.

Its start model (the run's ``model.path``) and its end (``report/final_model``) are each evaluated
``--repeats`` times both ways (``launch.evaluate.evaluate`` of the run's held-out problems):
independent, each problem's samples from the engine's own stream (the two models' engines seeded
apart), as an evaluator without ``logging.eval_same_draws``; the same, each problem's samples from
its own seed in both models' evaluations (common random numbers), a new seed set per repeat. Per way:
the paired change, its 95% half-width, the per-problem changes' variance and how many are exactly 0.
Prints a table; the last line is one JSON object.

    rredcot bench eval_draws RUN_DIR [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rredcot.actors.engine import Engine  # noqa: E402
from rredcot.common.config import load_config  # noqa: E402
from rredcot.common.precision import cpu_info  # noqa: E402
from rredcot.common.sampling import seed_of  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.evaluate import EvalResult, evaluate, evaluator_spec  # noqa: E402
from rredcot.launch.observe.intervals import paired_change  # noqa: E402
from rredcot.tasks.data import train_and_held_out  # noqa: E402
from rredcot.tasks.verifier import Verifier  # noqa: E402

WAYS = ("independent", "same")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a finished run's directory (config.yaml, report/final_model)")
    p.add_argument("--repeats", type=bounded_int(1, 100), default=2, help="evaluations per model and way")
    return p.parse_args()


def evaluations(run: Path, repeats: int) -> tuple[str, dict[str, list[tuple[EvalResult, EvalResult]]]]:
    """The CPU, and per way ``repeats`` (start, end) evaluations of the run's held-out problems."""
    cfg = load_config(run / "config.yaml", ["logging.eval_same_draws=true"])  # a seeded engine for both ways
    final = run / "report" / "final_model"
    if not (final / "config.json").exists():
        raise SystemExit(f"{final}: no final model (is {run} a finished run?)")
    start_spec = evaluator_spec(cfg)
    specs = (start_spec, replace(start_spec, model=str(final), seed=start_spec.seed + 1))
    results: dict[str, list[list[EvalResult]]] = {way: [[], []] for way in WAYS}
    with Verifier.from_config(cfg) as verifier:
        _, held = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)
        for model, spec in enumerate(specs):
            engine = Engine(spec)
            try:
                for r in range(repeats):
                    results["independent"][model].append(evaluate(engine, held, cfg, verifier))
                    draws = seed_of("bench eval_draws", r)
                    results["same"][model].append(evaluate(engine, held, cfg, verifier, draws=draws))
            finally:
                engine.close()
    return cpu_info().describe(), {way: list(zip(*pair)) for way, pair in results.items()}


def summary(pairs: list[tuple[EvalResult, EvalResult]]) -> dict[str, Any]:
    """Means over the repeats: the change, its half-width, the per-problem changes' variance, the
    share of problems whose accuracy did not move, and an evaluation's seconds; each repeat's
    (start, end) accuracies."""
    changes, halves, variances, unmoved = [], [], [], []
    for before, after in pairs:
        d, low, high = paired_change(before.sampled_per_problem, after.sampled_per_problem)
        per_problem = [a - b for b, a in zip(before.sampled_per_problem, after.sampled_per_problem)]
        changes.append(d)
        halves.append((high - low) / 2)
        variances.append(statistics.variance(per_problem))
        unmoved.append(sum(x == 0 for x in per_problem) / len(per_problem))
    return {
        "change": statistics.mean(changes),
        "change_sd": statistics.stdev(changes) if len(changes) > 1 else float("nan"),
        "half_width": statistics.mean(halves),
        "variance": statistics.mean(variances),
        "unmoved": statistics.mean(unmoved),
        "seconds": statistics.mean(r.seconds for pair in pairs for r in pair),
        "accuracies": [(before.sampled, after.sampled) for before, after in pairs],
    }


def main() -> None:
    args = parse()
    cpu, ways = evaluations(args.run, args.repeats)
    table = {way: summary(pairs) for way, pairs in ways.items()}
    print(f"{args.run} on {cpu}; {args.repeats} evaluation(s) of each model each way")
    print("| draws | change | its sd over repeats | 95% half-width | per-problem variance | unmoved | s/eval |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for way, s in table.items():
        print(
            f"| {way} | {s['change']:+.3f} | {s['change_sd']:.3f} | {s['half_width']:.3f} | {s['variance']:.4f} "
            f"| {s['unmoved']:.0%} | {s['seconds']:.1f} |"
        )
    ratio = table["same"]["half_width"] / table["independent"]["half_width"]
    print(f"\nthe same draws' half-width is {ratio:.2f}× the independent draws'")
    print(json.dumps({"run": str(args.run), "cpu": cpu, "repeats": args.repeats, "ways": table, "ratio": ratio}))


if __name__ == "__main__":
    main()
