"""Synthetic policies and batches for learner tests and benchmarks: tiny random models, random
σ-weighted samples; a file-size limit that stands in for a full disk."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from rredcot.learner.packing import TrainSample
from rredcot.models.tiny import tiny_config

VOCAB = 1000
# Qwen2-architecture shapes for GPU tests and benchmarks (random weights): the 1.5B one and a smoke one
SHAPES = {
    "qwen2.5-1.5b": {
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
    },
    "smoke": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
    },
}


def tiny_lm(seed: int = 0, **config_kwargs) -> torch.nn.Module:
    """Qwen3-shaped, hidden 64, 2 layers, vocab 1000, fp32, sdpa attention."""
    torch.manual_seed(seed)
    cfg = tiny_config(**{"vocab_size": VOCAB, **config_kwargs})
    cfg.pad_token_id = cfg.eos_token_id = 0
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def random_samples(
    n: int,
    seed: int = 0,
    lengths: list[int] | None = None,
    prompt: int = 5,
    sigma: str = "random",
    version: int = 0,
    vocab: int = VOCAB,
) -> list[TrainSample]:
    """``n`` samples with random tokens, non-zero advantages and behaviour log-probs near -log(``vocab``): a
    random-initialised model of that vocabulary gives about those, so the ratios start near 1 (far below
    1 - ε every token of a negative-advantage sample is clipped and carries no gradient)."""
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(x) for x in rng.integers(3, 40, n)]
    out = []
    for i, L in enumerate(lengths):
        if sigma == "uniform":
            s = np.full(L, 1.0 / L, np.float32)
        else:
            s = rng.random(L).astype(np.float32) ** 3
            s /= s.sum()
        out.append(
            TrainSample(
                id=f"s{seed}-{i}",
                prompt_ids=rng.integers(1, VOCAB, prompt).astype(np.int32),
                completion_ids=rng.integers(1, VOCAB, L).astype(np.int32),
                behaviour_logprobs=(-np.log(vocab) + rng.normal(0, 0.3, L)).astype(np.float32),
                sigma=s.astype(np.float32),
                versions=np.full(L, version, np.int32),
                advantage=float(rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)),
            )
        )
    return out


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG, as they fail with ENOSPC on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal's default kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
