"""Redistribution benchmark (CPU, tiny random Qwen3 with the real tokenizer); ratios from one run.

1. fast vs reference exit-point values on a 4k-token reasoning trace, K = 40, N = 2;
   tokens forwarded by the fast path ÷ ideal (trace + K·N branch tokens); the branches with the
   measured waste rule vs as many per forward as memory allows (the planner before it);
1b. the long case: a 25k-token thinking trace, K = 40, N = 4: peak RSS of the values stage within
   ``credit.scorer.values_memory_mb`` vs one unbounded forward (what a token budget of 131,072 did);
2. redistribution (rredcot) time ÷ transformers ``generate`` time for the same rollouts;
3. MC credit cost ÷ RREDCoT cost on those rollouts.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rredcot.common.config import Config, CreditConfig, ScorerConfig, SegmentationConfig
from rredcot.common.records import RolloutGroup, RolloutRecord, new_id
from rredcot.launch.arguments import bounded_int
from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.branch_plan import ModelShape, plan_pieces
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.entropy import TokenCounter, score_trace
from rredcot.redistributor.mc import HFContinuationSampler
from rredcot.redistributor.references import CONTEXT, Tail, U, Y
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.segmentation import segment, token_texts
from rredcot.redistributor.values import (
    branch_logprobs_fast,
    branch_logprobs_reference,
    exit_branches,
    forward_overhead_cells,
)

LINES = [
    "Let me compute {a}*{b} step by step.",
    "First, {a}*{b} = {a}*10 + {a}*{c}.",
    "Wait, that is not right, {b} is not 10 + {c}.",
    "So I should write {b} = {d} + {e} instead.",
    "Hmm, then {a}*{d} = {f} and {a}*{e} = {g}.",
    "Therefore the sum is {f} + {g} = {h}.",
    "Alternatively, check with {b}*{a}: it also gives {h}.",
    "But let me double-check the last digit.",
]


def reasoning_text(tok, n_tokens: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    lines, n = [], 0
    while n < n_tokens:
        a, b = rng.integers(11, 99, 2)
        d, e = int(b) // 2, int(b) - int(b) // 2
        line = LINES[len(lines) % len(LINES)].format(a=a, b=b, c=b % 10, d=d, e=e, f=a * d, g=a * e, h=a * b)
        lines.append(line)
        n += len(tok(line + "\n", add_special_tokens=False)["input_ids"])
    body = "\n".join(lines)
    ids = tok("<think>\n" + body + "\n</think>\n\nAnswer: 42", add_special_tokens=False)["input_ids"]
    return ids


def solution_tails(refs: list, exit_ids: list[int], n_exits: int) -> list[list[Tail]]:
    """``exit ⊕ u ⊕ y`` for every pair at every exit (the ``solution`` construct, template scored)."""
    return [[Tail.of([(exit_ids, CONTEXT), (u, U), (y, Y)]) for u, y in refs]] * n_exits


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def body_heavy_model(vocab: int = 1024, max_positions: int = 8192) -> Any:
    """A random Qwen3 whose body outweighs its LM head per token, as in real models (hidden 256,
    4 layers, small vocab); the tiny 151k-vocab model spends nearly all its time in the head."""
    return build_tiny_model(
        "qwen3", seed=0, vocab_size=vocab, hidden=256, layers=4, heads=4, kv_heads=2, max_positions=max_positions
    )


def bench_values(model, tok, length: int, k: int, n_refs: int, vocab: int | None = None) -> dict[str, float]:
    """Values on a reasoning trace of ``length`` tokens (ids taken mod ``vocab`` for small-vocab models)."""
    prompt = tok("<|im_start|>user\nCompute the product.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    comp = reasoning_text(tok, length)
    seg, sc = SegmentationConfig(segments=k), ScorerConfig(entropy_chunk=512)
    refs = [
        (
            tok(f"We get {i}*84 = {84 * i}.\n", add_special_tokens=False)["input_ids"],
            tok(f"Answer: {84 * i}", add_special_tokens=False)["input_ids"],
        )
        for i in range(1, n_refs + 1)
    ]
    exit_ids = tok(sc.exit_string, add_special_tokens=False)["input_ids"]
    entropy = np.random.default_rng(0).random(len(comp))  # entropy only places the boundaries here
    exits = segment(token_texts(tok, comp), entropy, seg, "<think>", "</think>").exit_points.tolist()
    if vocab is not None:
        prompt, comp, exit_ids = ([i % vocab for i in x] for x in (prompt, comp, exit_ids))
        refs = [([i % vocab for i in u], [i % vocab for i in y]) for u, y in refs]
    tails = solution_tails(refs, exit_ids, len(exits))

    t_ent, _ = timed(
        lambda: score_trace(model, prompt, comp, sc.entropy_chunk, keep_cache=False, forward_chunk=sc.token_budget)
    )

    def kv_pass():  # the entropy pass is common to both paths (segmentation needs it): KV-only here
        return score_trace(model, prompt, comp, sc.entropy_chunk, stats=False, forward_chunk=sc.token_budget)

    def fast():
        trace = kv_pass()
        return branch_logprobs_fast(model, trace, exits, tails, prompt + comp, sc.values_memory_mb << 20), trace.counter

    t_fast, (bl_fast, counter) = timed(fast, repeat=3)
    trace = kv_pass()
    t_branch, _ = timed(
        lambda: branch_logprobs_fast(model, trace, exits, tails, prompt + comp, sc.values_memory_mb << 20), 3
    )
    sweep = {  # branches alone per credit.scorer.values_memory_mb (with the measured waste rule)
        f"branches_s_at_{mb}mb": timed(
            lambda mb=mb: branch_logprobs_fast(model, trace, exits, tails, prompt + comp, mb << 20), 3
        )[0]
        for mb in (256, 64, 16, 4)
    }
    # what the planner did before the waste rule: as many branches per forward as memory allows
    sweep["branches_s_memory_only"] = timed(
        lambda: branch_logprobs_fast(
            model, trace, exits, tails, prompt + comp, sc.values_memory_mb << 20, overhead_cells=1 << 62
        ),
        3,
    )[0]
    sweep["overhead_cells"] = forward_overhead_cells(model)
    sweep["forwards"] = len(
        plan_pieces(
            exit_branches(prompt + comp, trace.prompt_len, exits, tails),
            sc.values_memory_mb << 20,
            ModelShape.of(model),
            forward_overhead_cells(model),
        )
    )

    def reference():
        counter = TokenCounter()
        return branch_logprobs_reference(model, prompt, comp, exits, tails, counter), counter

    t_ref, (bl_ref, ref_counter) = timed(reference, repeat=2)
    ideal = len(prompt) + len(comp) + len(exits) * sum(len(exit_ids) + len(u) + len(y) for u, y in refs)
    return {
        "L": len(comp),
        "K": len(exits) - 1,
        "N": n_refs,
        "fast_s": t_fast,
        "reference_s": t_ref,
        "max_abs_diff": float(np.abs(bl_fast.log_u - bl_ref.log_u).max() + np.abs(bl_fast.log_y - bl_ref.log_y).max()),
        "tokens_vs_ideal": counter.total / ideal,
        "reference_tokens_vs_ideal": ref_counter.total / ideal,
        "fast_vs_reference": t_ref / t_fast,
        "branches_only_s": t_branch,
        "values_stage_vs_reference": t_ref / t_branch,
        "entropy_pass_s": t_ent,
        **sweep,
    }


def _rss_mb(field: str) -> float:
    """VmRSS / VmHWM (peak since the last reset) of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def values_peak(fn) -> tuple[float, float, Any]:
    """(seconds, peak RSS above the starting RSS in MiB, result) of ``fn`` (the peak counter is reset
    first: /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _rss_mb("VmRSS")
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, _rss_mb("VmHWM") - before, out


def bench_long(tok, length: int, k: int, n_refs: int, budget_mb: int) -> dict[str, float]:
    """Values of one ``length``-token thinking trace on the body-heavy model: bounded vs unbounded."""
    model = body_heavy_model(max_positions=length + 1024)
    prompt = tok("<|im_start|>user\nCompute the product.<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    comp = reasoning_text(tok, length)
    seg, sc = SegmentationConfig(segments=k, min_segment_tokens=32), ScorerConfig(entropy_chunk=512)
    refs = [
        (
            tok(f"We get {i}*84 = {84 * i}.\n" * 8, add_special_tokens=False)["input_ids"],
            tok(f"Answer: {84 * i}")["input_ids"],
        )
        for i in range(1, n_refs + 1)
    ]
    exit_ids = tok(sc.exit_string, add_special_tokens=False)["input_ids"]
    entropy = np.random.default_rng(0).random(len(comp))
    exits = segment(token_texts(tok, comp), entropy, seg, "<think>", "</think>").exit_points.tolist()
    prompt, comp, exit_ids = ([i % 1024 for i in x] for x in (prompt, comp, exit_ids))
    refs = [([i % 1024 for i in u], [i % 1024 for i in y]) for u, y in refs]
    tails = solution_tails(refs, exit_ids, len(exits))
    trace = score_trace(model, prompt, comp, sc.entropy_chunk, stats=False, forward_chunk=sc.token_budget)
    bounded_s, bounded_mb, bl = values_peak(
        lambda: branch_logprobs_fast(model, trace, exits, tails, prompt + comp, budget_mb << 20)
    )
    one_s, one_mb, bl_one = values_peak(
        lambda: branch_logprobs_fast(model, trace, exits, tails, prompt + comp, 1 << 50)
    )
    return {
        "L": len(comp),
        "K": len(exits) - 1,
        "N": n_refs,
        "branch_tokens": sum(len(exit_ids) + len(u) + len(y) for u, y in refs) * len(exits),
        "budget_mb": budget_mb,
        "long_peak_mb": bounded_mb,
        "long_peak_vs_budget": bounded_mb / budget_mb,
        "long_values_s": bounded_s,
        "unbounded_peak_mb": one_mb,
        "unbounded_values_s": one_s,
        "max_abs_diff": float(np.abs(bl.log_u - bl_one.log_u).max() + np.abs(bl.log_y - bl_one.log_y).max()),
    }


def make_group(tok, model, g: int, max_tokens: int) -> tuple[RolloutGroup, float]:
    prompt = tok("<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    ids = torch.tensor([prompt])
    torch.manual_seed(0)
    t_gen, out = timed(
        lambda: model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            num_return_sequences=g,
            pad_token_id=0,
        )
    )
    gid = new_id()
    samples = [
        RolloutRecord(
            new_id(),
            gid,
            "p",
            i,
            np.array(row[len(prompt) :], np.int32),
            np.zeros(max_tokens, np.float32),
            np.array([[0, 0]], np.int32),
            "length",
            float(i % 2),
            "correct" if i % 2 else "wrong",
        )
        for i, row in enumerate(out.tolist())
    ]
    enc = lambda t: np.array(tok(t, add_special_tokens=False)["input_ids"], np.int32)  # noqa: E731
    group = RolloutGroup(
        gid,
        "p",
        np.array(prompt, np.int32),
        [enc("12*7 = 84.\n"), enc("7*12 = 84.\n")],
        [enc("Answer: 84"), enc("Answer: 84")],
        samples,
        answer="84",
    )
    return group, t_gen


def bench_pipeline(model, tok, g: int, length: int, k: int, m: int) -> dict[str, float]:
    group, t_gen = make_group(tok, model, g, length)
    cfg = Config()
    cfg.generation.max_tokens = length
    # random-model text has no keyword boundaries: segment by entropy over every token
    cfg.credit = CreditConfig(
        segmentation=SegmentationConfig(segments=k, split_keywords=False), settings={"mc": {"samples": m}}
    )
    scorer = Scorer(model, tok, cfg.credit.scorer.exit_string)
    t_rr, _ = timed(lambda: redistribute_group(group, cfg, scorer))
    cfg.credit.method = "mc"
    sampler = HFContinuationSampler(model)
    t_mc, _ = timed(
        lambda: redistribute_group(
            group, cfg, scorer, sampler=sampler, reward_fn=lambda ids, gold, opened=False: float(len(ids) % 2)
        )
    )
    return {
        "G": g,
        "L": length,
        "K": k,
        "M": m,
        "generate_s": t_gen,
        "rredcot_s": t_rr,
        "mc_s": t_mc,
        "redistribution_vs_generation": t_rr / t_gen,
        "mc_vs_rredcot_cost": t_mc / t_rr,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--length", type=bounded_int(1, 10**7), default=4096)
    ap.add_argument("--segments", type=bounded_int(1, 10**6), default=40)
    ap.add_argument("--refs", type=bounded_int(1, 10**4), default=2)
    ap.add_argument("--group", type=bounded_int(1, 10**4), default=4)
    ap.add_argument("--gen-tokens", type=bounded_int(1, 10**7), default=64)
    ap.add_argument("--mc-segments", type=bounded_int(1, 10**6), default=8)
    ap.add_argument("--mc-samples", type=bounded_int(1, 10**4), default=2)
    ap.add_argument("--long-length", type=bounded_int(1, 10**7), default=25000, help="the long case's trace length")
    ap.add_argument("--long-refs", type=bounded_int(1, 10**4), default=4)
    ap.add_argument(
        "--long-budget-mb",
        type=bounded_int(1, 10**7),
        default=256,
        help="credit.scorer.values_memory_mb of the long case",
    )
    ap.add_argument("--only-long", action="store_true", help="run the long case only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer(qwen_tokenizer_dir())
    long = bench_long(tok, args.long_length, args.segments, args.long_refs, args.long_budget_mb)
    print(f"{'long case (body-heavy)':<30}{'value':>14}")
    for name, val in long.items():
        print(f"{name:<30}{val:>14.4g}")
    if args.only_long:
        print(json.dumps({"long_peak_vs_budget": round(long["long_peak_vs_budget"], 3)}))
        return
    model = build_tiny_model("qwen3", seed=0, max_positions=8192)
    body = bench_values(body_heavy_model(), tok, args.length, args.segments, args.refs, vocab=1024)
    head = bench_values(model, tok, args.length, args.segments, args.refs)
    pipe = bench_pipeline(model, tok, args.group, args.gen_tokens, args.mc_segments, args.mc_samples)
    print(f"{'measure':<30}{'body-heavy':>14}{'tiny 151k vocab':>18}")
    for name in body:
        print(f"{name:<30}{body[name]:>14.4g}{head[name]:>18.4g}")
    print(f"\n{'pipeline (tiny 151k vocab)':<30}{'value':>14}")
    for name, val in pipe.items():
        print(f"{name:<30}{val:>14.4g}")
    print(
        json.dumps(
            {
                "tokens_vs_ideal": round(body["tokens_vs_ideal"], 4),
                "long_peak_vs_budget": round(long["long_peak_vs_budget"], 3),
                "fast_vs_reference": round(body["fast_vs_reference"], 2),
                "values_stage_vs_reference": round(body["values_stage_vs_reference"], 2),
                "fast_vs_reference_tiny_vocab_head_bound": round(head["fast_vs_reference"], 2),
                "redistribution_vs_generation": round(pipe["redistribution_vs_generation"], 3),
                "mc_vs_rredcot_cost": round(pipe["mc_vs_rredcot_cost"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
