"""Long-sequence learner step: one σ-weighted training step on a single --tokens-token sample.

A random-initialised model of a preset shape (``qwen2.5-1.5b``: the Qwen2.5-1.5B architecture,
1.54B parameters; ``smoke``: a tiny one that runs on a CPU in seconds), one packed micro-batch,
real DeepSpeed (one rank: NCCL on GPU, gloo on CPU), gradient checkpointing and the chunked LM
head. Reports the step time, tokens/s and the peak memory (GPU: ``max_memory_allocated``; CPU:
the process's peak RSS). Prints a table; the last line is one JSON object.

Usage: python -P bench/learner_long.py [--preset qwen2.5-1.5b --tokens 25000 --zero 2 --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.learner_samples
from tests.learner_samples import SHAPES, random_samples  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--tokens", type=int, default=25000, help="completion tokens of the sample")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens of the sample")
    p.add_argument("--zero", type=int, default=2, choices=[0, 1, 2, 3], help="learner.zero_stage")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="learner.dtype (default: bfloat16 on GPU, float32 on CPU)",
    )
    p.add_argument("--no-grad-checkpointing", action="store_true")
    p.add_argument("--logprob-chunk", type=int, default=4096, help="learner.logprob_chunk")
    p.add_argument("--steps", type=int, default=2, help="timed steps (after 1 warm-up)")
    return p.parse_args()


def peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main() -> None:
    args = parse()
    gpu = torch.cuda.is_available()
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    shape = SHAPES[args.preset]
    torch.manual_seed(0)
    config = Qwen2Config(**shape, max_position_embeddings=args.prompt + args.tokens, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    budget = args.prompt + args.tokens
    cfg = LearnerConfig(
        lr=1e-6,
        micro_token_budget=budget,
        zero_stage=args.zero,
        dtype=dtype,
        grad_checkpointing=not args.no_grad_checkpointing,
        logprob_chunk=args.logprob_chunk,
    )
    engine = LearnerEngine(model, cfg)
    batch = random_samples(1, seed=0, lengths=[args.tokens], prompt=args.prompt)
    assert engine.train_step(batch).applied  # warm-up
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        assert engine.train_step(batch).applied
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    result = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "preset": args.preset,
        "params": params,
        "tokens": budget,
        "zero_stage": args.zero,
        "dtype": dtype,
        "grad_checkpointing": not args.no_grad_checkpointing,
        "step_s": step,
        "tokens_per_s": budget / step,
        "peak_memory_gib": peak_memory_gib(),
    }
    print(
        f"learner long step: {args.preset} ({params / 1e6:,.1f}M parameters), one {budget}-token sample, "
        f"ZeRO-{args.zero}, {dtype}, on {result['device']}"
    )
    for name in ("step_s", "tokens_per_s", "peak_memory_gib"):
        print(f"  {name:<16} {result[name]:10.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
