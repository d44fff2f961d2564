"""The learner's LM head alone, by matmul precision: what ``learner.fp32_matmul`` buys.

The head as the learner runs it (``TokenLogProbs``): log π(target) of every completion token from
bf16 hidden states, in checkpointed chunks (forward, recompute, backward), the logits in float32
from a float32 copy of the weight (``ieee`` or ``tf32`` tensor cores), against a bf16 matmul
upcast afterwards. For each: seconds per step and TFLOP/s (fwd + recompute + 2 backward products),
and the largest log-prob error against float64 on one chunk. Random hidden states and weight
(std 0.02), fresh per run; the Qwen2.5-1.5B head by default (hidden 1536, vocab 151,936).
TF32 exists on CUDA GPUs only: on a CPU ``tf32`` runs as ``ieee``.

Usage: python -P bench/lm_head.py [--tokens 25256 --hidden 1536 --vocab 151936 --chunk 4096];
on a CPU: --tokens 512 --vocab 32000 --chunk 128
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rredcot.launch.arguments import bounded_int

MODES = ("ieee", "tf32", "bf16")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=bounded_int(1, 10**7), default=25_256)
    p.add_argument("--hidden", type=bounded_int(1, 10**6), default=1536)
    p.add_argument("--vocab", type=bounded_int(1, 10**7), default=151_936)
    p.add_argument("--chunk", type=bounded_int(0, 10**7), default=4096, help="learner.logprob_chunk")
    p.add_argument("--steps", type=bounded_int(1, 10**6), default=5, help="timed steps per mode (after 2 warm-ups)")
    return p.parse_args()


def head_logprobs(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mode: str) -> torch.Tensor:
    """log π(targets) from hidden states ``h`` [T, D] and head ``weight`` [V, D]; float32 logits."""
    logits = F.linear(h, weight).float() if mode == "bf16" else F.linear(h.float(), weight.float())
    return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def set_precision(mode: str) -> None:
    torch.backends.cuda.matmul.fp32_precision = "tf32" if mode == "tf32" else "ieee"


def step_seconds(h0: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int, mode: str, steps: int):
    """Mean seconds of one chunked, checkpointed forward + backward of the head."""

    def step() -> None:
        h = h0.clone().requires_grad_()
        parts = [
            checkpoint(head_logprobs, a, weight, b, mode, use_reentrant=False)
            for a, b in zip(h.split(chunk), targets.split(chunk), strict=True)
        ]
        torch.cat(parts).sum().backward()
        weight.grad = None

    set_precision(mode)
    for _ in range(2):
        step()
    sync = torch.cuda.synchronize if h0.is_cuda else lambda: None
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def max_error(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mode: str) -> float:
    """Largest |log π − float64 log π| over the tokens of ``h``."""
    with torch.no_grad():
        ref = F.linear(h.double(), weight.double())
        ref = ref.gather(-1, targets[:, None]).squeeze(-1) - ref.logsumexp(-1)
        set_precision(mode)
        return (head_logprobs(h, weight, targets, mode).double() - ref).abs().max().item()


def main() -> None:
    args = parse()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=device).manual_seed(int(time.time()))
    h0 = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(args.vocab, args.hidden, device=device, generator=g) * 0.02).to(torch.bfloat16)
    weight.requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=g)
    flops = 4 * 2 * args.tokens * args.hidden * args.vocab  # forward, recompute, two backward products
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"LM head: {args.tokens} tokens, hidden {args.hidden}, vocab {args.vocab}, chunk {args.chunk}, on {name}")
    print(f"{'mode':>5} {'s/step':>8} {'TFLOP/s':>8} {'max |err|':>10}")
    rows = []
    for mode in MODES:
        seconds = step_seconds(h0, weight, targets, args.chunk, mode, args.steps)
        err = max_error(h0[: args.chunk], weight.detach(), targets[: args.chunk], mode)
        rows.append({"mode": mode, "step_s": seconds, "tflops": flops / seconds / 1e12, "max_err": err})
        print(f"{mode:>5} {seconds:>8.3f} {flops / seconds / 1e12:>8.1f} {err:>10.2e}")
    set_precision("ieee")
    ieee = rows[0]["step_s"]
    print(json.dumps({"device": name, "rows": rows, "ieee_vs_tf32": ieee / rows[1]["step_s"]}))


if __name__ == "__main__":
    main()
