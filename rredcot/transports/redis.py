"""The ``redis`` transport: each version's safetensors bytes in the run's Redis, in chunks, beside
its manifest: weights reach every node that reaches Redis, with no filesystem shared between nodes.

Publisher (``RedisPublisher``, learner rank 0): streams the version's safetensors bytes
(``transports.manifest.SafetensorsStream``, the SHA-256 computed as they go) into keys of
``chunk_mb`` MiB each as the learner gathers the buckets, then publishes the manifest
(``transport="redis"``, ``shared`` = the chunk count) and deletes the chunks of the version ``keep``
versions back. Host memory: one chunk and one tensor.

Receiver (``RedisReceiver``): fetches the newest version's chunks, checks their length and checksum
against the manifest, and applies them to its weight port. A chunk that is gone means a newer
version replaced it (taken on the next poll), unless no newer version exists: then Redis dropped it
(``maxmemory`` with an eviction policy), which is logged as an error once per version, counted in
``missing_files`` and retried.

What it costs: Redis holds ``keep`` versions (a 1.5B-parameter model in bf16: 3 GB each; leave room
under ``maxmemory``), every receiver reads each version through the one Redis server, and a server
with an append-only file (the embedded one) writes every version to its disk as well. For large
models on a cluster prefer ``collective`` (NCCL); this transport is for clusters without a shared
filesystem where a broadcast group is not an option, and for models of up to a few GB.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from rredcot.common.config import Config, bounded
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.streams import key, registry_key
from rredcot.transports import Deployment, WeightSource
from rredcot.transports.file import FileReceiver, apply_bytes, receiver_name
from rredcot.transports.manifest import (
    SafetensorsStream,
    WeightManifest,
    WeightSyncError,
    latest_manifest,
    publish_manifest,
    published_version,
    sha256_of,
)
from rredcot.transports.ports import WeightPort

log = logging.getLogger(__name__)
MIB = 2**20


@dataclass
class RedisSettings:
    """``generation.transport_settings`` of ``redis``."""

    chunk_mb: int = bounded(64, 1, 511)  # MiB per key (a Redis string holds at most 512 MB)
    keep: int = bounded(2, 1, 100)  # versions held in Redis


def chunk_key(run_id: str, version: int, index: int) -> str:
    return key(run_id, f"weights:v{version}:chunk:{index}")


class ChunkWriter(SafetensorsStream):
    """Streams one version's safetensors bytes into Redis keys of ``chunk_bytes`` each."""

    def __init__(self, client: redis.Redis, run_id: str, version: int, chunk_bytes: int, *header: Any) -> None:
        super().__init__(version, *header)
        self.client, self.run_id, self.chunk_bytes = client, run_id, chunk_bytes
        self.chunks = 0
        self._buffer = bytearray()
        self._start()

    def _sink(self, data: bytes | memoryview) -> None:
        self._buffer += data
        while len(self._buffer) >= self.chunk_bytes:
            self._flush(self.chunk_bytes)

    def _flush(self, n: int) -> None:
        name = chunk_key(self.run_id, self.version, self.chunks)
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(registry_key(self.run_id), name)  # cleared with the run
        pipe.set(name, bytes(self._buffer[:n]))
        pipe.execute()
        del self._buffer[:n]
        self.chunks += 1

    def commit(self) -> WeightManifest:
        """The last chunk; the version's manifest (not yet published)."""
        manifest = self._finished(f"redis version {self.version}")
        if self._buffer:
            self._flush(len(self._buffer))
        return replace(manifest, transport="redis", shared={"chunks": self.chunks})


def delete_version(client: redis.Redis, run_id: str, version: int, chunks: int) -> None:
    """Drop the ``chunks`` chunks of ``version`` (every version of a run's model has as many: its
    size does not change; a version that is gone already costs nothing)."""
    if version >= 0 and chunks:
        names = [chunk_key(run_id, version, i) for i in range(chunks)]
        client.delete(*names)
        client.srem(registry_key(run_id), *names)


class RedisPublisher:
    """The ``redis`` transport's publisher: streams each version into Redis and publishes its manifest."""

    def __init__(self, client: redis.Redis, run_id: str, settings: RedisSettings) -> None:
        self.client, self.run_id, self.settings = client, run_id, settings
        self.send_s = 0.0  # seconds spent in background sends (none here)
        self.fallbacks = 0  # versions re-published as files after a failed send (none here)

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, out_dir: Path) -> RedisPublisher:
        return cls(client, cfg.run.name, WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg))

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (its manifest, seconds here)."""
        t0 = time.perf_counter()
        writer = ChunkWriter(self.client, self.run_id, version, self.settings.chunk_mb * MIB, *weights.columns())
        try:
            for bucket in weights.buckets():
                for name, tensor in bucket:
                    writer.write(name, tensor)
            manifest = writer.commit()
        except redis.RedisError:  # e.g. out of memory: the chunks written so far go
            delete_version(self.client, self.run_id, version, writer.chunks)
            raise
        publish_manifest(self.client, self.run_id, manifest)
        delete_version(self.client, self.run_id, version - self.settings.keep, writer.chunks)
        return manifest, time.perf_counter() - t0

    def wait(self) -> None:
        """Nothing is sent in the background."""

    def close(self) -> None:
        """Nothing to release (the run's keys are cleared with the run)."""


class RedisReceiver(FileReceiver):
    """``redis``: read the version's chunks (verified against the manifest's length and checksum)."""

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: WeightPort, rank: int | None, name: str | None = None
    ) -> RedisReceiver:
        return cls(client, cfg.run.name, engine, receiver_name(rank, name))

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None:
            return None
        data = self._fetch(manifest)
        if data is None:
            return None
        return manifest.version, apply_bytes(self.engine, data, manifest.version, in_flight)

    def _fetch(self, manifest: WeightManifest) -> bytes | None:
        """The version's bytes, or None when a chunk is gone (replaced by a newer version, or dropped)."""
        names = [chunk_key(self.run_id, manifest.version, i) for i in range(manifest.shared["chunks"])]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.get(name)
        chunks = pipe.execute()
        if any(c is None for c in chunks):
            if published_version(self.client, self.run_id) <= manifest.version:
                self.report_missing(
                    manifest,
                    "are published but some of their chunks are gone from Redis and no newer version replaced "
                    "them: the server evicted them (maxmemory). Give Redis room for "
                    "generation.transport_settings.keep versions, or use another weight transport",
                )
            return None
        data = b"".join(chunks)
        if len(data) != manifest.nbytes or sha256_of(data) != manifest.checksum:
            raise WeightSyncError(
                f"weights v{manifest.version} in Redis do not match their manifest: {len(data)} bytes, "
                f"expected {manifest.nbytes} with {manifest.checksum}"
            )
        return data


class RedisDeployment(Deployment):
    """Every receiver reads the run's Redis: no node needs the learner's ``run.dir``."""

    def shared_run_dir(self, cfg: Config) -> bool:
        return False
