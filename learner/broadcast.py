"""Full weights out of a (possibly ZeRO-3 partitioned) model, and their versioned publication.

Parameters are gathered in buckets of about ``bucket_bytes`` (one ``GatheredParameters`` call per
bucket, all ranks take part), copied to CPU, and handed to ``common.weight_sync`` by rank 0 as
one safetensors file per version — never one remote call per tensor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import redis
import torch

from rredcot.common.weight_sync import WeightManifest, publish_weights

BUCKET_BYTES = 256 * 2**20


def _is_partitioned(p: torch.nn.Parameter) -> bool:
    return hasattr(p, "ds_id")


def gathered_buckets(module: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES,
                     ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """(HF name, full CPU tensor) lists of about ``bucket_bytes`` each; a collective under ZeRO-3."""
    import deepspeed

    named = list(module.named_parameters())
    start = 0
    while start < len(named):
        end, size = start, 0
        while end < len(named) and (end == start or size + _numel(named[end][1]) * 4 <= bucket_bytes):
            size += _numel(named[end][1]) * 4
            end += 1
        bucket = named[start:end]
        params = [p for _, p in bucket if _is_partitioned(p)]
        with deepspeed.zero.GatheredParameters(params, enabled=bool(params)):
            yield [(n, p.detach().to("cpu", copy=True)) for n, p in bucket]
        start = end


def _numel(p: torch.nn.Parameter) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """All parameters as full CPU tensors by HF name (a collective under ZeRO-3)."""
    return {n: t for bucket in gathered_buckets(module) for n, t in bucket}


def broadcast(module: torch.nn.Module, client: redis.Redis | None, run_id: str, version: int,
              out_dir: str | Path, rank: int, keep: int = 2) -> tuple[WeightManifest | None, float]:
    """Publish ``version`` (rank 0; every rank gathers); returns (manifest on rank 0, seconds)."""
    t0 = time.perf_counter()
    state = full_state(module)
    manifest = None
    if rank == 0 and client is not None:
        manifest = publish_weights(client, run_id, version, state.items(), out_dir, keep=keep)
    return manifest, time.perf_counter() - t0
