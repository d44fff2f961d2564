"""Pipeline benchmark: async vs sync, rredcot vs grpo, learner idle time, weight-sync cost, and the
split advisor checked against a run.

``rredcot train`` runs of the same config in one process, on one local Ray and one Redis: sync
(η = 0, rredcot), async (η = ``--eta``, rredcot) and async grpo. Throughput is samples trained per
second of the learner's loop from its first batch to its last step: the wait for the first batch
(the tiers starting and the pipeline filling, about 10 s of an 18 s loop on the tiny model) is left
out, and from the learner's idle share too (``steady_idle_frac``). The overlap bound
comes from the sync run's per-tier busy times and CPU seconds: (t_gen + t_red + t_learn) ÷
max(t_gen, t_red, t_learn, CPU-seconds ÷ cores) — the most any overlap can give on this machine and
plan. Under overlap the tiers share the cores, so their busy seconds grow (``contention``: Σ async ÷
Σ sync busy seconds); the same bound taken at the async run's busy seconds says how much of the gap
is that sharing and how much is scheduling (``async_vs_bound_at_async_busy``).
``pause_vs_step``: the generators' seconds per weight update over the learner's seconds per
step. ``filtered_fraction``: of the groups the async run's generators finished, the share dynamic
sampling dropped (all rewards equal; 0 when ``generation.drop_uniform_groups`` is off). With
``--total N``: ``rredcot advise`` takes the async run's rates and proposes a split of N workers, its
workers sharing this machine's cores (so on a tie, such as the core budget binding every split, it
keeps the default); it runs beside the default split, N − 2 generators, one redistributor and one
learner, each worker one CPU (``advised_vs_default``; 1.0 without a run when the advice is the
default). ``--repeat R`` runs the three R times, interleaved, and reports each ratio's median with
its range over the rounds (``<ratio>_range``): on a model this small two runs of the same command
differ by tens of percent. ``--keep DIR`` keeps the run folders, so ``rredcot report DIR/<config>/<run>``
redraws each run's timeline. Last line: one JSON object.

    python bench/pipeline.py [--config tests,demo_cpu] [--steps 8] [--eta 2] [--total 4] [--repeat 3]
                             [--keep DIR] [key=value ...]

``--config`` takes several configs (the tiny model's ``tests`` and the 135M demo's ``demo_cpu``):
each gets its runs and its table, one after the other, and the JSON line holds them all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rredcot.common.config import load_config
from rredcot.common.control import RunControl
from rredcot.common.streams import connect
from rredcot.launch.arguments import bounded_int
from rredcot.launch.driver import train
from rredcot.launch.observe.advise import TIERS, Split, advise, predict, run_rates
from rredcot.launch.services import EmbeddedRedis

# the tier busy time each worker reports (seconds spent doing its own work)
BUSY = {"generator": "generate_s", "redistributor": "busy_s", "learner": "busy_s"}


def run(config: str, overrides: list[str], url: str, name: str, root: str) -> dict[str, Any]:
    cfg = load_config(
        config,
        [
            *overrides,
            f"run.name={name}",
            f"run.dir={root}/{name}",
            f"redis.url={url}",
            "logging.progress=false",
            "data.eval_size=0",
        ],
    )
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    snaps = RunControl(connect(url), name).all_metrics()
    tiers: dict[str, dict[str, float]] = {}
    for values in snaps.values():
        t = tiers.setdefault(str(values["tier"]), {"busy_s": 0.0, "cpu_s": 0.0})
        t["busy_s"] += float(values.get(BUSY[str(values["tier"])], 0.0))
        t["cpu_s"] += float(values.get("cpu_s", 0.0))
    ranks = [v for v in snaps.values() if v["tier"] == "learner"]  # rank 0 first (sorted names)
    learner = ranks[0]
    gens = [v for v in snaps.values() if v["tier"] == "generator"]
    updates = sum(float(v.get("weight_updates", 0.0)) for v in gens)
    loop_s = max(float(r["busy_s"]) + float(r["wait_s"]) - float(r["fill_wait_s"]) for r in ranks)
    dropped = sum(float(v.get("dropped_uniform", 0.0)) for v in gens)
    published = sum(float(v.get("finished_groups", 0.0)) for v in gens)
    return {
        "wall_s": wall,
        "loop_s": loop_s,
        # each rank counts its own share of a batch: the ranks' sum is what the learner trained
        "samples_per_s": sum(float(r["samples_consumed"]) for r in ranks) / loop_s,
        "idle_frac": sum(float(r["steady_idle_frac"]) for r in ranks) / len(ranks),
        "step_s": float(learner["busy_s"]) / max(float(learner["step"]), 1.0),
        "broadcast_s": float(learner["broadcast_s_total"]) / max(float(learner["version"]), 1.0),
        "tiers": tiers,
        "pause_s": sum(float(v.get("weight_update_s", 0.0)) for v in gens) / max(updates, 1.0),
        # groups dynamic sampling dropped (all rewards equal) of all the generators finished
        "filtered_frac": dropped / max(dropped + published, 1.0),
    }


def overlap_bound(sync: dict[str, Any], cores: int, at: dict[str, Any] | None = None) -> float:
    """Σ of the sync run's tier busy seconds over the longest tier (or CPU-seconds ÷ cores) of
    ``at``'s (default: the sync run itself): the most overlap can give at ``at``'s busy seconds."""
    at = at or sync
    busy = [t["busy_s"] for t in at["tiers"].values()]
    cpu = sum(t["cpu_s"] for t in at["tiers"].values())
    return busy_total(sync) / max(*busy, cpu / cores)


def busy_total(r: dict[str, Any]) -> float:
    return sum(t["busy_s"] for t in r["tiers"].values())


def with_split(split: Split) -> list[str]:
    """The split's worker counts, one CPU each: N workers are N CPUs, whatever the config gives a tier."""
    return [
        f"cluster.generators={split.generator}",
        f"cluster.redistributors={split.redistributor}",
        f"cluster.learner_ranks={split.learner}",
        *(f"cluster.cpus_per_{tier}=1" for tier in TIERS),
    ]


def advised(args: argparse.Namespace, config: str, base: list[str], url: str, root: str, source: str) -> dict[str, Any]:
    """The advisor's split of ``--total`` workers from the rates of the async run ``source``, run beside the default."""
    rates, _, _, _ = run_rates(Path(root) / source, cores=os.cpu_count() or 1)
    default = Split(args.total - 2, 1, 1)
    best = advise(args.total, rates, scorer=True, keep=default)[0]
    out: dict[str, Any] = {"advised_split": str(best.split), "default_split": str(default)}
    out["advised_predicted_vs_default"] = best.samples_per_s / predict(default, rates).samples_per_s
    if best.split == default:
        return out | {"advised_vs_default": 1.0}
    eta = f"staleness.eta={args.eta}"
    runs = {
        name: run(config, [*base, eta, "credit.method=rredcot", *with_split(split)], url, f"{config}-{name}", root)
        for name, split in (("default", default), ("advised", best.split))
    }
    return out | {
        "advised_vs_default": runs["advised"]["samples_per_s"] / runs["default"]["samples_per_s"],
        "learner_idle_fraction_advised": runs["advised"]["idle_frac"],
    }


def bench_round(args: argparse.Namespace, config: str, base: list[str], url: str, root: str, tag: str) -> dict:
    """One sync, async and async-grpo run of ``config``: its ratios and its table."""
    cores = os.cpu_count() or 1
    sync = run(config, [*base, "staleness.eta=0", "credit.method=rredcot"], url, f"{config}-sync{tag}", root)
    async_ = run(
        config, [*base, f"staleness.eta={args.eta}", "credit.method=rredcot"], url, f"{config}-async{tag}", root
    )
    grpo = run(config, [*base, f"staleness.eta={args.eta}", "credit.method=grpo"], url, f"{config}-grpo{tag}", root)
    bound_async = overlap_bound(sync, cores, at=async_)
    ratios = {
        "async_vs_sync": async_["samples_per_s"] / sync["samples_per_s"],
        "overlap_bound": overlap_bound(sync, cores),
        "contention": busy_total(async_) / busy_total(sync),
        "overlap_bound_at_async_busy": bound_async,
        "async_vs_bound_at_async_busy": async_["samples_per_s"] / sync["samples_per_s"] / bound_async,
        "rredcot_vs_grpo": async_["samples_per_s"] / grpo["samples_per_s"],
        "learner_idle_fraction": async_["idle_frac"],
        "sync_vs_step": async_["broadcast_s"] / async_["step_s"],
        "pause_vs_step": async_["pause_s"] / async_["step_s"],
        "filtered_fraction": async_["filtered_frac"],
    }
    print(f"\n{config}{tag}")
    print(f"{'run':<8}{'samples/s':>11}{'loop s':>9}{'idle':>7}{'step s':>8}  tier busy s (gen / red / learn)")
    for label, r in (("sync", sync), ("async", async_), ("grpo", grpo)):
        busy = " / ".join(f"{r['tiers'][t]['busy_s']:.1f}" for t in ("generator", "redistributor", "learner"))
        print(
            f"{label:<8}{r['samples_per_s']:>11.2f}{r['loop_s']:>9.1f}{r['idle_frac']:>7.0%}{r['step_s']:>8.2f}  {busy}"
        )
    return ratios


def median_and_range(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Each ratio's median over the rounds, and its [min, max] as ``<ratio>_range`` when there are several."""
    out: dict[str, Any] = {}
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        out[name] = statistics.median(values)
        if len(values) > 1:
            out[f"{name}_range"] = [min(values), max(values)]
    return out


def bench_config(args: argparse.Namespace, config: str, url: str, root: str) -> dict[str, Any]:
    """``--repeat`` rounds of sync, async and async-grpo runs of ``config`` (and the advisor's check)."""
    base = [f"run.steps={args.steps}", "learner.skip_zero_advantage=false", *args.overrides]
    root = f"{root}/{config}"
    tags = [f"-r{i}" if args.repeat > 1 else "" for i in range(1, args.repeat + 1)]
    rounds = [bench_round(args, config, base, url, root, tag) for tag in tags]
    result = {"config": config, "steps": args.steps, "eta": args.eta, "cores": os.cpu_count() or 1}
    result |= median_and_range(rounds)
    result |= advised(args, config, base, url, root, f"{config}-async{tags[-1]}") if args.total else {}

    def shown(name: str, digits: int = 2) -> str:
        lo_hi = result.get(f"{name}_range")
        return f"{result[name]:.{digits}f}" + (f" [{lo_hi[0]:.{digits}f}, {lo_hi[1]:.{digits}f}]" if lo_hi else "")

    print(f"\n{config}: " + (f"median [range] of {args.repeat} rounds" if args.repeat > 1 else "one round"))
    print(
        f"async/sync {shown('async_vs_sync')} (overlap bound {shown('overlap_bound')}, goal >= 0.85 x bound); "
        f"rredcot/grpo {shown('rredcot_vs_grpo')}; weight sync / step {shown('sync_vs_step', 3)}; "
        f"generation pause per update / step {shown('pause_vs_step', 3)}; "
        f"learner idle {shown('learner_idle_fraction')}; "
        f"groups filtered (all rewards equal) {shown('filtered_fraction')}"
    )
    print(
        f"contention: the tiers' busy seconds x{shown('contention')} under overlap; the bound at "
        f"those seconds {shown('overlap_bound_at_async_busy')}, reached {shown('async_vs_bound_at_async_busy')}"
    )
    if args.total:
        print(
            f"advisor, {args.total} workers: {result['advised_split']} (predicted "
            f"{result['advised_predicted_vs_default']:.2f}x the default {result['default_split']}); "
            f"measured {result['advised_vs_default']:.2f}x"
        )
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--config", default="tests", help="configs to compare, comma-separated (tests,demo_cpu: both models)"
    )
    ap.add_argument("--steps", type=bounded_int(1, 10**6), default=8)
    ap.add_argument("--eta", type=bounded_int(0, 10**6), default=2)
    ap.add_argument(
        "--total", type=bounded_int(0, 10**5), default=0, help="workers to split with the advisor (0: no advisor check)"
    )
    ap.add_argument(
        "--repeat", type=bounded_int(1, 10**4), default=1, help="rounds of the three runs (ratios: median and range)"
    )
    ap.add_argument("--keep", help="a folder to keep the run folders in (default: a temporary one)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        root = args.keep or stack.enter_context(tempfile.TemporaryDirectory())
        server = stack.enter_context(EmbeddedRedis(f"{root}/redis", appendonly=False))
        results = [bench_config(args, config, server.url, root) for config in args.config.split(",")]
    rounded = [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in results]
    print(json.dumps(rounded[0] if len(rounded) == 1 else {"configs": rounded}))


if __name__ == "__main__":
    main()
