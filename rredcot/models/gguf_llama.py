"""A llama GGUF as a Hugging Face checkpoint: the file read in one pass (``read_gguf``), its tensors
dequantised by the ``gguf`` package and put in transformers' names and layout (``llama_state_dict``),
with the ``LlamaConfig`` its metadata describes (``llama_config``).

transformers loads a GGUF by itself (``from_pretrained(gguf_file=...)``), but the demo model's
conversion took 21 s of CPU that way: it parses the file three times (config, weights, tokenizer) with
``gguf.GGUFReader``, which reads each of the tokenizer's 98k strings through a numpy memmap slice, and
it builds gguf's tensor-name table again for each of the model's 397 modules. Read here, the same
weights (bitwise: ``tests/unit/models/test_gguf_llama.py``) take 6 s, imports included
(``rredcot bench gguf_convert``, docs/benchmarks.md).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
# a value's type in the file (gguf's GGUFValueType) -> its struct format; 8 is a string, 9 an array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# llama.cpp's names of a block's tensors -> transformers' (``model.layers.N.`` + the name)
LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor as stored: its bytes (a view of the mapped file), GGML type and shape (row-major)."""

    raw: np.ndarray
    qtype: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]

    def dequantized(self) -> np.ndarray:
        """The values as float32, in ``shape``."""
        from gguf.quants import dequantize

        values = dequantize(self.raw, self.qtype)  # F32: a view of the read-only file
        return (values if values.flags.writeable else values.copy()).astype(np.float32, copy=False).reshape(self.shape)


@dataclass(frozen=True)
class GgufFile:
    path: Path
    meta: dict[str, Any]
    tensors: dict[str, GgufTensor]


class _Cursor:
    """Little-endian values read in order from a buffer; a read past its end names the file."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (it ends at byte {len(self.buf)})")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF file (a string runs past byte {len(self.buf)})")
        text = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in SCALARS:  # numbers in one read
                dtype = np.dtype("<" + SCALARS[item])
                end = self.pos + dtype.itemsize * count
                if end > len(self.buf):
                    raise ValueError(f"{self.path}: truncated GGUF file (an array runs past byte {len(self.buf)})")
                values = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
                self.pos = end
                return values
            return [self.value(item) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")
        return self.take(SCALARS[kind])


def read_gguf(path: str | Path) -> GgufFile:
    """The metadata and tensors of a GGUF file (version 2 or 3), the tensors as views of the mapped file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with open(path, "rb") as f:
        if not path.stat().st_size:
            raise ValueError(f"{path} is not a GGUF file (it is empty)")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if buf[:4] != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r}, not {MAGIC!r})")
    cur = _Cursor(buf, path)
    cur.pos = 4
    version, n_tensors, n_meta = cur.take("I"), cur.take("Q"), cur.take("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}; versions 2 and 3 can be read")
    meta = {}
    for _ in range(n_meta):
        key = cur.string()
        meta[key] = cur.value(cur.take("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("Q") for _ in range(cur.take("I"))]
        infos.append((name, dims, cur.take("I"), cur.take("Q")))
    align = meta.get("general.alignment", 32)
    start = -(-cur.pos // align) * align
    tensors = {}
    for name, dims, qtype, offset in infos:
        try:
            qtype = GGMLQuantizationType(qtype)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except ValueError:
            raise ValueError(
                f"{path}: tensor {name} has GGML type {qtype}, which the gguf package does not know"
            ) from None
        shape = tuple(reversed(dims))  # GGUF lists the fastest-varying dimension first
        row_bytes = shape[-1] // block * block_bytes
        nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * row_bytes
        if start + offset + nbytes > len(buf):
            raise ValueError(f"{path}: truncated GGUF file (tensor {name} runs past byte {len(buf)})")
        raw = np.frombuffer(buf, np.uint8, nbytes, start + offset).reshape(*shape[:-1], row_bytes)
        tensors[name] = GgufTensor(raw, qtype, shape)
    return GgufFile(path, meta, tensors)


def _llama(f: GgufFile) -> None:
    arch = f.meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{f.path}: general.architecture is {arch!r}; only 'llama' GGUFs can be converted")


def llama_config(f: GgufFile) -> Any:
    """The ``transformers.LlamaConfig`` of a llama GGUF's metadata (float32 weights)."""
    from transformers import LlamaConfig

    _llama(f)
    m = f.meta
    hidden, heads = m["llama.embedding_length"], m["llama.attention.head_count"]
    return LlamaConfig(
        vocab_size=m.get("llama.vocab_size", len(m.get("tokenizer.ggml.tokens", ()))),
        hidden_size=hidden,
        intermediate_size=m["llama.feed_forward_length"],
        num_hidden_layers=m["llama.block_count"],
        num_attention_heads=heads,
        num_key_value_heads=m.get("llama.attention.head_count_kv", heads),
        head_dim=m.get("llama.attention.key_length", hidden // heads),
        max_position_embeddings=m["llama.context_length"],
        rms_norm_eps=m["llama.attention.layer_norm_rms_epsilon"],
        rope_parameters={"rope_type": "default", "rope_theta": m.get("llama.rope.freq_base", 10000.0)},
        bos_token_id=m.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=m.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=m.get("tokenizer.ggml.padding_token_id"),
        unk_token_id=m.get("tokenizer.ggml.unknown_token_id"),
        tie_word_embeddings="output.weight" not in f.tensors,
        dtype="float32",
    )


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q and k with each head's rotary halves interleaved; transformers has them in halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_state_dict(f: GgufFile) -> dict[str, Any]:
    """A llama GGUF's weights as float32 torch tensors under transformers' ``LlamaForCausalLM`` names."""
    import torch

    _llama(f)
    heads = f.meta["llama.attention.head_count"]
    kv_heads = f.meta.get("llama.attention.head_count_kv", heads)
    state = {}
    for name, tensor in f.tensors.items():
        parts = name.split(".")
        w = tensor.dequantized()
        if parts[0] == "blk" and len(parts) == 4 and parts[2] in LLAMA_BLOCK:
            key = f"model.layers.{parts[1]}.{LLAMA_BLOCK[parts[2]]}.{parts[3]}"
            if parts[2] in ("attn_q", "attn_k"):
                w = _unpermute(w, heads if parts[2] == "attn_q" else kv_heads)
        elif len(parts) == 2 and parts[0] in LLAMA_TOP:
            key = f"{LLAMA_TOP[parts[0]]}.{parts[1]}"
        else:
            raise ValueError(f"{f.path}: tensor {name!r} has no place in a transformers llama model")
        state[key] = torch.from_numpy(np.ascontiguousarray(w))
    return state
