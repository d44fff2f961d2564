"""Weight-sync protocol between the learner (publisher) and generators / scorers (receivers).

File path (CPU and GPU, any receiver): learner rank 0 writes the full weights of version ``v`` as ONE
safetensors file in Hugging Face parameter naming (``model.layers.0.self_attn.q_proj.weight``,
tied ``lm_head`` omitted, exactly what ``model.named_parameters()`` yields), atomically
(temporary file + ``os.replace``), then sets the Redis key ``rredcot:{run_id}:weights:latest``
to a msgpack-encoded :class:`WeightManifest` and publishes the version number on the channel
``rredcot:{run_id}:weights`` (a wake-up hint; the key is the source of truth). A receiver polls
or subscribes, reads the manifest with :func:`latest_manifest`, and gets verified bytes with
:func:`read_weights` (feed them to vLLM's ``reload_weights`` through a worker extension). Only the
last ``keep`` files stay on disk: a receiver that finds its file pruned re-reads the latest
manifest. Receivers must share the learner's filesystem (one node, or a shared mount).

Collective path (``common.weight_group``; gloo on CPU, NCCL on GPU): the manifest carries
``transport="collective"`` and ``buckets`` (tensors per bucket); learner rank 0 then broadcasts the
buckets to the generators of its weight group. ``path`` is set as well when the learner also wrote
the file (for receivers outside the group: the evaluator, a policy-following scorer, a generator
that lost the group); if a broadcast fails, the learner re-publishes that version as a file.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgpack
import redis
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rredcot.common.streams import registry_key

MANIFEST_SCHEMA = 1
_FILE_RE = re.compile(r"^weights-v(\d+)\.safetensors$")


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
    transport: str = "file"  # "file" or "collective" (common.weight_group)
    buckets: list[int] = field(default_factory=list)  # collective: tensors per broadcast bucket

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


def _checksum(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_weights(
    version: int, named_tensors: Iterable[tuple[str, torch.Tensor]], out_dir: str | Path, keep: int = 2
) -> WeightManifest:
    """Write version ``version`` as one safetensors file (atomically), prune old files; its manifest."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in named_tensors}
    data = st_save(tensors, metadata={"version": str(version)})
    path = weights_file(out_dir, version).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    prune(out_dir, keep)
    return WeightManifest(
        version=version,
        names=list(tensors),
        shapes=[list(t.shape) for t in tensors.values()],
        dtypes=[str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        checksum=_checksum(data),
        path=str(path),
        nbytes=len(data),
        created=time.time(),
    )


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
    """Delete all but the ``keep`` newest weight files in ``out_dir``; returns what was deleted."""
    files = sorted((int(m.group(1)), p) for p in Path(out_dir).iterdir() if (m := _FILE_RE.match(p.name)))
    doomed = [p for _, p in files[: max(len(files) - keep, 0)]]
    for p in doomed:
        p.unlink(missing_ok=True)
    return doomed


def latest_manifest(client: redis.Redis, run_id: str, newer_than: int | None = None) -> WeightManifest | None:
    """The newest published manifest, or None before the first publication — or, with
    ``newer_than``, when nothing newer than that version exists (checked on a small version key,
    so receivers can poll every engine step without fetching and decoding the whole manifest)."""
    if newer_than is not None and int(client.get(version_key(run_id)) or -1) <= newer_than:
        return None
    data = client.get(latest_key(run_id))
    return None if data is None else WeightManifest.decode(data)


def read_weights(manifest: WeightManifest) -> bytes:
    """The safetensors bytes of ``manifest``, checksum-verified.

    Raises ``FileNotFoundError`` when the file was already pruned (read the latest manifest
    again) and ``WeightSyncError`` when the bytes do not match the manifest.
    """
    data = Path(manifest.path).read_bytes()
    if len(data) != manifest.nbytes or _checksum(data) != manifest.checksum:
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
