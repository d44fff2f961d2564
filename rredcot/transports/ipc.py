"""The ``ipc`` transport: each version into a shared slot on the learner's node, copied out by the
receivers there.

Publisher (``IpcPublisher``, learner rank 0): copies the learner's buckets straight into the slot of
the version (``transports.slots``): host memory in ``/dev/shm``, or with ``memory: device`` (the default on a
GPU learner) a buffer on its GPU that generators on the same GPU open by CUDA IPC — the path for a
generator and the learner sharing one GPU, where NCCL refuses two ranks. No background thread, no
checksum, no file: the version is readable the moment its manifest is published. Memory: two slots
of one version each, allocated at the first publication. If they cannot be allocated (a full
``/dev/shm``, no GPU memory left), this and every later version is published as a file, logged and
counted in ``fallbacks``.

Files are written beside the slots only when needed: from the first version after a receiver asked
for them (one on another node, or not seeing the learner's GPU: ``IpcReceiver``), and once at
``close`` for the last version, because the slots end with the learner while the final evaluation
still reads it.

Receiver (``IpcReceiver``): has the port copy each version out of its slot into its own memory (the
engine-side ``land_slot``), and keeps the copy only if the slot still holds that version afterwards.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import torch

from rredcot.common.config import Config, ConfigError, choice
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.run_uid import run_uid
from rredcot.transports import Deployment, WeightSource
from rredcot.transports.file import FilePublisher, FileReceiver
from rredcot.transports.group import bucket_nbytes, flat_nbytes, flatten, unflatten
from rredcot.transports.manifest import WeightManifest, latest_manifest, publish_manifest, write_weights
from rredcot.transports.ports import Landing, WeightPort, function_ref
from rredcot.transports.slots import (
    SHM_DIR,
    SLOTS,
    SlotReader,
    SlotRing,
    copy_slot,
    files_wanted,
    host_slots_left,
    stamp,
)

log = logging.getLogger(__name__)


@dataclass
class IpcSettings:
    """``generation.transport_settings`` of ``ipc``."""

    memory: str = choice("auto", "auto", "host", "device")  # the slots' memory; auto: the learner's device

    def check(self, cfg: Config) -> None:
        if self.memory == "device" and cfg.cluster.gpus_per_learner == 0:
            raise ConfigError(
                "generation.transport_settings.memory = 'device' needs a GPU learner (cluster.gpus_per_learner "
                "is 0); expected 'auto' or 'host'"
            )


class IpcPublisher(FilePublisher):
    """The ``ipc`` transport's publisher (module docstring); ``memory``: ``auto`` (the learner's
    device), ``host`` or ``device``."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        out_dir: str | Path,
        memory: str = "auto",
        keep: int = 2,
        shm_dir: Path = SHM_DIR,
    ) -> None:
        super().__init__(client, run_id, out_dir, keep)
        self.memory, self.shm_dir = memory, shm_dir
        self._ring: SlotRing | None = None
        self._files_only = False  # the slots could not be allocated
        self._last: WeightManifest | None = None  # the newest version published in a slot

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, out_dir: Path) -> IpcPublisher:
        settings = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg)
        return cls(client, cfg.run.name, out_dir, settings.memory)

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (its manifest, seconds here)."""
        if self._files_only:
            return super().publish(weights, version)
        if version == 0:  # every receiver starts from version 0
            return None, 0.0
        t0 = time.perf_counter()
        names, shapes, dtypes = weights.columns()
        ring = self._slots(weights.device, shapes, dtypes)
        if ring is None:
            return super().publish(weights, version)
        index = 0 if self._last is None else (self._last.shared["index"] + 1) % SLOTS  # the other slot
        stamp(self.client, self.run_id, index, -1)  # receivers copying the version it held drop the copy
        buffer, offset = ring.buffers[index], 0
        for bucket in weights.buckets():
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

    def _slots(self, device: torch.device, shapes: list[list[int]], dtypes: list[str]) -> SlotRing | None:
        """The slots, allocated at the first publication on the learner's ``device`` (or the host's
        memory); None (files from now on) if they do not fit."""
        if self._ring is None:
            device = device if self.memory != "host" else torch.device("cpu")
            if self.memory == "device" and device.type != "cuda":
                raise ValueError("generation.transport_settings.memory = 'device' needs the learner on a GPU")
            nbytes = bucket_nbytes(shapes, dtypes, [len(shapes)])[0]  # all tensors as one bucket
            for i in range(SLOTS):  # a restarted learner: what the old slots held is gone
                stamp(self.client, self.run_id, i, -1)
            try:
                self._ring = SlotRing(self.run_id, run_uid(self.client, self.run_id), nbytes, device, self.shm_dir)
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


class IpcReceiver(FileReceiver):
    """``ipc``: copy each version out of the learner's shared slot (``transports.slots``). A receiver
    that cannot map the slots (another node, a GPU it does not see) says why once, asks the learner
    for weight files and follows them; a slot that cannot be opened any more (the learner ended or
    restarted) is read from the version's file when there is one."""

    def __init__(self, client: Any, run_id: str, engine: WeightPort, name: str = "") -> None:
        super().__init__(client, run_id, engine, name)
        self.slots = SlotReader(client, run_id, name)

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None or manifest.transport != "ipc" or not self.slots.usable(manifest.shared):
            return self._apply_file(manifest, in_flight)
        try:
            self.engine.receive(
                function_ref(land_slot),
                handle=manifest.shared,
                names=manifest.names,
                shapes=manifest.shapes,
                dtypes=manifest.dtypes,
            )
        except Exception as e:  # noqa: BLE001 - the slots went with their learner: its file, if any
            log.info("%s: cannot open weights v%d's slot (%s: %s)", self.name, manifest.version, type(e).__name__, e)
            return self._apply_file(manifest, in_flight)
        if not self.slots.still_held(manifest):  # overwritten during the copy: a newer version is there
            self.engine.drop()
            return None
        return manifest.version, self.engine.apply(manifest.version, in_flight)


def land_slot(
    landing: Landing, handle: dict[str, Any], names: list[str], shapes: list[list[int]], dtypes: list[str]
) -> int:
    """Engine side: the learner's shared slot copied onto the landing's device, its tensors held."""
    own = copy_slot(handle, landing.device)
    return landing.hold(dict(zip(names, unflatten(own, shapes, dtypes), strict=True)))


class IpcDeployment(Deployment):
    """Receivers off the learner's node read files; host slots take ``/dev/shm`` room; a killed
    learner's host slots stay there for ``run.resume``."""

    def shm_versions(self, cfg: Config) -> int:
        memory = WEIGHT_TRANSPORTS.get(cfg.generation.weight_transport).typed_settings(cfg).memory
        host = memory == "host" or (memory == "auto" and cfg.cluster.gpus_per_learner == 0)
        return SLOTS if host else 0

    def left_behind(self, run_id: str, uid: str) -> list[Path]:
        return host_slots_left(run_id, uid)
