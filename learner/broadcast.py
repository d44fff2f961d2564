"""Full weights out of a (possibly ZeRO-3 partitioned) model, and the built-in transports' publishers.

Parameters are gathered in buckets of about ``bucket_bytes`` (one ``GatheredParameters`` call per
bucket, all ranks take part). Only rank 0 copies anything: the other ranks take part in the gathers
and hold nothing more. Rank 0 then delivers them (``common.transports`` pairs each publisher with
its receiver in ``common.weight_receivers``):

- ``FilePublisher`` (``file``): one safetensors file per version plus its manifest
  (``common.weight_sync``), streamed to disk bucket by bucket as the buckets are gathered
  (``WeightWriter``: the SHA-256 computed while writing). Host memory: one tensor at a time.
- ``CollectivePublisher`` (``collective``): each bucket is copied into its own reused host buffer
  (pinned when CUDA is there), so rank 0 holds one copy of the version in host memory and no extra
  one on its device; the version's manifest is published at once (before the learner admits the
  next step's prompts, so that η = 0 holds), and a background thread broadcasts the buckets to the
  generators' weight group (``common.weight_group``; gloo on CPU, NCCL on GPU) while the next step
  trains, staging them one at a time through one device buffer of the largest bucket's size (plus
  the checksum's < 100 MiB). At most one send is in flight: the next publication waits for it
  before it overwrites the host buffers. The file is written from the same host buffers too (and
  the version re-announced with its path) when a receiver outside the group needs it. Version 0
  (what every receiver starts from) is never broadcast, only written when a file is wanted. If the
  group cannot be formed or a send fails, the version is re-published as a file from the host
  buffers and the run continues on files.

Never one remote call per tensor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import redis
import torch

from rredcot.common.config import Config, tensor_parallel
from rredcot.common.weight_group import (
    GroupInfo,
    bucket_counts,
    flat_nbytes,
    flatten,
    open_group,
    publish_group,
    send_buckets,
    unflatten_buckets,
)
from rredcot.common.weight_slots import files_wanted
from rredcot.common.weight_sync import WeightManifest, WeightWriter, publish_manifest, write_weights

log = logging.getLogger(__name__)
BUCKET_BYTES = 256 * 2**20
CPU = torch.device("cpu")
Layout = tuple[str, list[int], str]  # (HF name, shape, dtype name) of one tensor in a bucket


def _numel(p: torch.nn.Parameter) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def gathered_buckets(
    module: torch.nn.Module,
    bucket_bytes: int = BUCKET_BYTES,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """(HF name, full parameter) lists of about ``bucket_bytes`` each; a collective under ZeRO-3.

    The tensors are the live (gathered) parameters: use them before asking for the next bucket.
    """
    import deepspeed

    named = list(module.named_parameters())
    start = 0
    for count in bucket_counts([_numel(p) * p.element_size() for _, p in named], bucket_bytes):
        bucket = named[start : start + count]
        start += count
        partitioned = [p for _, p in bucket if hasattr(p, "ds_id")]
        with deepspeed.zero.GatheredParameters(partitioned, enabled=bool(partitioned)):
            yield [(n, p.detach()) for n, p in bucket]


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """All parameters as full CPU tensors by HF name (a collective under ZeRO-3)."""
    return {n: t.to("cpu", copy=True) for bucket in gathered_buckets(module) for n, t in bucket}


class FilePublisher:
    """The ``file`` transport's publisher: every rank calls ``publish``; rank 0 streams the version's
    safetensors file to disk and publishes its manifest (``common.weight_sync``)."""

    def __init__(self, client: redis.Redis | None, run_id: str, out_dir: str | Path, rank: int, keep: int = 2) -> None:
        self.client, self.run_id, self.out_dir, self.rank, self.keep = client, run_id, Path(out_dir), rank, keep
        self.send_s = 0.0  # seconds spent in background sends (none here)
        self.fallbacks = 0  # versions re-published as files after a failed send (none here)

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, rank: int, out_dir: Path) -> FilePublisher:
        return cls(client, cfg.run.name, out_dir, rank)

    def publish(self, module: torch.nn.Module, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (the manifest when published on this thread, seconds here)."""
        t0 = time.perf_counter()
        if self.rank != 0 or self.client is None:  # only rank 0 delivers
            take_part(module)
            return None, time.perf_counter() - t0
        buckets = gathered_buckets(module)
        try:
            with WeightWriter(version, *columns(module), self.out_dir) as writer:
                for bucket in buckets:
                    for name, tensor in bucket:
                        writer.write(name, tensor)
                manifest = writer.commit(self.keep)
        except OSError:  # e.g. a full disk: finish the gathers first, the other ZeRO-3 ranks wait in them
            for _ in buckets:
                pass
            raise
        publish_manifest(self.client, self.run_id, manifest)
        return manifest, time.perf_counter() - t0

    def wait(self) -> None:
        """Block until the send in flight (if any) has finished."""

    def close(self) -> None:
        self.wait()


class CollectivePublisher(FilePublisher):
    """The ``collective`` transport's publisher: rank 0 hosts the weight group for ``receivers``
    generators and broadcasts each version's buckets from a background thread (files and memory: see
    the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        out_dir: str | Path,
        rank: int,
        *,
        group_address: str,
        receivers: int,
        file_too: bool = True,
        timeout_s: float = 600.0,
        keep: int = 2,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> None:
        super().__init__(client, run_id, out_dir, rank, keep)
        self.file_too, self.timeout_s, self.bucket_bytes = file_too, timeout_s, bucket_bytes
        self._group = None
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._host: list[torch.Tensor] = []  # rank 0: the last version's buckets, reused
        if rank == 0:
            self.group_info, self._store = GroupInfo.host(group_address, receivers, timeout_s)
            publish_group(client, run_id, self.group_info)
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="weight-send")
            self._pending = self._pool.submit(self._open)  # the generators join while the learner starts

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, rank: int, out_dir: Path) -> CollectivePublisher:
        """The group is hosted at this rank's address; receivers outside it (the evaluator, a
        policy-following scorer) read the files written beside the broadcasts."""
        return cls(
            client,
            cfg.run.name,
            out_dir,
            rank,
            group_address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            receivers=cfg.cluster.generators * tensor_parallel(cfg.cluster.gpus_per_generator),  # a rank per shard
            file_too=cfg.data.eval_size > 0 or cfg.credit.scorer == "policy",
            timeout_s=cfg.generation.weight_group_timeout_s,
        )

    def _with_file(self) -> bool:
        """Whether a version also goes to a file: for the receivers outside the group, those the config
        implies and any that asked (an MC continuation engine, a tool)."""
        return self.file_too or files_wanted(self.client, self.run_id)

    @property
    def collective(self) -> bool:
        """Whether versions still go over the weight group (False after a failure)."""
        return self._pool is not None

    def publish(self, module: torch.nn.Module, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (the manifest when published on this thread, seconds here)."""
        if version == 0:  # every receiver starts from version 0: the group never carries it
            return super().publish(module, version) if self._with_file() else (None, 0.0)
        t0 = time.perf_counter()
        if self.rank != 0:
            take_part(module, self.bucket_bytes)
            return None, time.perf_counter() - t0
        self.wait()  # the send in flight is done with the host buffers
        manifest = None
        device = next(module.parameters()).device
        layout: list[list[Layout]] = []
        buffers: list[torch.Tensor] = []
        for i, bucket in enumerate(gathered_buckets(module, self.bucket_bytes)):
            tensors = [t for _, t in bucket]
            layout.append([(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in bucket])
            buffers.append(flatten(tensors, CPU, self._host_buffer(i, flat_nbytes(tensors))))
        if self.collective:
            # announced before publish() returns, so before the learner admits the next step's
            # prompts: a generator that admits one finds this version waiting (η = 0 holds)
            announced = WeightManifest(version, *_columns(layout), checksum="", path="", nbytes=0, created=time.time())
            publish_manifest(self.client, self.run_id, _collective(announced, layout))
            self._pending = self._pool.submit(self._send, version, layout, buffers, device)
        else:
            manifest = self._write_file(version, layout, buffers)
            publish_manifest(self.client, self.run_id, manifest)
        return manifest, time.perf_counter() - t0

    def wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _host_buffer(self, i: int, nbytes: int) -> torch.Tensor:
        """Bucket ``i``'s host buffer of ``nbytes``, kept from version to version."""
        if i == len(self._host) or self._host[i].numel() != nbytes:
            self._host[i : i + 1] = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())]
        return self._host[i]

    # ----- rank 0, background thread -----
    def _open(self) -> None:
        try:
            self._group = open_group(self.group_info, 0, self.timeout_s, self._store)
        except Exception as e:  # noqa: BLE001 - a generator that never joined: files instead
            log.warning("the weight group did not form (%s: %s); publishing files", type(e).__name__, e)
            self._stop_group()

    def _stop_group(self) -> None:
        pool, self._pool, self._group = self._pool, None, None
        pool.shutdown(wait=False)  # called from the pool's (last) task

    def _send(
        self, version: int, layout: list[list[Layout]], buffers: list[torch.Tensor], device: torch.device
    ) -> None:
        """Background: write the file for receivers outside the group (re-announcing the version with
        its path), then broadcast the buckets; on any failure the version is published as a file."""
        t0 = time.perf_counter()
        written = None  # the file's manifest, once written
        try:
            if self._with_file():
                written = self._write_file(version, layout, buffers)
                publish_manifest(self.client, self.run_id, _collective(written, layout))
            send_buckets(self._group, version, buffers, device)
        except Exception as e:  # noqa: BLE001 - whatever broke the group, the run continues on files
            log.warning(
                "weight group failed at v%d (%s: %s); publishing files from now on", version, type(e).__name__, e
            )
            self._stop_group()
            self.fallbacks += 1
            publish_manifest(self.client, self.run_id, written or self._write_file(version, layout, buffers))
        finally:
            self.send_s += time.perf_counter() - t0

    def _write_file(self, version: int, layout: list[list[Layout]], buffers: list[torch.Tensor]) -> WeightManifest:
        """Stream the version from its host buffers into its file (no copy)."""
        names, shapes, dtypes = _columns(layout)
        tensors = unflatten_buckets(buffers, shapes, dtypes, [len(b) for b in layout])
        return write_weights(version, zip(names, tensors, strict=True), self.out_dir, self.keep)


def take_part(module: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES) -> None:
    """A rank that delivers nothing: take part in the gathers (collectives under ZeRO-3), copy nothing."""
    for _ in gathered_buckets(module, bucket_bytes):
        pass


def columns(module: torch.nn.Module) -> tuple[list[str], list[list[int]], list[str]]:
    """(names, full shapes, dtypes) of every parameter, without gathering."""
    return _columns([_layout(module)])


def _layout(module: torch.nn.Module) -> list[Layout]:
    """(HF name, full shape, dtype) of every parameter, without gathering (ZeRO-3 keeps ``ds_shape``)."""
    return [
        (n, list(getattr(p, "ds_shape", p.shape)), str(p.dtype).removeprefix("torch."))
        for n, p in module.named_parameters()
    ]


def _columns(layout: list[list[Layout]]) -> tuple[list[str], list[list[int]], list[str]]:
    """(names, shapes, dtypes) of every tensor of the buckets, in order."""
    flat = [x for bucket in layout for x in bucket]
    return [n for n, _, _ in flat], [s for _, s, _ in flat], [d for _, _, d in flat]


def _collective(manifest: WeightManifest, layout: list[list[Layout]]) -> WeightManifest:
    """``manifest`` marked as broadcast over the group, with the tensors per bucket."""
    return dataclasses.replace(manifest, transport="collective", buckets=[len(b) for b in layout])
