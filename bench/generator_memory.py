"""Generator RSS over many rounds: does it grow, and is it generation, weight updates or the allocator?

The soak (``bench/soak.py``) saw the demo generator's own process (vLLM engine in-process) creep by
about 80 MiB per 10 minutes. This runs the generator's engine of a config alone (no Redis, no
verifier) in rounds shaped like the config's steps: ``prompts_per_step`` groups of ``group_size``
completions on the task's prompts, then, in modes ``update`` and ``update+trim``, one weight update
the way the file transport applies one (the safetensors file read into bytes, then
``transports.file.apply_bytes``); ``update+trim`` also hands the C heap's free pages back to the OS
(glibc ``malloc_trim(0)``) after each round. Each mode runs in a fresh process, same prompts and
seed. ``continuous`` runs the engine as the generator's loop does: ``(staleness.eta + 1) ×
prompts_per_step`` groups in flight (at most ``max_in_flight_groups``), a new group submitted as
each finishes, so prefills and decodes of every length share the engine's batches; a round is
``prompts_per_step`` finished groups, then a weight update and a trim (a learner step's cadence).
``continuous+arena2`` is the same with glibc limited to two malloc arenas (``MALLOC_ARENA_MAX=2``);
``continuous+cache0`` and ``continuous+cache1024`` with oneDNN's primitive cache at 0 and at oneDNN's
default of 1,024 primitives, instead of the engine's 128 (``common.onednn.PRIMITIVE_CACHE``).
After every round: RSS, and the number of Python objects the garbage collector tracks (a growth
there is a Python-level leak; RSS growth without it is native memory or the allocator). Prints a
table; the last line is one JSON object.

Usage: python -P bench/generator_memory.py [--config demo_cpu --rounds 150 --modes generate update update+trim]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bench.trend

from bench.trend import MIB, child_rows, print_results, slope  # noqa: E402
from rredcot.common.onednn import PRIMITIVE_CACHE_ENV as CACHE  # noqa: E402
from rredcot.transports.file import apply_bytes

CHILD_ENV = {  # read by glibc / oneDNN when the child starts
    "continuous+arena2": {"MALLOC_ARENA_MAX": "2"},
    "continuous+cache0": {CACHE: "0"},  # no oneDNN primitive kept beyond vLLM's own 32 per weight shape
    "continuous+cache1024": {CACHE: "1024"},  # oneDNN's default, which the engine lowers to 128
}
MODES = ["generate", "update", "update+trim", "continuous", *CHILD_ENV]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="demo_cpu")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--modes", nargs="+", default=MODES, choices=MODES)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    return p.parse_args()


def weights_file(model_path: str, dtype: str, root: Path) -> Path:
    """The model's parameters as the learner publishes them: one safetensors file (HF names)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=getattr(torch, dtype))
    path = root / "weights.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.named_parameters()}, str(path))
    return path


def child(config: str, rounds: int, mode: str) -> None:
    """One mode in this process: a JSON line per round."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rredcot.actors.engine import Engine, EngineSpec, Sampling
    from rredcot.common.config import load_config
    from rredcot.common.heap import trim_heap
    from rredcot.tasks.data import ProblemOrder, train_and_held_out
    from rredcot.tasks.prompts import prompt_ids
    from rredcot.tasks.task import build_task

    cfg = load_config(config, [])
    spec = EngineSpec.from_config(cfg)
    engine = Engine(spec)
    task = build_task(cfg.task)
    order = ProblemOrder(train_and_held_out(task, cfg.data, cfg.run.seed)[0], cfg.data.shuffle_seed)
    g = cfg.generation
    sampling = Sampling(
        n=g.group_size, temperature=g.temperature, top_p=g.top_p, max_tokens=g.max_tokens, stop=tuple(g.stop)
    )
    proc = psutil.Process()
    submitted = 0

    def prompt(i: int) -> list[int]:
        return prompt_ids(order.at(i), task, cfg.data, engine.tokenizer)

    def submit() -> None:
        nonlocal submitted
        engine.submit(f"q{submitted}", prompt(submitted), sampling)
        submitted += 1

    with tempfile.TemporaryDirectory() as tmp:
        weights = weights_file(spec.model, spec.dtype, Path(tmp)) if mode != "generate" else None
        for r in range(rounds):
            t0 = time.perf_counter()
            if mode.startswith("continuous"):  # the generator loop's shape: refill as groups finish
                in_flight = min((cfg.staleness.eta + 1) * g.prompts_per_step, g.max_in_flight_groups)
                finished = 0
                while finished < g.prompts_per_step:
                    while engine.num_unfinished < in_flight:
                        submit()
                    finished += len(engine.step())
            else:
                prompts = [prompt(r * g.prompts_per_step + i) for i in range(g.prompts_per_step)]
                engine.generate(prompts, sampling, prefix=f"r{r}")
            if weights is not None:
                apply_bytes(engine, weights.read_bytes(), version=r + 1)
            if mode == "update+trim" or mode.startswith("continuous"):
                trim_heap()
            row = {"round": r, "rss": proc.memory_info().rss / MIB, "objects": len(gc.get_objects())}
            print(json.dumps(row | {"s": time.perf_counter() - t0}), flush=True)
    engine.close()


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """First/last RSS and objects, and their trends over the second half (per 100 rounds)."""
    half = rows[len(rows) // 2 :]
    return {
        "rss_first": rows[0]["rss"],
        "rss_last": rows[-1]["rss"],
        "rss_slope_2nd_half_per_100_rounds": 100 * slope([r["rss"] for r in half]),
        "objects_first": rows[0]["objects"],
        "objects_last": rows[-1]["objects"],
        "objects_slope_2nd_half_per_100_rounds": 100 * slope([r["objects"] for r in half]),
        "s_per_round": float(np.median([r["s"] for r in rows[1:]])),
    }


def main() -> None:
    args = parse()
    if args.child:
        child(args.config, args.rounds, args.child)
        return
    from rredcot.common.precision import cpu_info

    print(f"# {args.config}, {args.rounds} rounds per mode; CPU: {cpu_info().describe()}", flush=True)
    results = {}
    for mode in args.modes:
        cmd = [sys.executable, "-P", __file__, "--config", args.config, "--rounds", str(args.rounds), "--child", mode]
        results[mode] = summary(child_rows(cmd, os.environ | CHILD_ENV.get(mode, {})))
        print(f"# {mode} done", flush=True)
    print_results(results)


if __name__ == "__main__":
    main()
