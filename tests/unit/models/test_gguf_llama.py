"""The GGUF reader against transformers' own GGUF loader, on a tiny llama written here with gguf's writer:
the same weights bitwise, the same config; and what a broken file says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rredcot.models.gguf_llama import _unpermute, llama_config, llama_state_dict, read_gguf

SHAPE = {"hidden": 64, "ffn": 128, "layers": 2, "heads": 2, "kv_heads": 1, "vocab": 64}
CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
)


def write_tiny_llama(path: Path, arch: str = "llama") -> Path:
    """A 2-block llama GGUF: matrices in Q4_1 (the demo model's type) and Q8_0, norms in F32, a byte-level
    vocabulary; no output.weight (tied, as the demo model)."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    h, f, kv = SHAPE["hidden"], SHAPE["ffn"], SHAPE["hidden"] // SHAPE["heads"] * SHAPE["kv_heads"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(SHAPE["layers"])
    w.add_context_length(256)
    w.add_embedding_length(h)
    w.add_feed_forward_length(f)
    w.add_head_count(SHAPE["heads"])
    w.add_head_count_kv(SHAPE["kv_heads"])
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(SHAPE["vocab"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(SHAPE["vocab"])])
    w.add_token_types([1] * SHAPE["vocab"])
    w.add_token_merges(["t 1", "t 2"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)

    def matrix(name: str, rows: int, cols: int, qtype: Q) -> None:
        data = rng.standard_normal((rows, cols)).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    matrix("token_embd.weight", SHAPE["vocab"], h, Q.Q8_0)
    for b in range(SHAPE["layers"]):
        for name, rows, cols in (("attn_q", h, h), ("attn_k", kv, h), ("attn_v", kv, h), ("attn_output", h, h)):
            matrix(f"blk.{b}.{name}.weight", rows, cols, Q.Q4_1)
        for name, rows, cols in (("ffn_gate", f, h), ("ffn_up", f, h), ("ffn_down", h, f)):
            matrix(f"blk.{b}.{name}.weight", rows, cols, Q.Q4_1)
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{b}.{name}.weight", rng.standard_normal(h).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(h).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(module_dir: Path) -> Path:
    return write_tiny_llama(module_dir / "tiny.gguf")


def test_the_weights_and_config_are_transformers_own(tiny_gguf: Path):
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(tiny_gguf.parent, gguf_file=tiny_gguf.name, dtype=torch.float32)
    f = read_gguf(tiny_gguf)
    ours = llama_state_dict(f)
    expected = {k: v for k, v in theirs.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    assert set(ours) == set(expected)
    assert [k for k in expected if not torch.equal(ours[k], expected[k])] == []
    config = llama_config(f)
    assert {k: getattr(config, k) for k in CONFIG_FIELDS} == {k: getattr(theirs.config, k) for k in CONFIG_FIELDS}
    assert config.rope_parameters["rope_theta"] == 50000.0 and config.tie_word_embeddings
    assert f.meta["tokenizer.ggml.tokens"][:3] == ["t0", "t1", "t2"] and f.meta["tokenizer.ggml.merges"] == [
        "t 1",
        "t 2",
    ]


def test_unpermute_puts_each_heads_rotary_halves_back_in_order():
    """llama.cpp interleaves a head's two rotary halves row by row: rows a0 b0 a1 b1 are a0 a1 b0 b1."""
    rows = np.arange(8)[:, None]  # two heads of four rows
    assert _unpermute(rows, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_a_broken_file_says_what_is_wrong_with_it(tiny_gguf: Path, tmp_path: Path):
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00" + bytes(60))
    with pytest.raises(ValueError, match=r"model.safetensors is not a GGUF file \(it starts with"):
        read_gguf(other)
    empty = tmp_path / "empty.gguf"
    empty.touch()
    with pytest.raises(ValueError, match=r"empty.gguf is not a GGUF file \(it is empty\)"):
        read_gguf(empty)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"cut.gguf: truncated GGUF file \(tensor blk\.\d+\.\w+\.weight runs past"):
        read_gguf(cut)
    header = tmp_path / "header.gguf"
    header.write_bytes(tiny_gguf.read_bytes()[:200])
    with pytest.raises(ValueError, match="header.gguf: truncated GGUF file"):
        read_gguf(header)
    gpt2 = write_tiny_llama(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="general.architecture is 'gpt2'; only 'llama' GGUFs can be converted"):
        llama_state_dict(read_gguf(gpt2))
