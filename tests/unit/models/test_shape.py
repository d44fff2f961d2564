"""A model's shape read before anything is built: the parameter count against the exact count of
the model instantiated without weights, and where each kind of ``model.path`` gets its config."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rredcot.models.shape import model_config, model_shape, parameter_count
from rredcot.models.smollm import BUILTINS, SMOLLM2_SHAPE
from rredcot.models.tiny import tiny_config, tiny_fields

# Qwen2.5-1.5B's and Qwen2.5-7B's shapes: query/key/value biases, a 7B with untied embeddings
QWEN25 = {
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}  # fmt: skip


def exact_count(config: dict) -> int:
    """The parameters of the model transformers builds from ``config``, on the meta device."""
    hf = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "config",
    [
        tiny_fields(),
        tiny_fields("qwen2", tie=False),
        SMOLLM2_SHAPE,
        {"model_type": "qwen2", **QWEN25["1.5b"]},
        {"model_type": "qwen2", **QWEN25["7b"]},
    ],
    ids=["tiny-qwen3", "tiny-qwen2-untied", "smollm2-135m", "qwen2.5-1.5b", "qwen2.5-7b"],
)
def test_the_parameter_count_is_within_a_tenth_of_a_percent_of_the_built_model(config: dict) -> None:
    exact = exact_count(config)
    assert abs(parameter_count(config) - exact) <= 0.001 * exact, (parameter_count(config), exact)


def test_smollm2_by_hand() -> None:
    """576·49152 tied embeddings; a layer: q and o 576·576 each, k and v 576·192 each, the MLP
    3·576·1536, two norms; the final norm."""
    layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    assert parameter_count(SMOLLM2_SHAPE) == 576 * 49152 + 30 * layer + 576 == 134_515_008


def test_each_kind_of_path_has_its_config_before_anything_is_built(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path / "empty-cache"))  # nothing converted yet
    assert model_config("tiny-qwen3-arith") == tiny_fields()
    assert all(model_config(name) == SMOLLM2_SHAPE for name in BUILTINS)
    assert model_shape("smollm2-135m-chain-short").params == 134_515_008
    local = tmp_path / "mine"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({"model_type": "qwen2", **QWEN25["7b"]}))
    assert model_shape(str(local)).vocab == 152064
    assert model_shape("Qwen/Qwen2.5-7B") is None  # a hub id: nothing is downloaded
    (local / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    assert model_shape(str(local)) is None  # not a decoder this count knows


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_a_tiny_models_fields_are_those_of_its_transformers_config(arch: str) -> None:
    built = tiny_config(arch, tie=False).to_dict()
    assert {k: built[k] for k in tiny_fields(arch)} == tiny_fields(arch, tie=False)


def test_the_checks_read_a_tiny_models_shape_without_importing_transformers() -> None:
    """The driver of every run of a tiny model (the tests') reads its shape: importing transformers
    for it cost 1.5-3 CPU-s a run."""
    code = (
        "import sys; from rredcot.models.shape import model_shape; "
        "assert model_shape('tiny-qwen3-arith').layers == 2; print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out
