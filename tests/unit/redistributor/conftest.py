"""Shared fixtures: real tiny random Qwen models (small vocab where the real tokenizer is not needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rredcot.models.tiny import build_tiny_model


def small_lm(arch: str = "qwen3", seed: int = 0, vocab: int = 512) -> Any:
    """A random tiny causal LM (hidden 64, 2 layers) with a small vocabulary, fp32 eval."""
    return build_tiny_model(arch, seed=seed, vocab_size=vocab)


@pytest.fixture(scope="session")
def make_lm() -> Callable[..., Any]:
    return small_lm


@pytest.fixture(scope="module")
def qwen_model() -> Any:
    """A random tiny Qwen3 with the real Qwen3 vocabulary (for the real tokenizer), fp32 eval."""
    return build_tiny_model("qwen3", seed=3)
