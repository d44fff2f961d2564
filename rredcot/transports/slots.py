"""The ``ipc`` weight transport's memory: two slots on the learner's node that receivers map.

Learner rank 0 owns ``SLOTS`` buffers, each one version's tensors laid out as
``transports.group.flatten`` packs them (16-byte aligned, in manifest order). Version ``v`` is
written into slot ``v % SLOTS``, so the newest version is never overwritten while the next one is
written. A slot is either

- ``host``: a file in ``/dev/shm`` (its pages reserved with ``posix_fallocate``, so a full tmpfs is
  an error at allocation, not a SIGBUS later), mapped by any process of the node; or
- ``cuda``: a buffer on the learner's GPU, shared by CUDA IPC, opened by a process that sees the
  same GPU (found by its UUID, whatever ``CUDA_VISIBLE_DEVICES`` numbers it).

A slot's handle is a plain dict (strings, ints, bytes) that travels in the weight manifest (msgpack,
never pickle). Each slot's version is stamped in Redis (``slots_key``): -1 while the learner writes
it, then the version. A receiver copies the slot into its own memory and keeps the copy only if the
stamp still names the version afterwards: a slot overwritten while it was copied (a receiver more
than a learner step behind) is dropped, and the receiver takes the newest version on its next poll.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import socket
from pathlib import Path
from typing import Any

import redis
import torch

from rredcot.common.streams import registry_key
from rredcot.transports import SHM_DIR
from rredcot.transports.group import unflatten
from rredcot.transports.manifest import WeightManifest

log = logging.getLogger(__name__)

SLOTS = 2


def slots_key(run_id: str) -> str:
    """Redis hash: slot index → the version it holds (-1 while written)."""
    return f"rredcot:{run_id}:weights:slots"


def files_key(run_id: str) -> str:
    """Redis set: the receivers that cannot map the slots and follow weight files instead."""
    return f"rredcot:{run_id}:weights:want_files"


def node_id() -> str:
    """This machine, as receivers compare it with the learner's: host name and boot id."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return f"{socket.gethostname()}/{boot.read_text().strip() if boot.exists() else ''}"


def slot_path(run_id: str, uid: str, index: int, shm_dir: Path = SHM_DIR) -> Path:
    """Slot ``index``'s file of run ``run_id`` whose own id is ``uid`` (``common.run_uid``): one name
    per run, which a restarted or resumed learner replaces; another run of the same name has another
    id, so its learner never replaces these."""
    return shm_dir / f"rredcot-{re.sub(r'[^A-Za-z0-9_.-]', '_', run_id)}-{uid}-slot{index}"


def host_slots_left(run_id: str, uid: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Run ``run_id``'s host slot files on this node: what a learner that was killed or failed left
    (they hold its newest weights, which a resumed run's generators start from)."""
    return [p for i in range(SLOTS) if (p := slot_path(run_id, uid, i, shm_dir)).exists()]


def _map(path: Path, nbytes: int) -> torch.Tensor:
    """The file's first ``nbytes`` as a shared ``uint8`` tensor (the tensor keeps the mapping)."""
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size < nbytes:
            raise OSError(f"{path} holds {os.fstat(fd).st_size} bytes, the manifest says {nbytes}")
        return torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
    finally:
        os.close(fd)


def _gpu_uuid(device: torch.device | int) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _visible_gpus() -> list[str]:
    """The UUIDs of the GPUs this process sees, by ordinal."""
    return [_gpu_uuid(i) for i in range(torch.cuda.device_count())]


class SlotRing:
    """Learner rank 0's slots: allocated once, each shared by one handle for the whole run."""

    def __init__(self, run_id: str, uid: str, nbytes: int, device: torch.device, shm_dir: Path = SHM_DIR) -> None:
        """``uid``: the run's own id, which names its host slots; ``device``: a CUDA device for
        ``cuda`` slots, the CPU for ``host`` ones. Raises ``OSError``
        (host memory) or ``torch.OutOfMemoryError`` (GPU) when the slots do not fit."""
        self.nbytes, self.kind = nbytes, "cuda" if device.type == "cuda" else "host"
        self.buffers: list[torch.Tensor] = []
        self.handles: list[dict[str, Any]] = []
        self._paths: list[Path] = []
        try:
            self._allocate(run_id, uid, device, shm_dir)
        except BaseException:
            self.close()
            raise

    def _allocate(self, run_id: str, uid: str, device: torch.device, shm_dir: Path) -> None:
        nbytes, node = self.nbytes, node_id()
        for i in range(SLOTS):
            base = {"node": node, "nbytes": nbytes, "index": i}
            if self.kind == "host":
                path = slot_path(run_id, uid, i, shm_dir)
                # this run's killed learner's slot: receivers still mapping it keep their pages
                path.unlink(missing_ok=True)
                self._paths.append(path)
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                finally:
                    os.close(fd)
                self.buffers.append(_map(path, nbytes))
                self.handles.append({"kind": "host", "path": str(path), **base})
            else:
                buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
                ipc = list(buffer.untyped_storage()._share_cuda_())
                ipc[0] = _gpu_uuid(device)  # the device by UUID, not by this process's ordinal
                self.buffers.append(buffer)
                self.handles.append({"kind": "cuda", "ipc": ipc, **base})

    def close(self) -> None:
        """Drop the slots (a receiver still holding a mapping keeps its pages until it lets go)."""
        self.buffers.clear()
        for path in self._paths:
            path.unlink(missing_ok=True)


def stamp(client: redis.Redis, run_id: str, index: int, version: int) -> None:
    """Record which version slot ``index`` holds (-1: being written)."""
    pipe = client.pipeline(transaction=True)
    pipe.sadd(registry_key(run_id), slots_key(run_id))
    pipe.hset(slots_key(run_id), str(index), version)
    pipe.execute()


def holds(client: redis.Redis, run_id: str, index: int, version: int) -> bool:
    """Whether slot ``index`` still holds ``version`` (checked after a copy)."""
    return int(client.hget(slots_key(run_id), str(index)) or -1) == version


def want_files(client: redis.Redis, run_id: str, receiver: str) -> None:
    """Ask the learner to write weight files too, for ``receiver``, which cannot map the slots."""
    pipe = client.pipeline(transaction=True)
    pipe.sadd(registry_key(run_id), files_key(run_id))
    pipe.sadd(files_key(run_id), receiver)
    pipe.execute()


def files_wanted(client: redis.Redis, run_id: str) -> bool:
    return bool(client.scard(files_key(run_id)))


def reachable(handle: dict[str, Any]) -> str:
    """Why this process cannot open ``handle`` ("" when it can)."""
    if handle.get("node") != node_id():
        return f"the slots are in the memory of another node ({handle.get('node')})"
    if handle["kind"] == "cuda":
        uuid = handle["ipc"][0]
        visible = _visible_gpus()
        if uuid not in visible:
            return f"the slots are on GPU {uuid}, which this process does not see (it sees {visible or 'none'})"
    return ""


def open_slot(handle: dict[str, Any]) -> torch.Tensor:
    """The slot ``handle`` names, as a ``uint8`` tensor (host: a mapping; cuda: the learner's buffer)."""
    if handle["kind"] == "host":
        return _map(Path(handle["path"]), handle["nbytes"])
    uuid, *rest = handle["ipc"]
    ordinal = _visible_gpus().index(uuid)
    torch.cuda._lazy_init()
    with torch.cuda.device(ordinal):
        storage = torch.UntypedStorage._new_shared_cuda(ordinal, *rest)
    return torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", ordinal)).set_(storage)[: handle["nbytes"]]


def copy_slot(handle: dict[str, Any], device: torch.device) -> torch.Tensor:
    """A private copy of the slot on ``device``, complete when this returns."""
    slot = open_slot(handle)
    own = torch.empty(handle["nbytes"], dtype=torch.uint8, device=device)
    own.copy_(slot)
    if slot.is_cuda or own.is_cuda:
        torch.cuda.synchronize(slot.device if slot.is_cuda else own.device)
    return own


def slot_tensors(own: torch.Tensor, manifest: WeightManifest) -> dict[str, torch.Tensor]:
    """The tensors of ``manifest`` by name, views of ``own`` (a copy of its slot, ``copy_slot``)."""
    return dict(zip(manifest.names, unflatten(own, manifest.shapes, manifest.dtypes), strict=True))


class SlotReader:
    """A receiver's side of the slots: whether it can map them (checked on the first handle; if not,
    it says why once and asks the learner for files), and reading a version out of its slot."""

    def __init__(self, client: redis.Redis, run_id: str, name: str) -> None:
        self.client, self.run_id, self.name = client, run_id, name
        self.unreachable: str | None = None  # why this receiver cannot map the slots (None: not checked yet)

    def usable(self, handle: dict[str, Any]) -> bool:
        if self.unreachable is None:
            self.unreachable = reachable(handle)
            if self.unreachable:
                log.warning("%s: %s; asking the learner for weight files", self.name, self.unreachable)
                want_files(self.client, self.run_id, self.name)
        return not self.unreachable

    def still_held(self, manifest: WeightManifest) -> bool:
        """Whether the slot of ``manifest`` still holds its version (call after copying it)."""
        return holds(self.client, self.run_id, manifest.shared["index"], manifest.version)

    def read(self, manifest: WeightManifest, device: torch.device) -> dict[str, torch.Tensor] | None:
        """The tensors of ``manifest``'s version copied out of its slot onto ``device``; None when the
        slot was overwritten meanwhile or is gone with its learner (take the newer version, or the file)."""
        try:
            own = copy_slot(manifest.shared, device)
        except (OSError, RuntimeError) as e:
            log.info("%s: cannot open weights v%d's slot (%s: %s)", self.name, manifest.version, type(e).__name__, e)
            return None
        if not self.still_held(manifest):
            return None
        return slot_tensors(own, manifest)
