"""A model's shape before anything is built, downloaded or loaded: the ``config.json`` that
``model.path`` has (or, for a builtin, will have) and the parameter count it implies. The pre-start
checks read it: the model's context, and the memory a run's plan holds (``launch.checks.memory``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rredcot.models.smollm import BASE_DIR, BUILTINS, SMOLLM2_SHAPE
from rredcot.models.store import cache_dir
from rredcot.models.tiny import TINY_MODELS, tiny_fields


@dataclass(frozen=True)
class Shape:
    params: int
    vocab: int
    hidden: int
    layers: int


def model_config(path: str) -> dict[str, Any] | None:
    """``path``'s config.json as a dict: a builtin tiny model's is ``tiny_fields``; a SmolLM2
    builtin's is the converted base's (every chain model has its shape), or ``SMOLLM2_SHAPE`` before
    the conversion; a directory's is its file. None for a hub id or a file that cannot be read."""
    if path in TINY_MODELS:
        return tiny_fields()
    config = (cache_dir() / "models" / BASE_DIR if path in BUILTINS else Path(path)) / "config.json"
    try:
        return json.loads(config.read_text())
    except (OSError, ValueError):
        return dict(SMOLLM2_SHAPE) if path in BUILTINS else None


def parameter_count(config: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer of this config: embeddings (once when tied), and per
    layer the attention's four projections (grouped key/value heads), a gated MLP's three and two
    norms. Biases and query/key norms are left out (under 0.1% of any model of the Qwen or Llama
    families: tests/unit/models/test_shape.py)."""
    vocab, hidden, layers = config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    mlp = config.get("intermediate_size") or 4 * hidden
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    per_layer = attention + 3 * hidden * mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * per_layer + hidden


def model_shape(path: str) -> Shape | None:
    """``path``'s size (None when its config is unknown here, or not a decoder's)."""
    config = model_config(path)
    try:
        return Shape(parameter_count(config), config["vocab_size"], config["hidden_size"], config["num_hidden_layers"])
    except (TypeError, KeyError, ZeroDivisionError):
        return None
