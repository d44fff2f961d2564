"""Learner benchmark: packed vs padded throughput (padded in the order samples came, and padded after
sorting by length), weight broadcast vs step time, ZeRO-2 vs ZeRO-3,
shared-prompt vs packed on GRPO-shaped groups (G samples behind one long prompt), and the weight
transports on this small model (file, collective and ipc: time the training thread is blocked,
time until a receiver holds the weights; at the demo model's size: bench/weight_transports.py).

One process, real DeepSpeed (gloo on CPU), a random Qwen3-shaped model whose decoder-to-LM-head
cost ratio is a real LLM's, and a mixed-length batch (completion lengths log-uniform in
[--min-len, --max-len], in random order). Prints a table; the last line is one
JSON object. Usage: python bench/learner.py [--samples 24 --max-len 1024 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rredcot.common.config import LearnerConfig
from rredcot.launch.arguments import bounded_int
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.packing import micro_batches

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.learner_samples
from bench.weight_transports import TRANSPORTS, delivery_times  # noqa: E402
from tests.learner_samples import random_samples, tiny_lm  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=bounded_int(1, 10**6), default=24)
    p.add_argument("--min-len", type=bounded_int(1, 10**7), default=16)
    p.add_argument("--max-len", type=bounded_int(1, 10**7), default=1024)
    p.add_argument("--budget", type=bounded_int(16, 10**9), default=2048, help="learner.micro_token_budget")
    # default shape: decoder FLOPs per token ≈ 5.4 × the LM head's, as in Qwen2.5-1.5B (≈ 5.6)
    p.add_argument("--hidden", type=bounded_int(1, 10**6), default=256)
    p.add_argument("--layers", type=bounded_int(1, 10**4), default=6)
    p.add_argument("--vocab", type=bounded_int(1, 10**7), default=2560)
    p.add_argument(
        "--steps", type=bounded_int(1, 10**6), default=5, help="timed steps per configuration (after 1 warm-up)"
    )
    p.add_argument("--groups", type=bounded_int(1, 10**6), default=8, help="GRPO-shaped batch: prompts")
    p.add_argument("--group-size", type=bounded_int(1, 10**4), default=8, help="GRPO-shaped batch: samples per prompt")
    p.add_argument("--prompt-len", type=bounded_int(1, 10**7), default=120)
    p.add_argument("--completion-len", type=bounded_int(1, 10**7), default=16)
    args = p.parse_args()
    if args.min_len > args.max_len:
        p.error(f"--min-len {args.min_len} is more than --max-len {args.max_len}")
    return args


def grouped_batch(groups: int, size: int, prompt_len: int, completion_len: int) -> list:
    """GRPO-shaped batch: ``groups`` prompts, ``size`` completions each, sharing their prompt."""
    samples = random_samples(groups * size, seed=1, lengths=[completion_len] * (groups * size), prompt=prompt_len)
    return [dataclasses.replace(s, prompt_ids=samples[i - i % size].prompt_ids) for i, s in enumerate(samples)]


def timed_steps(engine: LearnerEngine, batch: list, steps: int) -> float:
    """Median seconds per optimizer step (after one warm-up step)."""
    engine.train_step(batch)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        assert engine.train_step(batch).applied
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    args = parse()
    rng = np.random.default_rng(0)
    lengths = np.exp(rng.uniform(np.log(args.min_len), np.log(args.max_len), args.samples)).astype(int).tolist()
    batch = random_samples(args.samples, seed=0, lengths=lengths)
    tokens = sum(s.length for s in batch)

    def engine(**kw) -> LearnerEngine:
        model = tiny_lm(0, vocab_size=args.vocab, hidden=args.hidden, layers=args.layers, heads=4, kv_heads=2)
        cfg = LearnerConfig(
            **{"lr": 1e-5, "micro_token_budget": args.budget, "zero_stage": 2, "zero3_persistence_threshold": 0, **kw}
        )
        return LearnerEngine(model, cfg)

    rows: dict[str, float] = {}
    padded = engine(packing="padded")
    rows["padded step s"] = timed_steps(padded, batch, args.steps)
    by_length = sorted(batch, key=lambda s: -s.length)
    rows["padded, sorted step s"] = timed_steps(padded, by_length, args.steps)
    cells = {
        name: sum(mb.input_ids.numel() for mb in micro_batches(b, args.budget, "padded"))
        for name, b in (("padded", batch), ("sorted", by_length))
    }
    del padded
    packed = engine(packing="packed")
    rows["packed (ZeRO-2) step s"] = timed_steps(packed, batch, args.steps)

    from rredcot.launch.services import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(f"{tmp}/redis") as server:
        from rredcot.common.streams import connect

        client = connect(server.url)
        for transport in TRANSPORTS:
            blocking, delivery = delivery_times(packed.module, client, f"{tmp}/{transport}", transport, args.steps)
            rows[f"{transport}: learner-blocking s"] = blocking
            rows[f"{transport}: delivery s"] = delivery
        client.close()
    del packed
    rows["packed (ZeRO-3) step s"] = timed_steps(engine(zero_stage=3), batch, args.steps)

    grouped = grouped_batch(args.groups, args.group_size, args.prompt_len, args.completion_len)
    rows["groups: packed step s"] = timed_steps(engine(packing="packed"), grouped, args.steps)
    rows["groups: shared step s"] = timed_steps(engine(packing="shared"), grouped, args.steps)

    params = sum(
        p.numel()
        for p in tiny_lm(
            0, vocab_size=args.vocab, hidden=args.hidden, layers=args.layers, heads=4, kv_heads=2
        ).parameters()
    )
    result = {
        "packed_vs_padded": rows["padded step s"] / rows["packed (ZeRO-2) step s"],
        "packed_vs_sorted_padded": rows["padded, sorted step s"] / rows["packed (ZeRO-2) step s"],
        "padded_cells_per_token": cells["padded"] / tokens,
        "sorted_padded_cells_per_token": cells["sorted"] / tokens,
        "broadcast_vs_step": rows["file: learner-blocking s"] / rows["packed (ZeRO-2) step s"],
        "collective_vs_file_delivery": rows["file: delivery s"] / rows["collective: delivery s"],
        "collective_vs_file_blocking": rows["file: learner-blocking s"] / rows["collective: learner-blocking s"],
        "ipc_vs_file_delivery": rows["file: delivery s"] / rows["ipc: delivery s"],
        "ipc_vs_collective_delivery": rows["collective: delivery s"] / rows["ipc: delivery s"],
        "ipc_vs_file_blocking": rows["file: learner-blocking s"] / rows["ipc: learner-blocking s"],
        "zero3_vs_zero2_step": rows["packed (ZeRO-3) step s"] / rows["packed (ZeRO-2) step s"],
        "zero2_step_s": rows["packed (ZeRO-2) step s"],
        "zero3_step_s": rows["packed (ZeRO-3) step s"],
        "packed_tokens_per_s": tokens / rows["packed (ZeRO-2) step s"],
        "padded_tokens_per_s": tokens / rows["padded step s"],
        "shared_vs_packed": rows["groups: packed step s"] / rows["groups: shared step s"],
        "batch_tokens": tokens,
        "params": params,
    }
    print(
        f"learner bench: {args.samples} samples, {tokens} tokens (lengths {min(lengths)}-{max(lengths)}), "
        f"budget {args.budget}, model {params / 1e6:.1f}M params"
    )
    for name, value in rows.items():
        print(f"  {name:<26} {value:8.3f}")
    for name in (
        "packed_vs_padded",
        "packed_vs_sorted_padded",
        "padded_cells_per_token",
        "sorted_padded_cells_per_token",
        "broadcast_vs_step",
        "zero3_vs_zero2_step",
        "shared_vs_packed",
        "collective_vs_file_delivery",
        "collective_vs_file_blocking",
        "ipc_vs_file_delivery",
        "ipc_vs_collective_delivery",
        "ipc_vs_file_blocking",
    ):
        print(f"  {name:<26} {result[name]:8.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
