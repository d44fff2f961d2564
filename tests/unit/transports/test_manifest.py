"""The weight-sync protocol against a real embedded Redis-protocol server."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from rredcot.transports.manifest import (
    WeightManifest,
    WeightSyncError,
    WeightWriter,
    latest_manifest,
    load_tensors,
    publish_weights,
    read_weights,
    write_weights,
)
from tests.learner_samples import tiny_lm


def test_publish_roundtrip_hf_names_and_pruning(redis_client, run_id, tmp_path):
    model = tiny_lm(0)
    assert latest_manifest(redis_client, run_id) is None
    for v in range(4):
        with torch.no_grad():
            model.model.norm.weight.fill_(float(v))
        m = publish_weights(redis_client, run_id, v, model.named_parameters(), tmp_path)
    got = latest_manifest(redis_client, run_id)
    assert got == m and got.version == 3
    tensors = load_tensors(got)
    assert got.names == [n for n, _ in model.named_parameters()] and set(tensors) == set(got.names)
    for name, p in model.named_parameters():
        assert torch.equal(tensors[name], p.detach()), name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "weights-v00000002.safetensors",
        "weights-v00000003.safetensors",
    ]
    # a fresh model loading these weights by HF name reproduces the logits
    other = tiny_lm(1)
    other.load_state_dict(tensors, strict=False)
    x = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(other(x).logits, model(x).logits)


def test_checksum_mismatch_and_pruned_file(redis_client, run_id, tmp_path):
    m = publish_weights(redis_client, run_id, 0, [("a", torch.arange(6.0).view(2, 3))], tmp_path)
    data = bytearray(read_weights(m))
    data[-1] ^= 0xFF
    with open(m.path, "wb") as f:
        f.write(data)
    with pytest.raises(WeightSyncError, match="does not match its manifest"):
        read_weights(m)
    publish_weights(redis_client, run_id, 1, [("a", torch.zeros(1))], tmp_path, keep=1)
    with pytest.raises(FileNotFoundError):
        read_weights(m)


def test_prune_removes_a_dead_writers_partial_file_and_keeps_its_own(redis_client, run_id, tmp_path):
    dead = tmp_path / "weights-v00000003.tmp999999999"  # a learner killed while writing version 3
    dead.write_bytes(b"x" * 64)
    publish_weights(redis_client, run_id, 4, [("a", torch.zeros(1))], tmp_path, keep=1)
    assert not dead.exists() and [p.name for p in tmp_path.iterdir()] == ["weights-v00000004.safetensors"]
    mine = tmp_path / f"weights-v00000005.tmp{os.getpid()}"  # this process is writing it now
    mine.write_bytes(b"")
    publish_weights(redis_client, run_id, 6, [("a", torch.zeros(1))], tmp_path, keep=1)
    assert mine.exists()


def test_manifest_encoding_is_msgpack_not_pickle():
    m = WeightManifest(3, ["x"], [[2]], ["bfloat16"], "sha256:00", "/p", 10)
    raw = m.encode()
    assert b"\x80\x04" not in raw[:2]  # no pickle protocol header
    assert WeightManifest.decode(raw) == m
    with pytest.raises(WeightSyncError, match="not a weight manifest"):
        WeightManifest.decode(b"\x93\x01")


def test_newer_than_polls_only_the_version(redis_client, run_id, tmp_path):
    assert latest_manifest(redis_client, run_id, newer_than=0) is None  # nothing published yet
    publish_weights(redis_client, run_id, 3, [("w", torch.ones(2))], tmp_path)
    assert latest_manifest(redis_client, run_id, newer_than=3) is None
    assert latest_manifest(redis_client, run_id, newer_than=2).version == 3


def test_the_streamed_file_is_plain_safetensors_and_its_checksum_covers_every_byte(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7).to(torch.bfloat16),  # odd bytes: the next tensor starts unaligned
        "c": torch.arange(6).view(2, 3),
        "d": torch.tensor(2.5),
        "e": torch.randn(4, 1, 2).transpose(0, 2),  # not contiguous
        "f": torch.zeros(0, 3),
    }
    m = write_weights(4, tensors.items(), tmp_path)
    data = Path(m.path).read_bytes()
    assert m.nbytes == len(data) and m.checksum == "sha256:" + hashlib.sha256(data).hexdigest()
    for loaded in (load_file(m.path), load_tensors(m)):  # safetensors' own reader and ours
        assert all(loaded[n].dtype == t.dtype and torch.equal(loaded[n], t) for n, t in tensors.items())
    with safe_open(m.path, "pt") as f:
        assert f.metadata() == {"version": "4"}
    assert [p.name for p in tmp_path.iterdir()] == ["weights-v00000004.safetensors"]  # no temporary left


def test_the_file_is_streamed_never_held_whole_in_memory(tmp_path):
    tensors = [(f"w{i}", torch.randn(256, 1024)) for i in range(4)]  # 1 MiB each
    tracemalloc.start()
    try:
        write_weights(1, tensors, tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20  # not one serialised copy of the 4 MiB file


def test_a_writer_left_without_its_tensors_leaves_nothing(tmp_path):
    with (
        pytest.raises(WeightSyncError, match="not the next one"),
        WeightWriter(2, ["a"], [[2]], ["float32"], tmp_path) as w,
    ):
        w.write("a", torch.zeros(3))
    with (
        pytest.raises(WeightSyncError, match="0 of 1 tensors"),
        WeightWriter(2, ["a"], [[2]], ["float32"], tmp_path) as w,
    ):
        w.commit()
    with pytest.raises(WeightSyncError, match="complex64 cannot be written"):
        WeightWriter(2, ["c"], [[2]], ["complex64"], tmp_path)
    assert not any(tmp_path.iterdir())
