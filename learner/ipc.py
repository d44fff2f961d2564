"""The ``ipc`` transport's publisher: each version into a shared slot on the learner's node.

Rank 0 gathers the parameters bucket by bucket (every rank takes part, as for the other transports)
and copies them straight into the slot of the version (``common.weight_slots``): host memory in
``/dev/shm``, or with ``memory: device`` (the default on a GPU learner) a buffer on its GPU that
generators on the same GPU open by CUDA IPC — the path for a generator and the learner sharing one
GPU, where NCCL refuses two ranks. No background thread, no checksum, no file: the version is
readable the moment its manifest is published. Memory: two slots of one version each, allocated
at the first publication. If they cannot be allocated (a full ``/dev/shm``, no GPU memory left),
this and every later version is published as a file, logged and counted in ``fallbacks``.

Files are written beside the slots only when needed: from the first version after a receiver asked
for them (one on another node, or not seeing the learner's GPU: ``common.weight_receivers.IpcReceiver``),
and once at ``close`` for the last version, because the slots end with the learner while the
final evaluation still reads it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import redis
import torch

from rredcot.common.config import Config
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.weight_group import bucket_nbytes, flat_nbytes, flatten, unflatten
from rredcot.common.weight_slots import SHM_DIR, SLOTS, SlotRing, files_wanted, stamp
from rredcot.common.weight_sync import WeightManifest, publish_manifest, write_weights
from rredcot.learner.broadcast import CPU, FilePublisher, columns, gathered_buckets, take_part

log = logging.getLogger(__name__)


class IpcPublisher(FilePublisher):
    """The ``ipc`` transport's publisher (module docstring); ``memory``: ``auto`` (the learner's
    device), ``host`` or ``device``."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        out_dir: str | Path,
        rank: int,
        memory: str = "auto",
        keep: int = 2,
        shm_dir: Path = SHM_DIR,
    ) -> None:
        super().__init__(client, run_id, out_dir, rank, keep)
        self.memory, self.shm_dir = memory, shm_dir
        self._ring: SlotRing | None = None
        self._files_only = False  # the slots could not be allocated
        self._last: WeightManifest | None = None  # the newest version published in a slot

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, rank: int, out_dir: Path) -> IpcPublisher:
        settings = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg)
        return cls(client, cfg.run.name, out_dir, rank, settings.memory)

    def publish(self, module: torch.nn.Module, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (its manifest on rank 0, seconds here)."""
        if self._files_only:
            return super().publish(module, version)
        if version == 0:  # every receiver starts from version 0
            return None, 0.0
        t0 = time.perf_counter()
        if self.rank != 0:
            take_part(module)
            return None, time.perf_counter() - t0
        names, shapes, dtypes = columns(module)
        ring = self._slots(module, shapes, dtypes)
        if ring is None:
            return super().publish(module, version)
        index = 0 if self._last is None else (self._last.shared["index"] + 1) % SLOTS  # the other slot
        stamp(self.client, self.run_id, index, -1)  # receivers copying the version it held drop the copy
        buffer, offset = ring.buffers[index], 0
        for bucket in gathered_buckets(module):
            tensors = [t for _, t in bucket]
            n = flat_nbytes(tensors)
            flatten(tensors, buffer.device, buffer[offset : offset + n])
            offset += n
        if buffer.is_cuda:
            torch.cuda.synchronize(buffer.device)
        stamp(self.client, self.run_id, index, version)
        manifest = WeightManifest(
            version, names, shapes, dtypes, checksum="", path="", nbytes=0, created=time.time(), transport="ipc"
        )
        manifest = dataclasses.replace(manifest, buckets=[len(names)], shared=ring.handles[index])
        if files_wanted(self.client, self.run_id):
            manifest = self._with_file(manifest, buffer)
        publish_manifest(self.client, self.run_id, manifest)
        self._last = manifest
        return manifest, time.perf_counter() - t0

    def close(self) -> None:
        """Write the last version as a file too (the slots end here), then free the slots."""
        if self._ring is None:
            return
        if self._last is not None and not self._last.path:
            last = self._with_file(self._last, self._ring.buffers[self._last.shared["index"]])
            publish_manifest(self.client, self.run_id, last)
        self._ring.close()
        self._ring = None

    def _slots(self, module: torch.nn.Module, shapes: list[list[int]], dtypes: list[str]) -> SlotRing | None:
        """The slots, allocated at the first publication; None (files from now on) if they do not fit."""
        if self._ring is None:
            device = next(module.parameters()).device if self.memory != "host" else CPU
            if self.memory == "device" and device.type != "cuda":
                raise ValueError("generation.transport_settings.memory = 'device' needs the learner on a GPU")
            nbytes = bucket_nbytes(shapes, dtypes, [len(shapes)])[0]  # all tensors as one bucket
            for i in range(SLOTS):  # a restarted learner: what the old slots held is gone
                stamp(self.client, self.run_id, i, -1)
            try:
                self._ring = SlotRing(self.run_id, nbytes, device, self.shm_dir)
            except (OSError, torch.OutOfMemoryError) as e:
                log.warning("ipc: %d MiB of shared slots do not fit (%s); publishing files", nbytes >> 20, e)
                self._files_only = True
                self.fallbacks += 1
        return self._ring

    def _with_file(self, manifest: WeightManifest, buffer: torch.Tensor) -> WeightManifest:
        """``manifest`` with the file of its version, written from its slot."""
        tensors = unflatten(buffer, manifest.shapes, manifest.dtypes)
        written = write_weights(manifest.version, zip(manifest.names, tensors, strict=True), self.out_dir, self.keep)
        return dataclasses.replace(manifest, checksum=written.checksum, path=written.path, nbytes=written.nbytes)
