"""What a split would give on paper, before any run: per-GPU rates of each tier from first principles
(the model, the sequences, the credit method's extra scoring, the GPU's peaks and the utilisations
measured on one), for ``rredcot advise`` without a run to read."""

from __future__ import annotations

from dataclasses import dataclass

from rredcot.launch.observe.advise import Rates


@dataclass(frozen=True)
class Workload:
    """What ``paper_rates`` needs: the model, the sequences, the credit method's extra scoring."""

    params: float  # parameters
    layers: int
    heads: int  # query heads
    kv_heads: int
    head_dim: int
    prompt_tokens: int
    completion_tokens: int
    scored_tokens: float = 0.0  # extra tokens the scorer runs per sample (branches); 0: GRPO


@dataclass(frozen=True)
class Gpu:
    """Peak dense bf16 FLOP/s and memory bandwidth; the utilisations reached in practice. The two
    MFUs were measured on an H100, counted as ``paper_rates`` counts FLOPs: a ZeRO-2 bf16 step of a
    1.5B model on 25k tokens with gradient checkpointing (``bench/learner_long.py``) and the scorer's
    trace and exit-value passes on it (``bench/scorer_long.py``), 2026-11-27."""

    flops: float = 989e12  # H100 SXM
    bandwidth: float = 3.35e12  # bytes/s
    memory: float = 80e9
    train_mfu: float = 0.26
    prefill_mfu: float = 0.32
    decode_efficiency: float = 0.6  # of the bandwidth


def token_flops(params: float, layers: int, heads: int, head_dim: int, context: float) -> float:
    """FLOPs of one forwarded token whose context holds ``context`` tokens: 2·N plus causal attention."""
    return 2 * params + 4 * layers * heads * head_dim * context


def paper_rates(w: Workload, gpu: Gpu = Gpu(), overlap: bool = True) -> Rates:
    """Per-GPU samples/s from first principles. Decoding: each step reads the weights (2 bytes a
    parameter) once for the batch and every running sequence's KV cache (its mean context), with the
    batch as large as the memory left for KV allows. A forward pass costs 2·N FLOPs a token plus
    causal attention, 4·layers·heads·head_dim·(mean context) a token; scoring runs one over the sample
    and its scored branches at ``prefill_mfu``, training three at ``train_mfu``."""
    weights = 2.0 * w.params
    kv_per_token = 2 * w.layers * w.kv_heads * w.head_dim * 2  # K and V, bf16
    tokens = w.prompt_tokens + w.completion_tokens
    mean_context = w.prompt_tokens + w.completion_tokens / 2
    batch = max(1.0, (gpu.memory * 0.9 - weights) / (kv_per_token * tokens))
    step_s = (weights + batch * kv_per_token * mean_context) / (gpu.bandwidth * gpu.decode_efficiency)
    generate = batch / step_s / w.completion_tokens
    forward = token_flops(w.params, w.layers, w.heads, w.head_dim, tokens / 2)
    score = gpu.flops * gpu.prefill_mfu / (forward * (tokens + w.scored_tokens))
    train = gpu.flops * gpu.train_mfu / (3 * forward * tokens)
    return Rates(generate, score, train, overlap)
