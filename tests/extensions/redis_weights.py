"""A weight transport from outside rredcot (``generation.weight_transport: tests.extensions.redis_weights``).

Each version's safetensors bytes live in a Redis key beside the manifest: no shared filesystem,
fine for small models. The receiver lands them with the ``file`` transport's engine-side function
(``apply_bytes``). A worked example of docs/extending.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import save

from rredcot.common.config import Config, bounded
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.streams import registry_key
from rredcot.transports import Deployment, WeightSource, WeightTransport
from rredcot.transports.file import FilePublisher, FileReceiver, apply_bytes
from rredcot.transports.manifest import WeightManifest, latest_manifest, publish_manifest, sha256_of


def blob_key(run_id: str, version: int) -> str:
    return f"rredcot:{run_id}:weights:blob:{version}"


@dataclass
class RedisBlobSettings:
    keep: int = bounded(2, 1, 1000)  # versions kept in Redis


class RedisBlobPublisher(FilePublisher):
    @classmethod
    def from_config(cls, cfg: Config, client: Any, out_dir: Path) -> RedisBlobPublisher:
        keep = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg).keep
        return cls(client, cfg.run.name, out_dir, keep=keep)

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        t0 = time.perf_counter()
        names, shapes, dtypes = weights.columns()
        # a bucket's tensors are valid until the next bucket is asked for: copy them out as they come
        state = {name: t.detach().to("cpu", copy=True) for bucket in weights.buckets() for name, t in bucket}
        data = save(state)
        self.client.sadd(registry_key(self.run_id), blob_key(self.run_id, version))  # cleared with the run
        self.client.set(blob_key(self.run_id, version), data)
        self.client.delete(blob_key(self.run_id, version - self.keep))  # keep the last ``keep`` versions
        manifest = WeightManifest(
            version,
            names,
            shapes,
            dtypes,
            checksum=sha256_of(data),
            path="",
            nbytes=len(data),
            created=time.time(),
            transport="redis_weights",
        )
        publish_manifest(self.client, self.run_id, manifest)
        return manifest, time.perf_counter() - t0


class RedisBlobReceiver(FileReceiver):
    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None:
            return None
        data = self.client.get(blob_key(self.run_id, manifest.version))
        if data is None:  # dropped by a newer version: take that one on the next poll
            return None
        return manifest.version, apply_bytes(self.engine, data, manifest.version, in_flight)


class RedisBlobDeployment(Deployment):
    def shared_run_dir(self, cfg: Config) -> bool:
        return False  # every receiver reads Redis


WEIGHT_TRANSPORTS.register("redis_weights")(
    WeightTransport(RedisBlobPublisher, RedisBlobReceiver, RedisBlobSettings, RedisBlobDeployment)
)
