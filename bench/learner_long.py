"""Long-sequence learner steps: σ-weighted training steps on one sample per length and LM-head chunk.

A random-initialised model of a preset shape (``qwen2.5-1.5b``: the Qwen2.5-1.5B architecture,
1.54B parameters; ``smoke``: a tiny one that runs on a CPU in seconds), one packed micro-batch,
real DeepSpeed (one rank: NCCL on GPU, gloo on CPU), gradient checkpointing and the chunked LM
head. For every completion length (default 8k, 16k, 25k, 32k) and LM-head chunk (1024, 2048,
4096) on the same engine: the step time, tokens/s and the peak memory (GPU: ``max_memory_allocated``
since the row began; CPU: the process's peak RSS so far, which cannot be reset). ``--profile N``
then profiles one more step of the last row (``torch.profiler``): its time by kind of work (matmul,
attention, communication, optimizer, the rest) and its N costliest ops, by self time on the GPU
(CPU: on the CPU, summed over threads). Prints tables; the last line is one JSON object.

Usage: python -P bench/learner_long.py [--preset qwen2.5-1.5b --tokens 8000 25000 --logprob-chunk 2048
--zero 2 --dtype bfloat16 --profile 15]; on a CPU: --preset smoke --tokens 2000 --logprob-chunk 512
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rredcot.common.config import LearnerConfig
from rredcot.launch.arguments import bounded_int
from rredcot.learner.engine import LearnerEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.learner_samples
from tests.learner_samples import SHAPES, random_samples  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument(
        "--tokens",
        type=bounded_int(1, 10**7),
        nargs="+",
        default=[8000, 16000, 25000, 32000],
        help="completion tokens of the sample",
    )
    p.add_argument("--prompt", type=bounded_int(1, 10**7), default=256, help="prompt tokens of the sample")
    p.add_argument("--zero", type=int, default=2, choices=[0, 1, 2, 3], help="learner.zero_stage")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=None,
        help="learner.dtype (default: bfloat16 on GPU, float32 on CPU)",
    )
    p.add_argument("--no-grad-checkpointing", action="store_true")
    p.add_argument(
        "--logprob-chunk",
        type=bounded_int(0, 10**7),
        nargs="+",
        default=[1024, 2048, 4096],
        help="learner.logprob_chunk values",
    )
    p.add_argument(
        "--fp32-matmul", nargs="+", default=["tf32"], choices=["tf32", "ieee"], help="learner.fp32_matmul values"
    )
    p.add_argument("--steps", type=bounded_int(1, 10**6), default=2, help="timed steps (after 1 warm-up)")
    p.add_argument(
        "--profile",
        type=bounded_int(0, 10**4),
        default=0,
        metavar="N",
        help="profile a step of the last row: N top ops",
    )
    return p.parse_args()


# A profiled op's kind: the first whose patterns its lower-cased name contains (cuBLAS kernels are
# named gemm, xmma or nvjet; flash and memory-efficient attention kernels fmha, flash or attention).
KINDS = {
    "communication": ("nccl", "all_reduce", "allreduce", "reduce_scatter", "all_gather", "allgather", "broadcast"),
    "attention": ("flash", "attention", "fmha", "sdpa"),
    "matmul": ("gemm", "xmma", "nvjet", "cutlass", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul"),
    "optimizer": ("adam", "multi_tensor", "_foreach"),
}


def kind_of(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, patterns in KINDS.items() if any(p in lower for p in patterns)), "other")


def profile_step(engine: LearnerEngine, batch: list, top: int) -> dict:
    """One training step under ``torch.profiler``: self time (ms) by kind and of the ``top`` costliest
    ops, on the GPU where there is one (each kernel counted once), else on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        assert engine.train_step(batch).applied
        if gpu:
            torch.cuda.synchronize()
    attr = "self_device_time_total" if gpu else "self_cpu_time_total"
    ops = [(e.key, e.count, getattr(e, attr) / 1e3) for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(ms for _, _, ms in ops)
    kinds = {k: 0.0 for k in [*KINDS, "other"]}
    for name, _, ms in ops:
        kinds[kind_of(name)] += ms
    ops.sort(key=lambda op: -op[2])
    print(f"\nprofiled step: {total:,.0f} ms of {'GPU' if gpu else 'CPU'} self time")
    print(f"{'kind':<14} {'ms':>9} {'share':>6}")
    for kind, ms in kinds.items():
        print(f"{kind:<14} {ms:>9.1f} {ms / total:>6.1%}")
    print(f"\n{'op':<64} {'calls':>6} {'ms':>9} {'share':>6}")
    for name, calls, ms in ops[:top]:
        print(f"{name[:64]:<64} {calls:>6} {ms:>9.1f} {ms / total:>6.1%}")
    return {
        "on": "gpu" if gpu else "cpu",
        "total_ms": total,
        "kinds_ms": kinds,
        "top": [{"op": n, "calls": c, "ms": ms} for n, c, ms in ops[:top]],
    }


def peak_memory_gib() -> float:
    """GPU: the peak since the last reset; CPU: the process's peak RSS (it cannot be reset)."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def timed_steps(engine: LearnerEngine, batch: list, steps: int) -> tuple[float, float]:
    """Median seconds of ``steps`` training steps on ``batch`` (after one warm-up step), and the last
    step's gradient norm (zero would mean a step that trained nothing)."""
    assert engine.train_step(batch).applied  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        result = engine.train_step(batch)
        assert result.applied
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result.metrics["grad_norm"]


def main() -> None:
    args = parse()
    gpu = torch.cuda.is_available()
    dtype = args.dtype or ("bfloat16" if gpu else "float32")
    longest = args.prompt + max(args.tokens)
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[args.preset], max_position_embeddings=longest, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    cfg = LearnerConfig(
        lr=1e-6,
        micro_token_budget=longest,
        zero_stage=args.zero,
        dtype=dtype,
        grad_checkpointing=not args.no_grad_checkpointing,
        logprob_chunk=args.logprob_chunk[0],
        fp32_matmul=args.fp32_matmul[0],
    )
    engine = LearnerEngine(model, cfg)
    device = torch.cuda.get_device_name() if gpu else "cpu"
    print(
        f"learner long step: {args.preset} ({params / 1e6:,.1f}M parameters), ZeRO-{args.zero}, {dtype}, "
        f"gradient checkpointing {'off' if args.no_grad_checkpointing else 'on'}, on {device}"
    )
    print(f"{'tokens':>7} {'chunk':>6} {'fp32':>5} {'step s':>8} {'tokens/s':>9} {'peak GiB':>9} {'grad norm':>10}")
    rows = []
    for tokens, chunk, fp32 in itertools.product(args.tokens, args.logprob_chunk, args.fp32_matmul):
        engine.engine.module.chunk = chunk  # the LM-head chunk of TokenLogProbs
        torch.backends.cuda.matmul.fp32_precision = fp32  # what LearnerEngine sets from learner.fp32_matmul
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        batch = random_samples(1, seed=0, lengths=[tokens], prompt=args.prompt, vocab=config.vocab_size)
        step, grad_norm = timed_steps(engine, batch, args.steps)
        row = {
            "tokens": args.prompt + tokens,
            "chunk": chunk,
            "fp32_matmul": fp32,
            "step_s": step,
            "grad_norm": grad_norm,
        }
        row |= {"tokens_per_s": row["tokens"] / step, "peak_memory_gib": peak_memory_gib()}
        rows.append(row)
        print(
            f"{row['tokens']:>7} {chunk:>6} {fp32:>5} {step:>8.2f} {row['tokens_per_s']:>9.0f} "
            f"{row['peak_memory_gib']:>9.2f} {grad_norm:>10.3g}"
        )
    summary = {
        "device": device,
        "preset": args.preset,
        "params": params,
        "zero_stage": args.zero,
        "dtype": dtype,
        "rows": rows,
    }
    if args.profile:
        summary["profile"] = profile_step(engine, batch, args.profile) | {"row": rows[-1]["tokens"]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
