"""Worker start-up benchmark: a generator's start with Python's cyclic collector on, as before, and
under ``common.startup_gc.collector_off``, as ``launch.stages.StageWorker`` starts one now.

Each start is a fresh process that does what a generator's actor does before its first batch:
import torch and rredcot's config, then build the config's vLLM engine (``actors.engine.Engine``,
which imports vLLM). ``on``: vLLM imported first with the collector on, so the engine finds it loaded
and freezes nothing (the old start). ``off``: the imports, then the engine, each under
``collector_off``. The two kinds alternate, ``--repeats`` times. Reported: the process's CPU seconds
(its own, from ``getrusage``) and the full collections it ran. Prints a table; the last line is one
JSON object.

    rredcot bench startup_gc [--config tests] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys

from rredcot.launch.arguments import bounded_int

KINDS = ("on", "off")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default="tests", help="a config name or YAML path (its model and KV cache)")
    p.add_argument("--repeats", type=bounded_int(1, 50), default=3, help="starts of each kind")
    p.add_argument("--start", choices=KINDS, help=argparse.SUPPRESS)  # one start, in this process
    return p.parse_args()


def start(config: str, kind: str) -> dict[str, float]:
    """One generator's start in this process; its CPU seconds and full collections."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from rredcot.common.startup_gc import collector_off

    phase = collector_off if kind == "off" else contextlib.nullcontext
    with phase():
        import torch  # noqa: F401 - what start_worker_process imports

        from rredcot.actors.engine import Engine, EngineSpec
        from rredcot.common.config import load_config

        cfg = load_config(config)
        if kind == "on":
            import vllm.entrypoints.llm  # noqa: F401 - loaded with the collector on: the engine freezes nothing
    with phase():
        engine = Engine(EngineSpec.from_config(cfg))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    engine.close()
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "full_collections": gc.get_stats()[2]["collections"]}


def main() -> None:
    args = parse()
    if args.start:
        print(json.dumps(start(args.config, args.start)))
        return
    from rredcot.common.config import load_config
    from rredcot.common.precision import cpu_info
    from rredcot.models.store import resolve_model_path

    cfg = load_config(args.config)
    resolve_model_path(cfg.model.path, seed=cfg.run.seed)  # a builtin model built here, not in a timed start
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            command = [sys.executable, __file__, "--config", args.config, "--start", kind]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"a generator's start ({args.config}) on {cpu_info().describe()}; median of {args.repeats}")
    print(f"{'collector':>10} {'CPU s':>7} {'full collections':>17} {'vs on':>7}")
    median = {kind: statistics.median(r["cpu_s"] for r in rs) for kind, rs in runs.items()}
    for kind, rs in runs.items():
        full = statistics.median(r["full_collections"] for r in rs)
        print(f"{kind:>10} {median[kind]:>7.2f} {full:>17.0f} {median['on'] / median[kind]:>6.2f}×")
    print(json.dumps({"config": args.config, "cpu": cpu_info().describe(), "runs": runs}))


if __name__ == "__main__":
    main()
