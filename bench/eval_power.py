"""How well a run's held-out evaluation resolves its paired change, from finished runs' reports:
the per-problem change's variance split into the samples' noise and the problems' own spread
(``launch.study.stats.change_variance``), pooled over the runs, then the 95% half-width and the
chance of an interval above 0 at the runs' mean change for other splits of problems × samples
(``change_resolution``). Reads each run's ``report/summary.json``: no model runs. Prints a table;
the last line is one JSON object.

    rredcot bench eval_power RUN_DIR [RUN_DIR ...] [--splits 40x6,80x3,80x6]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rredcot.launch.study.stats import ChangeVariance, change_resolution, change_variance


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories with report/summary.json")
    p.add_argument("--splits", default="40x6,60x4,80x3,120x2,80x6,120x4", help="problems x samples, comma-separated")
    return p.parse_args()


def run_variance(run: Path) -> ChangeVariance:
    """The first and the last held-out evaluation of a finished run."""
    path = run / "report" / "summary.json"
    evaluations = json.loads(path.read_text()).get("evaluations") or []
    if len(evaluations) < 2:
        raise SystemExit(f"{path}: needs two held-out evaluations (data.eval_size > 0), has {len(evaluations)}")
    first, last = evaluations[0], evaluations[-1]
    return change_variance(first["sampled_per_problem"], last["sampled_per_problem"], first["samples_per_problem"])


def main() -> None:
    args = parse()
    runs = {str(r): run_variance(r) for r in args.runs}
    print("| run | change | variance per problem | of it the samples' noise | the problems' own |")
    print("|---|---:|---:|---:|---:|")
    for name, v in runs.items():
        print(f"| {name} | {v.change:+.3f} | {v.total:.4f} | {v.noise:.4f} | {v.problems:.4f} |")
    samples = {v.samples for v in runs.values()}
    if len(samples) > 1:
        raise SystemExit(f"the runs sampled {sorted(samples)} per problem: pool runs of one evaluation only")
    each = list(runs.values())
    pooled = ChangeVariance(
        change=float(np.mean([v.change for v in each])),
        total=float(np.mean([v.total for v in each])),
        noise=float(np.mean([v.noise for v in each])),
        samples=samples.pop(),
    )
    print(
        f"\npooled: change {pooled.change:+.3f}, variance {pooled.total:.4f}: noise {pooled.noise / pooled.total:.0%}\n"
    )
    print("| problems × samples | completions | 95% half-width | P(interval above 0) | P(5 of 5) |")
    print("|---|---:|---:|---:|---:|")
    table = []
    for split in args.splits.split(","):
        n, k = (int(x) for x in split.split("x"))
        half, above = change_resolution(pooled, n, k)
        table.append({"problems": n, "samples": k, "half_width": half, "p_above": above})
        print(f"| {n} × {k} | {n * k} | ±{half:.3f} | {above:.2f} | {above**5:.2f} |")
    print(json.dumps({"pooled": asdict(pooled) | {"problems": pooled.problems}, "splits": table}))


if __name__ == "__main__":
    main()
