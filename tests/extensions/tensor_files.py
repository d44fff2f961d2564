"""A weight transport from outside rredcot with an engine path of its own
(``generation.weight_transport: tests.extensions.tensor_files``).

The publisher writes each version into ``run.dir`` as a directory of raw tensor files (tensor ``i``'s
bytes in ``i.bin``) and a JSON index of their names, shapes and dtypes, then publishes its manifest.
The receiver hands only the directory's path to its engine-side function ``land_files``, which reads
the files itself where the weights land (inside each vLLM worker, or a scorer's process): no weight
bytes cross the call. Every receiver must see the learner's ``run.dir`` (the default ``Deployment``).
A worked example of docs/extending.md.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rredcot.common.config import Config, bounded
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.transports import WeightSource, WeightTransport
from rredcot.transports.file import FilePublisher, FileReceiver
from rredcot.transports.manifest import WeightManifest, latest_manifest, publish_manifest, published_version
from rredcot.transports.ports import Landing, function_ref

INDEX = "index.json"


@dataclass
class TensorFilesSettings:
    keep: int = bounded(2, 1, 100)  # versions kept on disk


class TensorFilesPublisher(FilePublisher):
    @classmethod
    def from_config(cls, cfg: Config, client: Any, out_dir: Path) -> TensorFilesPublisher:
        keep = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg).keep
        return cls(client, cfg.run.name, out_dir, keep=keep)

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        t0 = time.perf_counter()
        names, shapes, dtypes = weights.columns()
        final = (self.out_dir / f"tensors-v{version:08d}").resolve()
        partial = final.with_name(f".{final.name}.partial")  # renamed into place once whole
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        i = nbytes = 0
        for bucket in weights.buckets():  # valid until the next bucket is asked for: written at once
            for _, tensor in bucket:
                data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
                data.tofile(partial / f"{i}.bin")
                i, nbytes = i + 1, nbytes + data.nbytes
        (partial / INDEX).write_text(json.dumps({"names": names, "shapes": shapes, "dtypes": dtypes}))
        shutil.rmtree(final, ignore_errors=True)  # a restarted learner publishing this version again
        partial.rename(final)
        manifest = WeightManifest(
            version,
            names,
            shapes,
            dtypes,
            checksum="",
            path=str(final),
            nbytes=nbytes,
            created=time.time(),
            transport="tensor_files",
        )
        publish_manifest(self.client, self.run_id, manifest)
        for old in sorted(self.out_dir.glob("tensors-v*"))[: -self.keep]:  # keep the last ``keep`` versions
            shutil.rmtree(old, ignore_errors=True)
        return manifest, time.perf_counter() - t0


def land_files(landing: Landing, directory: str) -> int:
    """Engine side: the version's tensor files read onto the landing's device and held."""
    root = Path(directory)
    index = json.loads((root / INDEX).read_text())
    tensors = {}
    for i, (name, shape, dtype) in enumerate(zip(index["names"], index["shapes"], index["dtypes"], strict=True)):
        flat = torch.from_file(str(root / f"{i}.bin"), size=math.prod(shape), dtype=getattr(torch, dtype))
        tensors[name] = flat.reshape(shape).to(landing.device, copy=True)
    return landing.hold(tensors)


class TensorFilesReceiver(FileReceiver):
    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None:
            return None
        if not Path(manifest.path).is_dir():  # pruned by a newer version (taken on the next poll), or
            if published_version(self.client, self.run_id) <= manifest.version:  # never on this node:
                self.report_missing(manifest)  # no shared run.dir (logged once, counted, retried)
            return None
        try:
            self.engine.receive(function_ref(land_files), directory=manifest.path)
        except Exception:
            if Path(manifest.path).is_dir():
                raise
            self.engine.drop()  # pruned while the workers read it: the newer version next time
            return None
        return manifest.version, self.engine.apply(manifest.version, in_flight)


WEIGHT_TRANSPORTS.register("tensor_files")(
    WeightTransport(TensorFilesPublisher, TensorFilesReceiver, TensorFilesSettings)
)
