"""Full weights out of a (possibly ZeRO-3 partitioned) model, for the publishers.

Parameters are gathered in buckets of about ``bucket_bytes`` (one ``GatheredParameters`` call per
bucket, all ranks take part). Only rank 0 copies anything: the other ranks take part in the gathers
(``take_part``) and hold nothing more. Never one remote call per tensor. DeepSpeed is imported on the
first gather, not with this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rredcot.transports.group import bucket_counts

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


def take_part(module: torch.nn.Module, bucket_bytes: int = BUCKET_BYTES) -> None:
    """A rank that delivers nothing: take part in the gathers (collectives under ZeRO-3), copy nothing."""
    for _ in gathered_buckets(module, bucket_bytes):
        pass


@contextmanager
def gathered_tensors(module: torch.nn.Module, *errors: type[Exception]) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """Rank 0's side of a publish: every (HF name, full parameter) in order, bucket by bucket. On one
    of ``errors`` raised in the block (a full disk, Redis out of memory), even before the first
    tensor, finish the gathers first, since the other ZeRO-3 ranks wait in them, then re-raise."""
    buckets = gathered_buckets(module)
    try:
        yield (item for bucket in buckets for item in bucket)
    except errors:
        for _ in buckets:
            pass
        raise


def columns(module: torch.nn.Module) -> tuple[list[str], list[list[int]], list[str]]:
    """(names, full shapes, dtypes) of every parameter, without gathering."""
    return layout_columns([_layout(module)])


def _layout(module: torch.nn.Module) -> list[Layout]:
    """(HF name, full shape, dtype) of every parameter, without gathering (ZeRO-3 keeps ``ds_shape``)."""
    return [
        (n, list(getattr(p, "ds_shape", p.shape)), str(p.dtype).removeprefix("torch."))
        for n, p in module.named_parameters()
    ]


def layout_columns(layout: list[list[Layout]]) -> tuple[list[str], list[list[int]], list[str]]:
    """(names, shapes, dtypes) of every tensor of the buckets, in order."""
    flat = [x for bucket in layout for x in bucket]
    return [n for n, _, _ in flat], [s for _, s, _ in flat], [d for _, _, d in flat]
