"""The ``redis`` transport on a real Redis server: a version streamed into chunks and read back
byte for byte, old versions dropped, a chunk evicted or corrupted."""

from __future__ import annotations

import logging
import math

import pytest
import redis
import torch
from safetensors.torch import load as st_load

from rredcot.common.streams import registry_key
from rredcot.learner.weights import ModelWeights, gathered_buckets, publish
from rredcot.transports.manifest import WeightSyncError, latest_manifest, publish_manifest
from rredcot.transports.redis import ChunkWriter, RedisPublisher, RedisReceiver, RedisSettings, chunk_key
from tests.unit.transports.stand_in import StandInPort


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3, bias=False))


def _publish_chunked(client, run_id: str, model: torch.nn.Module, version: int, chunk_bytes: int):
    writer = ChunkWriter(client, run_id, version, chunk_bytes, *ModelWeights(model).columns())
    for name, tensor in model.named_parameters():
        writer.write(name, tensor)
    manifest = writer.commit()
    publish_manifest(client, run_id, manifest)
    return manifest


def test_a_version_in_chunks_reads_back_as_its_safetensors_bytes(redis_client, run_id):
    """(7·5 + 5 + 5·3) float32 = 220 bytes of tensors plus the header, in chunks of 64 bytes: the
    receiver joins them into a valid safetensors file holding every tensor exactly."""
    model, engine = _model(0), StandInPort()
    manifest = _publish_chunked(redis_client, run_id, model, 1, 64)
    assert manifest.transport == "redis" and manifest.shared["chunks"] == math.ceil(manifest.nbytes / 64) > 3
    receiver = RedisReceiver(redis_client, run_id, engine, "gen0")
    assert receiver.poll()[0] == 1 and len(engine.data) == manifest.nbytes
    tensors = st_load(engine.data)
    assert set(tensors) == {n for n, _ in model.named_parameters()}
    assert all(torch.equal(tensors[n], p.detach()) for n, p in model.named_parameters())
    assert receiver.poll() is None  # applied once
    keys = {k.decode() for k in redis_client.smembers(registry_key(run_id))}
    assert {chunk_key(run_id, 1, i) for i in range(manifest.shared["chunks"])} <= keys  # cleared with the run


def test_the_publisher_keeps_the_newest_versions_only(redis_client, run_id):
    publisher = RedisPublisher(redis_client, run_id, RedisSettings(chunk_mb=1, keep=1))
    engine = StandInPort()
    receiver = RedisReceiver(redis_client, run_id, engine, "gen0")
    for version, seed in ((1, 0), (2, 1)):
        manifest, seconds = publish(publisher, _model(seed), version)
        assert manifest is not None and manifest.shared == {"chunks": 1} and seconds > 0
    assert not redis_client.exists(chunk_key(run_id, 1, 0)) and redis_client.exists(chunk_key(run_id, 2, 0))
    assert receiver.poll()[0] == 2
    assert torch.equal(st_load(engine.data)["0.weight"], _model(1)[0].weight.detach())


def test_a_chunk_replaced_by_a_newer_version_is_skipped_for_it(redis_client, run_id, caplog):
    receiver = RedisReceiver(redis_client, run_id, StandInPort(), "gen0")
    old = _publish_chunked(redis_client, run_id, _model(0), 1, 64)
    _publish_chunked(redis_client, run_id, _model(1), 2, 64)
    redis_client.delete(chunk_key(run_id, 1, 0))  # the publisher dropped v1
    with caplog.at_level(logging.ERROR, logger="rredcot.transports.redis"):
        assert receiver._fetch(old) is None  # read between the two publications
    assert receiver.missing_files == 0 and not caplog.records
    assert receiver.poll()[0] == 2


def test_an_evicted_chunk_is_an_error_counted_once_and_retried(redis_client, run_id, caplog):
    engine = StandInPort()
    receiver = RedisReceiver(redis_client, run_id, engine, "gen0")
    manifest = _publish_chunked(redis_client, run_id, _model(0), 1, 64)
    kept = redis_client.get(chunk_key(run_id, 1, 2))
    redis_client.delete(chunk_key(run_id, 1, 2))  # maxmemory evicted it; no newer version exists
    with caplog.at_level(logging.ERROR, logger="rredcot.transports.redis"):
        assert receiver.poll() is None and receiver.poll() is None
    assert receiver.missing_files == 1 and len(caplog.records) == 1 and "maxmemory" in caplog.text
    redis_client.set(chunk_key(run_id, 1, 2), kept)
    assert receiver.poll()[0] == 1 and len(engine.data) == manifest.nbytes


def test_a_corrupted_chunk_is_refused(redis_client, run_id):
    _publish_chunked(redis_client, run_id, _model(0), 1, 64)
    chunk = bytearray(redis_client.get(chunk_key(run_id, 1, 1)))
    chunk[0] ^= 1
    redis_client.set(chunk_key(run_id, 1, 1), bytes(chunk))
    with pytest.raises(WeightSyncError, match="do not match their manifest"):
        RedisReceiver(redis_client, run_id, StandInPort(), "gen0").poll()


def test_rank_0_refused_by_a_full_redis_joins_every_gather_and_leaves_no_chunk(redis_client, run_id, monkeypatch):
    """Redis at ``maxmemory`` (no eviction) refuses a chunk mid-version: rank 0 still takes part in
    every bucket's gather (the other ZeRO-3 ranks wait in them), deletes the chunks it wrote and
    raises; no manifest is published."""
    seen: list[int] = []

    def counted(module, bucket_bytes=0):
        for i, bucket in enumerate(gathered_buckets(module, bucket_bytes=2**20)):
            seen.append(i)
            yield bucket

    monkeypatch.setattr("rredcot.learner.weights.gathered_buckets", counted)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # 4 MiB in 4+ buckets
    publisher = RedisPublisher(redis_client, run_id, RedisSettings(chunk_mb=1))
    written: list[int] = []
    flush = ChunkWriter._flush

    def counting_flush(self, n):
        flush(self, n)
        written.append(self.chunks)

    monkeypatch.setattr(ChunkWriter, "_flush", counting_flush)
    used = int(redis_client.info("memory")["used_memory"])
    old = redis_client.config_get("maxmemory")["maxmemory"]
    redis_client.config_set("maxmemory", used + 5 * 2**19)  # room for about 2.5 chunks
    try:
        with pytest.raises(redis.RedisError, match="maxmemory"):
            publish(publisher, model, 1)
    finally:
        redis_client.config_set("maxmemory", old)
    assert written and len(seen) == len(list(gathered_buckets(model, bucket_bytes=2**20))) > 3
    assert not any(redis_client.exists(chunk_key(run_id, 1, i)) for i in range(len(written) + 1))
    assert latest_manifest(redis_client, run_id) is None
