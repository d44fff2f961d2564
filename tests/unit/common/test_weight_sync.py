"""The weight-sync protocol against a real embedded Redis-protocol server."""

from __future__ import annotations

import pytest
import torch

from rredcot.common.weight_sync import (
    WeightManifest,
    WeightSyncError,
    latest_manifest,
    load_tensors,
    publish_weights,
    read_weights,
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
