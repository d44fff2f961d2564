"""The collective weight transport's wire format over a real gloo group (threads as ranks)."""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
import torch

from rredcot.transports.group import (
    GroupInfo,
    _broadcast,
    bucket_counts,
    bucket_nbytes,
    checksum,
    flat_nbytes,
    flatten,
    open_group,
    publish_group,
    read_group,
    receive_buckets,
    send_buckets,
    unflatten,
    weighted_sum,
)
from rredcot.transports.manifest import WeightSyncError

CPU = torch.device("cpu")


def test_bucket_counts_fill_greedily_and_never_leave_a_bucket_empty():
    assert bucket_counts([4, 4, 4, 4], 8) == [2, 2]
    assert bucket_counts([4, 4, 4], 9) == [2, 1]
    assert bucket_counts([20, 1, 1, 30], 8) == [1, 2, 1]  # an oversized tensor gets its own bucket
    assert bucket_counts([], 8) == []


def test_flatten_and_unflatten_round_trip_mixed_dtypes_and_shapes():
    tensors = [
        torch.randn(3, 5),
        torch.randn(7).to(torch.bfloat16),
        torch.arange(6).view(2, 3),
        torch.tensor(2.5),
        torch.randn(4, 1, 2).transpose(0, 2),
    ]  # a non-contiguous one
    shapes = [list(t.shape) for t in tensors]
    dtypes = [str(t.dtype).removeprefix("torch.") for t in tensors]
    buffer = flatten(tensors, CPU)
    # 60, 14, 48, 4 and 32 bytes, each in a 16-byte aligned slot
    assert buffer.dtype == torch.uint8 and buffer.numel() == 64 + 16 + 48 + 16 + 32
    assert bucket_nbytes(shapes, dtypes, [2, 3]) == [64 + 16, 48 + 16 + 32]
    for back, t in zip(unflatten(buffer, shapes, dtypes), tensors, strict=True):
        assert back.dtype == t.dtype and torch.equal(back, t)
    with pytest.raises(WeightSyncError, match="bytes"):
        unflatten(buffer, shapes[:-1], dtypes[:-1])
    with pytest.raises(WeightSyncError, match="tensors"):
        bucket_nbytes(shapes, dtypes, [2, 2])
    reused = torch.full((flat_nbytes(tensors),), 7, dtype=torch.uint8)
    assert flatten(tensors, CPU, reused) is reused  # refilled in place, padding left as it was
    assert all(torch.equal(a, b) for a, b in zip(unflatten(reused, shapes, dtypes), tensors, strict=True))


@pytest.mark.slow  # every byte of a large buffer
@pytest.mark.parametrize("digest", [checksum, weighted_sum], ids=["cpu-crc32", "weighted-sum"])
def test_the_checksum_sees_any_flipped_byte_and_moved_words(digest):
    """Both functions, on the CPU: a CPU bucket's CRC-32, and the sum a GPU bucket gets."""
    g = torch.Generator().manual_seed(0)
    buffer = torch.randint(0, 256, (3 * 2**23 + 48,), dtype=torch.uint8, generator=g)  # 3 blocks and a bit
    base = digest(buffer)
    assert base.dtype == torch.int64 and base.dim() == 0 and torch.equal(digest(buffer.clone()), base)
    positions = [0, 1, 2**17 - 1, 2**17, 2**23 + 5, buffer.numel() - 1] + torch.randint(
        0, buffer.numel(), (12,), generator=g
    ).tolist()
    corrupt = buffer.clone()
    for i in positions:
        for flip in (0x01, 0x80, 0xFF):
            corrupt[i] ^= flip
            assert not torch.equal(digest(corrupt), base), (i, flip)
            corrupt[i] ^= flip
    swapped = buffer.clone().view(torch.int16)
    swapped[[10, 11]] = swapped[[11, 10]]
    assert swapped[10] == swapped[11] or not torch.equal(digest(swapped.view(torch.uint8)), base)
    assert digest(torch.empty(0, dtype=torch.uint8)) == 0


def test_a_cpu_bucket_gets_its_crc32_and_a_gpu_bucket_the_weighted_sum():
    data = bytes(range(256)) * 3
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert checksum(buffer).item() == zlib.crc32(data) and checksum(buffer[1:-1]).item() == zlib.crc32(data[1:-1])
    assert weighted_sum(torch.zeros(32, dtype=torch.uint8)).item() == 0
    assert weighted_sum(buffer).item() != checksum(buffer).item()


def thread_group(receivers: int, backend: str | None = None) -> tuple[GroupInfo, list]:
    """Open a group of 1 + ``receivers`` ranks in threads; (info, groups by rank). ``backend``
    overrides the host's choice (NCCL refuses two ranks on one GPU: threads on a GPU use gloo)."""
    info, store = GroupInfo.host("127.0.0.1", receivers, timeout_s=20)
    info = replace(info, backend=backend or info.backend)
    with ThreadPoolExecutor(receivers + 1) as pool:
        futures = [pool.submit(open_group, info, r, 20, store if r == 0 else None) for r in range(receivers + 1)]
        return info, [f.result() for f in futures]


def test_every_receiver_gets_each_version_with_its_own_number(redis_client, run_id):
    info, groups = thread_group(2)
    publish_group(redis_client, run_id, info)
    assert read_group(redis_client, run_id) == info and info.world == 3 and info.backend == "gloo"
    versions = [[torch.randn(300), torch.randn(7, 11)] for _ in range(2)]
    buffers = [[flatten([a], CPU), flatten([b], CPU)] for a, b in versions]
    nbytes = [b.numel() for b in buffers[0]]
    got: dict[int, list] = {1: [], 2: []}

    def receive(rank: int) -> None:
        for _ in versions:
            got[rank].append(receive_buckets(groups[rank], nbytes, CPU))

    threads = [threading.Thread(target=receive, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    sums = [send_buckets(groups[0], 10 + v, b) for v, b in enumerate(buffers)]  # sent back to back
    for t in threads:
        t.join(30)
    assert sums == [[checksum(x).item() for x in b] for b in buffers] and sums[0] != sums[1]
    for rank in (1, 2):
        assert [v for v, _ in got[rank]] == [10, 11]
        for (_, received), sent in zip(got[rank], buffers, strict=True):
            assert all(torch.equal(r, s) for r, s in zip(received, sent, strict=True))


def test_a_corrupted_bucket_or_wrong_layout_is_an_error_on_the_receiving_side():
    _, groups = thread_group(1)
    first, payload = torch.arange(16, dtype=torch.uint8), torch.arange(40, dtype=torch.uint8)
    corrupt = payload.clone()
    corrupt[17] ^= 0x04  # one flipped bit between the sender's checksum and the receiver
    header = torch.tensor([3, 56], dtype=torch.int64).view(torch.uint8)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(receive_buckets, groups[1], [16, 40], CPU)
        sums = torch.stack([checksum(first), checksum(payload)]).view(torch.uint8)
        for t in (header, first, corrupt, sums):
            _broadcast(groups[0], t)
        with pytest.raises(WeightSyncError, match=r"v3 do not match the sender's checksums \(buckets \[1\]\)"):
            pending.result(30)
        header = torch.tensor([3, 40], dtype=torch.int64).view(torch.uint8)
        pending = pool.submit(receive_buckets, groups[1], [39], CPU)  # a manifest of another layout
        _broadcast(groups[0], header)
        with pytest.raises(WeightSyncError, match="40 bytes"):
            pending.result(30)
