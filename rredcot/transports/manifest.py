"""Weight-sync protocol between the learner (publisher) and generators / scorers (receivers).

File path (CPU and GPU, any receiver): learner rank 0 writes the full weights of version ``v`` as ONE
safetensors file in Hugging Face parameter naming (``model.layers.0.self_attn.q_proj.weight``,
tied ``lm_head`` omitted, exactly what ``model.named_parameters()`` yields), streamed tensor by
tensor (:class:`WeightWriter`: the header first, the SHA-256 computed while writing, never the
whole file in memory) and atomically (temporary file + ``os.replace``), then sets the Redis key
``rredcot:{run_id}:weights:latest`` to a msgpack-encoded :class:`WeightManifest` and publishes
the version number on the channel ``rredcot:{run_id}:weights`` (a wake-up hint; the key is the
source of truth). A receiver polls or subscribes, reads the manifest with
:func:`latest_manifest`, and gets verified bytes with :func:`read_weights` (feed them to vLLM's
``reload_weights`` through a worker extension). Only the last ``keep`` files stay on disk: a
receiver that finds its file pruned re-reads the latest manifest; a file missing while no newer
version exists means the receiver does not share the learner's filesystem (one node, or a shared
mount), which receivers must.

Collective path (``transports.group``; gloo on CPU, NCCL on GPU): the manifest carries
``transport="collective"`` and ``buckets`` (tensors per bucket); learner rank 0 then broadcasts the
buckets to the generators of its weight group. ``path`` is set as well when the learner also wrote
the file (for receivers outside the group: the evaluator, a policy-following scorer, a generator
that lost the group); if a broadcast fails, the learner re-publishes that version as a file.

Shared-memory path (``transports.slots``): the manifest carries ``transport="ipc"`` and
``shared``, the handle of the slot on the learner's node that holds the version (``path`` is set as
well when a receiver that cannot map it asked for files).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import msgpack
import redis
import torch
from safetensors.torch import load as st_load

from rredcot.common.streams import registry_key

MANIFEST_SCHEMA = 1
_FILE_RE = re.compile(r"^weights-v(\d+)\.safetensors$")
_TMP_RE = re.compile(r"^weights-v\d+\.tmp(\d+)$")  # a file being written, by the process with that pid
_ST_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}  # torch dtype name → safetensors dtype


class WeightSyncError(RuntimeError):
    """A manifest or weight file that cannot be used (corrupt, checksum mismatch, wrong schema)."""


@dataclass(frozen=True)
class WeightManifest:
    """What a receiver needs to know about one published weight version."""

    version: int
    names: list[str]
    shapes: list[list[int]]
    dtypes: list[str]  # torch dtype names without the "torch." prefix, e.g. "float32"
    checksum: str  # "sha256:<hex>" of the file bytes
    path: str  # absolute path of the safetensors file ("" when only broadcast)
    nbytes: int  # file size in bytes (0 without a file)
    created: float = 0.0  # unix time of publication
    transport: str = "file"  # "file", "collective" (transports.group) or "ipc" (transports.slots)
    buckets: list[int] = field(default_factory=list)  # collective: tensors per broadcast bucket
    shared: dict = field(default_factory=dict)  # ipc: the handle of the slot that holds the version

    def encode(self) -> bytes:
        return msgpack.packb({"schema": MANIFEST_SCHEMA, **asdict(self)})

    @classmethod
    def decode(cls, data: bytes) -> WeightManifest:
        try:
            d = msgpack.unpackb(data, raw=False)
            schema = d.pop("schema")
        except Exception as e:
            raise WeightSyncError(f"not a weight manifest: {type(e).__name__}: {e}") from None
        if schema != MANIFEST_SCHEMA:
            raise WeightSyncError(f"manifest schema {schema!r} not supported (reader: {MANIFEST_SCHEMA})")
        return cls(**d)


def latest_key(run_id: str) -> str:
    return f"rredcot:{run_id}:weights:latest"


def version_key(run_id: str) -> str:
    return f"rredcot:{run_id}:weights:version"


def channel(run_id: str) -> str:
    return f"rredcot:{run_id}:weights"


def weights_file(out_dir: str | Path, version: int) -> Path:
    return Path(out_dir) / f"weights-v{version:08d}.safetensors"


def sha256_of(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class SafetensorsStream:
    """The bytes of one version's safetensors file, streamed: the header (from the names, shapes and
    dtypes known up front), then each tensor's bytes as it comes, hashed as they go. Host memory: one
    tensor at a time. A subclass says where the bytes go (``_sink``) and calls ``_start`` when its
    sink is ready."""

    def __init__(self, version: int, names: list[str], shapes: list[list[int]], dtypes: list[str]) -> None:
        self.version, self.names, self.shapes, self.dtypes = version, names, shapes, dtypes
        entries, offset = {"__metadata__": {"version": str(version)}}, 0
        for name, shape, dtype in zip(names, shapes, dtypes, strict=True):
            if dtype not in _ST_DTYPES:
                raise WeightSyncError(f"tensor {name!r}: dtype {dtype} cannot be written to a weight file")
            end = offset + math.prod(shape) * getattr(torch, dtype).itemsize
            entries[name] = {"dtype": _ST_DTYPES[dtype], "shape": shape, "data_offsets": [offset, end]}
            offset = end
        header = json.dumps(entries, separators=(",", ":")).encode()
        header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self._header = struct.pack("<Q", len(header)) + header
        self.nbytes = len(self._header) + offset
        self._hash = hashlib.sha256()
        self._next = 0  # index of the next tensor to write

    def _sink(self, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        self._write(self._header)

    def _write(self, data: bytes | memoryview) -> None:
        self._sink(data)
        self._hash.update(data)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """The next tensor (in the order of ``names``), copied to the host only if it is not there."""
        i = self._next
        dtype = str(tensor.dtype).removeprefix("torch.")
        if i >= len(self.names) or (name, list(tensor.shape), dtype) != (self.names[i], self.shapes[i], self.dtypes[i]):
            raise WeightSyncError(f"tensor {name!r} {dtype}{list(tensor.shape)} is not the next one of the header")
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        self._write(memoryview(flat.view(torch.uint8).numpy()))
        self._next += 1

    def _finished(self, where: object) -> WeightManifest:
        """The manifest of the whole stream (``transport`` "file" until the caller says otherwise)."""
        if self._next != len(self.names):
            raise WeightSyncError(f"{self._next} of {len(self.names)} tensors written to {where}")
        return WeightManifest(
            version=self.version,
            names=self.names,
            shapes=self.shapes,
            dtypes=self.dtypes,
            checksum="sha256:" + self._hash.hexdigest(),
            path="",
            nbytes=self.nbytes,
            created=time.time(),
        )


class WeightWriter(SafetensorsStream):
    """Streams one version's safetensors file to ``out_dir``; ``commit`` renames the temporary file
    into place (atomic) and prunes old files. As a context manager, it removes the temporary file
    when left without a commit."""

    def __init__(
        self, version: int, names: list[str], shapes: list[list[int]], dtypes: list[str], out_dir: str | Path
    ) -> None:
        super().__init__(version, names, shapes, dtypes)
        self.out_dir = out_dir
        self.path = weights_file(out_dir, version).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - closed by commit or on leaving the context
        self._committed = False
        self._start()

    def _sink(self, data: bytes | memoryview) -> None:
        self._file.write(data)

    def commit(self, keep: int = 2) -> WeightManifest:
        """Flush, fsync and rename the file into place, prune old files; its manifest."""
        manifest = self._finished(self.path)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        self._committed = True
        prune(self.out_dir, keep)
        return replace(manifest, path=str(self.path))

    def __enter__(self) -> WeightWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._committed:
            self._file.close()
            self._tmp.unlink(missing_ok=True)


def write_weights(
    version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], out_dir: str | Path, keep: int = 2
) -> WeightManifest:
    """Write version ``version`` as one safetensors file (atomically), prune old files; its manifest."""
    named = list(named_tensors)
    names, shapes = [n for n, _ in named], [list(t.shape) for _, t in named]
    with WeightWriter(version, names, shapes, [str(t.dtype).removeprefix("torch.") for _, t in named], out_dir) as w:
        for name, tensor in named:
            w.write(name, tensor)
        return w.commit(keep)


def publish_manifest(client: redis.Redis, run_id: str, manifest: WeightManifest) -> None:
    """Point the latest key at ``manifest``, bump the version key, wake subscribers."""
    pipe = client.pipeline(transaction=True)
    pipe.sadd(registry_key(run_id), latest_key(run_id), version_key(run_id))
    pipe.set(latest_key(run_id), manifest.encode())
    pipe.set(version_key(run_id), manifest.version)
    pipe.execute()
    client.publish(channel(run_id), str(manifest.version))


def publish_weights(
    client: redis.Redis,
    run_id: str,
    version: int,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    out_dir: str | Path,
    keep: int = 2,
) -> WeightManifest:
    """The file path: write version ``version`` as a safetensors file and publish its manifest."""
    manifest = write_weights(version, named_tensors, out_dir, keep)
    publish_manifest(client, run_id, manifest)
    return manifest


def prune(out_dir: str | Path, keep: int = 2) -> list[Path]:
    """Delete all but the ``keep`` newest weight files in ``out_dir``, and the partial files of
    writers that are gone (a learner killed while writing); returns what was deleted."""
    paths = list(Path(out_dir).iterdir())
    files = sorted((int(m.group(1)), p) for p in paths if (m := _FILE_RE.match(p.name)))
    doomed = [p for _, p in files[: max(len(files) - keep, 0)]]
    doomed += [p for p in paths if (m := _TMP_RE.match(p.name)) and int(m.group(1)) != os.getpid()]
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


def published_version(client: redis.Redis, run_id: str) -> int:
    """The newest published version (-1 before the first publication)."""
    return int(client.get(version_key(run_id)) or -1)


def latest_manifest(client: redis.Redis, run_id: str, newer_than: int | None = None) -> WeightManifest | None:
    """The newest published manifest, or None before the first publication — or, with
    ``newer_than``, when nothing newer than that version exists (checked on a small version key,
    so receivers can poll every engine step without fetching and decoding the whole manifest)."""
    if newer_than is not None and published_version(client, run_id) <= newer_than:
        return None
    data = client.get(latest_key(run_id))
    return None if data is None else WeightManifest.decode(data)


def read_weights(manifest: WeightManifest) -> bytes:
    """The safetensors bytes of ``manifest``, checksum-verified.

    Raises ``FileNotFoundError`` when the file was already pruned (read the latest manifest
    again) and ``WeightSyncError`` when the bytes do not match the manifest.
    """
    data = Path(manifest.path).read_bytes()
    if len(data) != manifest.nbytes or sha256_of(data) != manifest.checksum:
        raise WeightSyncError(
            f"weights file {manifest.path} does not match its manifest (version {manifest.version}): "
            f"{len(data)} bytes, expected {manifest.nbytes} with {manifest.checksum}"
        )
    return data


def load_tensors(manifest: WeightManifest) -> dict[str, torch.Tensor]:
    """The verified tensors of ``manifest`` by HF name, checked against its names/shapes/dtypes."""
    tensors = st_load(read_weights(manifest))
    for name, shape, dtype in zip(manifest.names, manifest.shapes, manifest.dtypes, strict=True):
        t = tensors.get(name)
        if t is None or list(t.shape) != shape or str(t.dtype).removeprefix("torch.") != dtype:
            raise WeightSyncError(f"tensor {name!r} missing or not {dtype}{shape} in {manifest.path}")
    return tensors
