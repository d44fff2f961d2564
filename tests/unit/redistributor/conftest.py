"""Shared fixtures: real tiny random Qwen models (small vocab where the real tokenizer is not needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from rredcot.common.models import load_tokenizer, qwen_tokenizer_dir, tiny_config


def small_lm(arch: str = "qwen3", seed: int = 0, vocab: int = 512) -> Any:
    """A random tiny causal LM (hidden 64, 2 layers) with a small vocabulary, fp32 eval."""
    cfg = tiny_config(arch, vocab_size=vocab)
    cfg.pad_token_id = cfg.eos_token_id = None
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def make_lm() -> Callable[..., Any]:
    return small_lm


@pytest.fixture(scope="session")
def qwen_tok() -> Any:
    return load_tokenizer(qwen_tokenizer_dir())
