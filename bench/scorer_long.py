"""The scorer's cost on one long trace: the entropy pass over prompt ⊕ completion, then the exit values
(``branch_logprobs_fast``: every exit's branches on the trace's KV cache), timed apart, as the
redistributor runs them; tokens/s and the model FLOP utilisation (MFU) beside ``rredcot advise``'s
assumed ``prefill_mfu`` of 0.5.

A random-initialised model of a preset shape (``qwen2.5-1.5b``, or ``smoke`` for a CPU), bf16 on a
GPU (fp32 on a CPU), a random prompt and completion, ``--exits`` exits spread evenly over the
completion and ``--tails`` tails per exit of ``--tail-tokens`` scored tokens (exit string ⊕ u ⊕ y:
a reference solution and its answer). FLOPs as ``rredcot/launch/observe/advise.py`` counts them: 2·N a token plus
causal attention, 4·layers·heads·head_dim·(the token's context). Prints a table; the last line is one
JSON object.

Usage: python -P bench/scorer_long.py [--preset qwen2.5-1.5b --tokens 25000 --exits 40 --tails 4];
on a CPU: --preset smoke --tokens 2000 --exits 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rredcot.launch.arguments import bounded_int
from rredcot.launch.observe.paper_rates import token_flops
from rredcot.redistributor.entropy import score_trace
from rredcot.redistributor.references import CONTEXT, Tail, U, Y
from rredcot.redistributor.values import branch_logprobs_fast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.learner_samples
from tests.learner_samples import SHAPES  # noqa: E402

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}  # dense bf16 FLOP/s


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    p.add_argument("--tokens", type=bounded_int(1, 10**7), nargs="+", default=[8000, 25000], help="completion tokens")
    p.add_argument("--prompt", type=bounded_int(1, 10**7), default=256)
    p.add_argument("--exits", type=bounded_int(1, 10**6), default=40, help="credit.segmentation.segments")
    p.add_argument("--tails", type=bounded_int(1, 10**4), default=4, help="tails per exit (references × constructs)")
    p.add_argument("--tail-tokens", type=bounded_int(1, 10**7), default=300, help="tokens of one tail")
    p.add_argument("--memory-mb", type=bounded_int(1, 10**7), default=4096, help="credit.scorer.values_memory_mb")
    p.add_argument("--chunk", type=bounded_int(1, 10**7), default=2048, help="credit.scorer.entropy_chunk")
    p.add_argument(
        "--attention", default="auto", choices=["auto", "dense", "flex"], help="credit.scorer.branch_attention"
    )
    p.add_argument("--repeats", type=bounded_int(1, 10**6), default=2, help="timed runs after one warm-up")
    return p.parse_args()


def model_of(preset: str, device: str, dtype: torch.dtype) -> torch.nn.Module:
    cfg = Qwen2Config(**SHAPES[preset], max_position_embeddings=40960)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).eval()


def forward_flops(model: torch.nn.Module, tokens: int, context: float) -> float:
    """FLOPs of ``tokens`` forwarded tokens whose mean context is ``context`` (advise's count)."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    head_dim = c.hidden_size // c.num_attention_heads
    return tokens * token_flops(params, c.num_hidden_layers, c.num_attention_heads, head_dim, context)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(model, args, n: int, device: str) -> dict:
    g = torch.Generator().manual_seed(n)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt,), generator=g).tolist()
    comp = torch.randint(0, vocab, (n,), generator=g).tolist()
    exit_ids, answer = [198, 151668, 271][: 3 if vocab > 151668 else 1], [16, 17, 18]
    u_len = max(1, args.tail_tokens - len(exit_ids) - len(answer))
    tails = [
        Tail.of([(exit_ids, CONTEXT), (torch.randint(0, vocab, (u_len,), generator=g).tolist(), U), (answer, Y)])
        for _ in range(args.tails)
    ]
    exits = [round(n * (t + 1) / args.exits) for t in range(args.exits)]
    times = {"trace": [], "values": []}
    for _ in range(1 + args.repeats):  # the first is a warm-up (compiles flex attention)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        sync(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            trace = score_trace(model, prompt, comp, args.chunk, forward_chunk=args.chunk * 8)
            sync(device)
            t1 = time.perf_counter()
            branch_logprobs_fast(
                model,
                trace,
                exits,
                [tails] * len(exits),
                prompt + comp,
                args.memory_mb << 20,
                args.chunk,
                args.attention,
            )
            sync(device)
        times["trace"].append(t1 - t0)
        times["values"].append(time.perf_counter() - t1)
        del trace
    trace_s, values_s = min(times["trace"][1:]), min(times["values"][1:])
    total = args.prompt + n
    branch_tokens = args.exits * args.tails * args.tail_tokens
    trace_flops = forward_flops(model, total, total / 2)
    # A branch token's context: the trace up to its exit (on average half the trace) plus its own tail.
    values_flops = forward_flops(model, branch_tokens, args.prompt + n / 2 + args.tail_tokens / 2)
    peak = next((v for k, v in PEAK_BF16.items() if device == "cuda" and k in torch.cuda.get_device_name()), None)
    row = {
        "completion_tokens": n,
        "branch_tokens": branch_tokens,
        "trace_s": trace_s,
        "values_s": values_s,
        "trace_tokens_per_s": total / trace_s,
        "branch_tokens_per_s": branch_tokens / values_s,
        "trace_tflops": trace_flops / trace_s / 1e12,
        "values_tflops": values_flops / values_s / 1e12,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }
    if peak:
        row["trace_mfu"], row["values_mfu"] = trace_flops / trace_s / peak, values_flops / values_s / peak
        row["mfu"] = (trace_flops + values_flops) / (trace_s + values_s) / peak
    return row


def main() -> None:
    args = parse()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = model_of(args.preset, device, dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{name}, {args.preset}, {dtype}; {args.exits} exits × {args.tails} tails × {args.tail_tokens} tokens")
    rows = [run(model, args, n, device) for n in args.tokens]
    print("completion  branch tok  trace s  values s  trace tok/s  branch tok/s  TFLOP/s (trace, values)  MFU")
    for r in rows:
        mfu = f"{r['mfu']:.2f}" if "mfu" in r else "-"
        print(
            f"{r['completion_tokens']:>10}  {r['branch_tokens']:>10}  {r['trace_s']:7.2f}  {r['values_s']:8.2f}  "
            f"{r['trace_tokens_per_s']:11,.0f}  {r['branch_tokens_per_s']:12,.0f}  "
            f"{r['trace_tflops']:8.1f}, {r['values_tflops']:6.1f}         {mfu}"
        )
    print(json.dumps({"device": name, "preset": args.preset, "rows": rows, "advise_prefill_mfu": 0.5}))


if __name__ == "__main__":
    main()
