"""The ``file`` transport: one safetensors file plus its manifest per version, read by any receiver
on the learner's filesystem.

Publisher (``FilePublisher``, learner rank 0): streams the version's file to disk bucket by bucket
as the learner gathers them (``WeightWriter`` of ``transports.manifest``: the SHA-256 computed while
writing), then publishes its manifest. Host memory: one tensor at a time.

Receiver (``FileReceiver``; the other built-ins' receivers extend it, files being their fallback):
applies each newer published version to a weight port (``transports.ports.WeightPort``). One
receiver per port; a port outside the learner's weight group (``rank=None``: the evaluator, a
scorer, a continuation engine) follows files. ``poll`` applies the newest published version if it
is newer than the port's, under the in-flight policy, and returns (version, seconds of the update);
None when there is nothing new (or nothing readable yet: a pruned file means a newer version
exists, taken on the next poll).

A file that the newest manifest names and that this node cannot find was never pruned: the
receiver does not share the learner's filesystem. That is logged as an error (once per version,
naming the path and the fix), counted in ``missing_files`` (the generator's ``weight_files_missing``
metric), and retried on every poll.

Engine side: ``land_bytes`` (a version's safetensors bytes, loaded where the port's weights are);
``apply_bytes`` moves bytes into a port (the ``redis`` transport's receiver uses it too).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import redis
from safetensors.torch import load as st_load

from rredcot.common.config import Config
from rredcot.transports import WeightSource
from rredcot.transports.manifest import (
    WeightManifest,
    WeightWriter,
    latest_manifest,
    publish_manifest,
    published_version,
    read_weights,
)
from rredcot.transports.ports import Landing, WeightPort, function_ref

log = logging.getLogger(__name__)


class FilePublisher:
    """The ``file`` transport's publisher: streams each version's safetensors file to disk and
    publishes its manifest (``transports.manifest``)."""

    def __init__(self, client: redis.Redis, run_id: str, out_dir: str | Path, keep: int = 2) -> None:
        self.client, self.run_id, self.out_dir, self.keep = client, run_id, Path(out_dir), keep
        self.send_s = 0.0  # seconds spent in background sends (none here)
        self.fallbacks = 0  # versions re-published as files after a failed send (none here)

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, out_dir: Path) -> FilePublisher:
        return cls(client, cfg.run.name, out_dir)

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (the manifest, seconds here)."""
        t0 = time.perf_counter()
        with WeightWriter(version, *weights.columns(), self.out_dir) as writer:
            for bucket in weights.buckets():
                for name, tensor in bucket:
                    writer.write(name, tensor)
            manifest = writer.commit(self.keep)
        publish_manifest(self.client, self.run_id, manifest)
        return manifest, time.perf_counter() - t0

    def wait(self) -> None:
        """Block until the send in flight (if any) has finished."""

    def close(self) -> None:
        self.wait()


def land_bytes(landing: Landing, data: bytes) -> int:
    """Engine side: a version's safetensors bytes, held on the landing; returns the tensor count."""
    return landing.hold(st_load(bytes(data)))


def apply_bytes(port: WeightPort, data: bytes, version: int, in_flight: str = "finish") -> float:
    """``data`` (safetensors) into ``port`` as ``version``; the seconds of the update (loading the bytes
    and applying them, not the wait for requests in flight)."""
    t0 = time.perf_counter()
    port.receive(function_ref(land_bytes), data=data)
    loaded = time.perf_counter() - t0
    return loaded + port.apply(version, in_flight)


def receiver_name(rank: int | None, name: str | None) -> str:
    """A receiver's name in logs and in the learner's set of file readers: ``name``, else
    ``gen<rank>``, or ``eval`` outside the weight group."""
    return name or (f"gen{rank}" if rank is not None else "eval")


class FileReceiver:
    """``file``: read the version's safetensors file (verified against the manifest's checksum)."""

    def __init__(self, client: Any, run_id: str, engine: WeightPort, name: str = "") -> None:
        self.client, self.run_id, self.engine, self.name = client, run_id, engine, name
        self.missing_files = 0  # versions whose file this node could not find (no shared filesystem)
        self._missing: int | None = None  # the last such version (logged once)

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: WeightPort, rank: int | None, name: str | None = None
    ) -> FileReceiver:
        """The receiver of generator ``rank`` (None: a port outside the weight group), named ``name``
        in logs and in the learner's set of file readers (default ``gen<rank>``, or ``eval``)."""
        return cls(client, cfg.run.name, engine, receiver_name(rank, name))

    @property
    def holds_group(self) -> bool:
        """Whether the learner's sends wait for this receiver (then it polls until the run ends)."""
        return False

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        return self._apply_file(latest_manifest(self.client, self.run_id, newer_than=self.engine.version), in_flight)

    def _apply_file(self, manifest: WeightManifest | None, in_flight: str) -> tuple[int, float] | None:
        if manifest is None or not manifest.path:  # broadcast only: the learner writes a file for outsiders
            return None
        try:
            data = read_weights(manifest)
        except FileNotFoundError:  # pruned by a newer publication (taken next time), or never on this node
            if published_version(self.client, self.run_id) <= manifest.version:
                self.report_missing(manifest)
            return None
        return manifest.version, apply_bytes(self.engine, data, manifest.version, in_flight)

    def report_missing(self, manifest: WeightManifest, why: str = "") -> None:
        """Say once per version that ``manifest``'s weights cannot be read here although no newer
        version replaced them (``why``; by default: this node does not see the learner's files), and
        count it in ``missing_files``; the receiver retries on every poll."""
        if self._missing == manifest.version:
            return
        self._missing = manifest.version
        self.missing_files += 1
        why = why or (
            f"are published as {manifest.path}, which does not exist on this node and no newer version "
            "pruned it: this receiver does not share the learner's filesystem. Put run.dir on a filesystem "
            "that every node mounts, or use generation.weight_transport=redis or collective"
        )
        log.error("%s: weights v%d %s; retrying", self.name, manifest.version, why)

    def close(self) -> None:
        """Nothing to release (files are pruned by the publisher)."""
