"""What makes the CPU demo fast or slow on this CPU, side by side in one run.

1. One 512×2048 @ 2048×2048 matmul, fp32 vs bf16 (one thread, best of 3): the ratio that
   ``dtype: auto`` avoids paying where bf16 is emulated, and the dtype ``auto`` picks here.
2. The demo's held-out evaluation (``data.eval_size`` problems × (``group_size`` sampled + 1
   greedy), SmolLM2-135M, the dtype ``auto`` picks) with vLLM-CPU's default 128-token KV block vs
   the 32-token block the engine now asks for: with 128 a ~120-token prompt fills no block, so
   nothing is prefix-cached and every sample prefills the prompt again.

    python -P bench/cpu_first_contact.py [--problems 32]       # ~3 minutes on a 2-core AVX2 CPU
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

from rredcot.actors.engine import Engine, EngineSpec  # noqa: E402
from rredcot.common.config import load_config  # noqa: E402
from rredcot.common.precision import cpu_info, resolve_dtype  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.evaluate import evaluate  # noqa: E402
from rredcot.tasks.data import train_and_held_out  # noqa: E402
from rredcot.tasks.verifier import Verifier  # noqa: E402


def matmul_seconds(dtype: torch.dtype, repeats: int = 3) -> float:
    a, b = torch.randn(512, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return best


def eval_seconds(block: int, problems: int) -> tuple[float, float]:
    """(seconds, sampled accuracy) of the demo's evaluation on an engine with KV block ``block``."""
    cfg = load_config("demo_cpu", [f"data.eval_size={problems}", f"generation.kv_block_size={block}"])
    engine = Engine(EngineSpec.from_config(cfg))
    with Verifier.from_config(cfg) as verifier:
        held = train_and_held_out(verifier.task, cfg.data, cfg.run.seed)[1]
        verifier.score("Answer: 1", "1")  # start its process before timing
        result = evaluate(engine, held, cfg, verifier)
    del engine
    return result.seconds, result.sampled


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", type=bounded_int(1, 10**6), default=32)
    args = p.parse_args()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    fp32, bf16 = matmul_seconds(torch.float32), matmul_seconds(torch.bfloat16)
    torch.set_num_threads(threads)
    choice = resolve_dtype("auto", "cpu")
    slow_s, slow_acc = eval_seconds(128, args.problems)
    fast_s, fast_acc = eval_seconds(32, args.problems)
    info = cpu_info()
    print(f"CPU: {info.describe()}, {os.cpu_count()} cores; dtype auto -> {choice.dtype} ({choice.reason})")
    print(f"{'measure':<52}{'value':>12}")
    print(f"{'matmul 512x2048x2048, fp32, 1 thread (s)':<52}{fp32:>12.4f}")
    print(f"{'matmul 512x2048x2048, bf16, 1 thread (s)':<52}{bf16:>12.4f}")
    print(f"{'bf16_vs_fp32 (time ratio)':<52}{bf16 / fp32:>12.1f}")
    print(f"{f'demo evaluation, {args.problems} problems, KV block 128 (s)':<52}{slow_s:>12.1f}")
    print(f"{f'demo evaluation, {args.problems} problems, KV block 32 (s)':<52}{fast_s:>12.1f}")
    print(f"{'block32_vs_block128 (speed-up)':<52}{slow_s / fast_s:>12.2f}")
    print(
        json.dumps(
            {
                "cpu": info.model,
                "flags": info.speed_flags(),
                "dtype_auto": choice.dtype,
                "matmul_fp32_s": fp32,
                "matmul_bf16_s": bf16,
                "bf16_vs_fp32": bf16 / fp32,
                "eval_block128_s": slow_s,
                "eval_block32_s": fast_s,
                "block32_vs_block128": slow_s / fast_s,
                "sampled_accuracy": [slow_acc, fast_acc],
            }
        )
    )


if __name__ == "__main__":
    main()
