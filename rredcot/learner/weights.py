"""A version's weights as the learner hands them to its publisher (``transports.WeightSource``):
plain (HF name, full tensor) buckets out of a possibly ZeRO-3 partitioned model.

Parameters are gathered in buckets of about ``bucket_bytes`` (one ``GatheredParameters`` call per
bucket, all ranks take part). Only rank 0's publisher reads the tensors; every rank ``drain``s the
source afterwards, so the gathers the others wait in always finish, also when the publisher stopped
part-way (a full disk, Redis out of memory). Never one remote call per tensor. DeepSpeed is imported
on the first gather, not with this module.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from rredcot.transports.group import bucket_counts

if TYPE_CHECKING:
    from rredcot.transports import Publisher
    from rredcot.transports.manifest import WeightManifest

BUCKET_BYTES = 256 * 2**20


def _numel(p: torch.nn.Parameter) -> int:
    return int(getattr(p, "ds_numel", p.numel()))


def gathered_buckets(
    module: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES
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


def take_part(module: torch.nn.Module) -> None:
    """A rank that keeps nothing: take part in the gathers (collectives under ZeRO-3), copy nothing."""
    for _ in gathered_buckets(module):
        pass


class ModelWeights:
    """``transports.WeightSource`` over the learner's module: its layout without gathering, and its
    buckets, gathered once, in order."""

    def __init__(self, module: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.module = module
        self.device = next(module.parameters()).device
        self._buckets = gathered_buckets(module, bucket_bytes)

    def columns(self) -> tuple[list[str], list[list[int]], list[str]]:
        """(names, full shapes, dtypes) of every parameter (ZeRO-3 keeps ``ds_shape``), in bucket order."""
        named = list(self.module.named_parameters())
        return (
            [n for n, _ in named],
            [list(getattr(p, "ds_shape", p.shape)) for _, p in named],
            [str(p.dtype).removeprefix("torch.") for _, p in named],
        )

    def buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The buckets, once: each bucket's tensors are valid until the next is asked for."""
        return self._buckets

    def drain(self) -> None:
        """Finish the gathers (every rank calls this after a publish, read in full or not)."""
        for _ in self._buckets:
            pass


def publish(
    publisher: Publisher | None, module: torch.nn.Module, version: int, bucket_bytes: int = BUCKET_BYTES
) -> tuple[WeightManifest | None, float]:
    """``module``'s weights as ``version`` through rank 0's ``publisher`` (None on the other ranks, which
    only take part in the gathers); returns (the manifest if published on this thread, seconds here)."""
    t0 = time.perf_counter()
    weights = ModelWeights(module, bucket_bytes)
    manifest = None
    try:
        if publisher is not None:
            manifest, _ = publisher.publish(weights, version)
    finally:
        weights.drain()  # the gathers finish on every rank (ZeRO-3 ranks wait in them), read in full or not
    return manifest, time.perf_counter() - t0
