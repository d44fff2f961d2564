"""The ``collective`` transport's weight group: learner rank 0 broadcasts flat byte buckets to every generator.

One process group holds learner rank 0 (group rank 0, the source) and generator ``i`` (group rank
``i + 1``; with engines tensor-parallel over ``t`` GPUs, engine ``i``'s worker ``w`` is rank
``1 + i·t + w``: each worker receives every bucket and loads its own shard). It is built from its
own ``TCPStore`` (hosted by the learner) and a store prefix unique to each learner start
(``epoch``), so it never touches the default process group of DeepSpeed or vLLM and a receiver
never joins a stale group. Backend: gloo on CPU, NCCL on GPU — the same code.

Wire format of one version: the manifest (``transports.manifest``, ``transport="collective"``,
``buckets`` = tensors per bucket) is published in Redis first; then rank 0 broadcasts each bucket
after a 16-byte header (version, total bytes) as one contiguous ``uint8`` buffer (the bucket's
tensors in manifest order, each at a 16-byte aligned offset), then one int64 :func:`checksum` per
bucket. The header labels the bytes: a sender may run a version ahead of a slow receiver (socket
buffers), and the receiver still applies each version under its own number. A receiver sizes its
buffers from the manifest (the layout is the same for every version), checks every bucket's
checksum, and only then hands the tensors on. Never one call per tensor.

The checksum is computed where the bucket is, by the kind of device the group runs on (both ends
hold their buckets there, so they compute the same function):

- a CPU bucket (gloo): CRC-32 (zlib; any burst of up to 32 flipped bits changes it), 9× faster here
  than the sum below on CPU (0.20 against 1.84 s for 437 MiB, ``bench/weight_transports.py``'s model);
- a GPU bucket (NCCL): a position-weighted sum computed in torch on the device, so no bucket is copied
  to the host to be checked: the bytes as int16 words, weighted by their position in rows of 2^16
  words, each row sum taken modulo the prime 2^31 − 1 and weighted by its row number. Integers stay
  below 2^63, so nothing overflows; a change within one word (a flipped byte) always changes it, as
  does moving a word within its row. Temporary device memory: under 100 MiB (8 MiB of the bucket at
  a time, as int64), whatever its size.

Either guards against transport corruption and layout mix-ups, not tampering.

A sender whose buckets live off the group's device (the learner keeps each version in host memory)
stages them one at a time through one device buffer of the largest bucket's size.
"""

from __future__ import annotations

import math
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta

import msgpack
import redis
import torch
import torch.distributed as dist

from rredcot.common.net import hosted_store
from rredcot.common.streams import registry_key
from rredcot.transports.manifest import WeightSyncError

ALIGN = 16  # every tensor starts at a multiple of this in its bucket (any dtype can view it)
_PRIME = 2**31 - 1
_ROW = 2**16  # int16 words per checksum row
_BLOCK = 64 * _ROW  # words per checksum block (8 MiB of a bucket)


@dataclass(frozen=True)
class GroupInfo:
    """Where and how to join the weight group (published by learner rank 0 in Redis)."""

    address: str
    port: int
    world: int  # 1 + the generators' engine workers (one per generator, or per GPU of a tensor-parallel one)
    backend: str  # "gloo" (CPU) or "nccl" (GPU)
    epoch: str  # unique per learner start

    @classmethod
    def host(cls, address: str, receivers: int, timeout_s: float) -> tuple[GroupInfo, dist.TCPStore]:
        """Rank 0: start the group's store on a free port of ``address``; (its info, the store)."""
        store = hosted_store(address, receivers + 1, timedelta(seconds=timeout_s))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        return cls(address, store.port, receivers + 1, backend, uuid.uuid4().hex), store

    def encode(self) -> bytes:
        return msgpack.packb(asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> GroupInfo:
        return cls(**msgpack.unpackb(data, raw=False))


def group_key(run_id: str) -> str:
    return f"rredcot:{run_id}:weights:group"


def publish_group(client: redis.Redis, run_id: str, info: GroupInfo) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.sadd(registry_key(run_id), group_key(run_id))
    pipe.set(group_key(run_id), info.encode())
    pipe.execute()


def read_group(client: redis.Redis, run_id: str) -> GroupInfo | None:
    data = client.get(group_key(run_id))
    return None if data is None else GroupInfo.decode(data)


def device_for(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def open_group(
    info: GroupInfo,
    rank: int,
    timeout_s: float,
    store: dist.TCPStore | None = None,
) -> dist.ProcessGroup:
    """Join the group as ``rank`` (rank 0 passes the store it hosts); blocks until all ranks joined."""
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(info.address, info.port, info.world, False, timeout)
    prefixed = dist.PrefixStore(f"rredcot-weights/{info.epoch}", store)
    if info.backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, info.world, options)
    return dist.ProcessGroupGloo(prefixed, rank, info.world, timeout)


def bucket_counts(sizes: Sequence[int], bucket_bytes: int) -> list[int]:
    """Greedy split of tensors of ``sizes`` bytes into buckets of at most ``bucket_bytes`` (≥ 1 each)."""
    counts: list[int] = []
    filled = bucket_bytes + 1
    for size in sizes:
        if counts and filled + size <= bucket_bytes:
            counts[-1] += 1
            filled += size
        else:
            counts.append(1)
            filled = size
    return counts


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def _slot(nbytes: int) -> int:
    """Bytes a tensor takes in a bucket: its size rounded up, so every tensor starts aligned."""
    return -(-nbytes // ALIGN) * ALIGN


def bucket_nbytes(shapes: Sequence[Sequence[int]], dtypes: Sequence[str], counts: Sequence[int]) -> list[int]:
    """Bytes of each bucket, from the manifest's shapes, dtypes and tensors per bucket."""
    sizes = [_slot(tensor_nbytes(s, d)) for s, d in zip(shapes, dtypes, strict=True)]
    out, start = [], 0
    for n in counts:
        out.append(sum(sizes[start : start + n]))
        start += n
    if start != len(sizes):
        raise WeightSyncError(f"buckets hold {start} tensors, the manifest names {len(sizes)}")
    return out


def flat_nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the bucket ``flatten`` makes of ``tensors``."""
    return sum(_slot(t.numel() * t.element_size()) for t in tensors)


def flatten(tensors: Sequence[torch.Tensor], device: torch.device, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tensors' bytes in one ``uint8`` buffer on ``device``, each at an ``ALIGN``-byte offset: a new
    zeroed one, or ``out`` (of ``flat_nbytes(tensors)`` bytes, reused: its padding is left as is)."""
    buffer = torch.zeros(flat_nbytes(tensors), dtype=torch.uint8, device=device) if out is None else out
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        buffer[offset : offset + n].view(t.dtype).view(t.shape).copy_(t.detach())
        offset += _slot(n)
    return buffer


def unflatten(buffer: torch.Tensor, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> list[torch.Tensor]:
    """Views of ``buffer`` as the tensors ``flatten`` packed (``shapes``/``dtypes`` in order)."""
    out, offset = [], 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        n = tensor_nbytes(shape, dtype)
        out.append(buffer[offset : offset + n].view(getattr(torch, dtype)).view(list(shape)))
        offset += _slot(n)
    if offset != buffer.numel():
        raise WeightSyncError(f"bucket of {buffer.numel()} bytes, its tensors take {offset}")
    return out


def unflatten_buckets(
    buffers: Sequence[torch.Tensor], shapes: Sequence[Sequence[int]], dtypes: Sequence[str], counts: Sequence[int]
) -> list[torch.Tensor]:
    """All tensors of the buckets, in order (bucket ``i`` holds ``counts[i]`` of them)."""
    tensors, start = [], 0
    for buffer, n in zip(buffers, counts, strict=True):
        tensors += unflatten(buffer, shapes[start : start + n], dtypes[start : start + n])
        start += n
    return tensors


def checksum(buffer: torch.Tensor) -> torch.Tensor:
    """The int64 checksum (0-d, on the buffer's device) of a ``uint8`` bucket of even length: CRC-32 on
    the CPU, the position-weighted sum elsewhere (module docstring)."""
    if buffer.device.type == "cpu":
        return torch.tensor(zlib.crc32(memoryview(buffer.contiguous().numpy())), dtype=torch.int64)
    return weighted_sum(buffer)


def weighted_sum(buffer: torch.Tensor) -> torch.Tensor:
    """The position-weighted sum of a ``uint8`` bucket of even length, computed in torch on its device
    (module docstring)."""
    words = buffer.view(torch.int16)
    weights = torch.arange(1, _ROW + 1, dtype=torch.int64, device=buffer.device)
    total = torch.zeros((), dtype=torch.int64, device=buffer.device)
    for start in range(0, words.numel(), _BLOCK):
        block = words[start : start + _BLOCK].to(torch.int64)
        rows = torch.nn.functional.pad(block, (0, -block.numel() % _ROW)).view(-1, _ROW)
        sums = (rows * weights).sum(1).remainder(_PRIME)  # |row sum| < 2^47
        first = start // _ROW + 1
        index = torch.arange(first, first + len(sums), dtype=torch.int64, device=buffer.device)
        total += (sums * index).remainder(_PRIME).sum()
    return total.remainder(_PRIME)


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def send_buckets(
    group: dist.ProcessGroup, version: int, buffers: Sequence[torch.Tensor], device: torch.device | None = None
) -> list[int]:
    """Rank 0: broadcast the header, every bucket (at least one), then their checksums (returned).

    ``device``: the group's (default: the first bucket's); buckets elsewhere are staged through one
    reused buffer there, so the extra device memory is one bucket."""
    device = buffers[0].device if device is None else device
    header = torch.tensor([version, sum(b.numel() for b in buffers)], dtype=torch.int64)
    _broadcast(group, header.view(torch.uint8).to(device))
    staging = None
    sums = []
    for b in buffers:
        if b.device != device:
            if staging is None:
                staging = torch.empty(max(x.numel() for x in buffers), dtype=torch.uint8, device=device)
            b = staging[: b.numel()].copy_(b)
        _broadcast(group, b)
        sums.append(checksum(b))
    sent = torch.stack(sums)
    _broadcast(group, sent.view(torch.uint8))
    return sent.tolist()


def receive_buckets(
    group: dist.ProcessGroup,
    nbytes: Sequence[int],
    device: torch.device,
) -> tuple[int, list[torch.Tensor]]:
    """Receive one version: (its number, buckets of ``nbytes`` each); raises ``WeightSyncError`` on a
    layout or checksum mismatch."""
    header = torch.empty(16, dtype=torch.uint8, device=device)
    _broadcast(group, header)
    version, total = header.cpu().view(torch.int64).tolist()
    if total != sum(nbytes):
        raise WeightSyncError(f"the learner sends {total} bytes of weights, the manifest describes {sum(nbytes)}")
    buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in nbytes]
    for b in buffers:
        _broadcast(group, b)
    sent = torch.empty(len(buffers), dtype=torch.int64, device=device)
    _broadcast(group, sent.view(torch.uint8))
    got = torch.stack([checksum(b) for b in buffers])
    if not torch.equal(sent, got):
        bad = [i for i, (s, g) in enumerate(zip(sent.tolist(), got.tolist(), strict=True)) if s != g]
        raise WeightSyncError(f"received weights v{version} do not match the sender's checksums (buckets {bad})")
    return version, buffers


def receive_tensors(
    group: dist.ProcessGroup,
    names: Sequence[str],
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    buckets: Sequence[int],
    device: torch.device,
) -> tuple[int, dict[str, torch.Tensor]]:
    """Receive one version laid out as a manifest describes it: (its number, tensors by HF name)."""
    version, buffers = receive_buckets(group, bucket_nbytes(shapes, dtypes, buckets), device)
    return version, dict(zip(names, unflatten_buckets(buffers, shapes, dtypes, buckets), strict=True))
