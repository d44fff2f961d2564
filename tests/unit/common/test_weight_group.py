"""The collective weight transport's wire format over a real gloo group (threads as ranks)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rredcot.common.weight_group import (
    GroupInfo,
    _broadcast,
    bucket_counts,
    bucket_nbytes,
    flatten,
    open_group,
    publish_group,
    read_group,
    receive_buckets,
    send_buckets,
    unflatten,
)
from rredcot.common.weight_sync import WeightSyncError

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


def _group(receivers: int) -> tuple[GroupInfo, list]:
    """Open a group of 1 + ``receivers`` ranks in threads; (info, groups by rank)."""
    info, store = GroupInfo.host("127.0.0.1", receivers, timeout_s=20)
    with ThreadPoolExecutor(receivers + 1) as pool:
        futures = [pool.submit(open_group, info, r, 20, store if r == 0 else None) for r in range(receivers + 1)]
        return info, [f.result() for f in futures]


def test_every_receiver_gets_each_version_with_its_own_number(redis_client, run_id):
    info, groups = _group(2)
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
    digests = [send_buckets(groups[0], 10 + v, b) for v, b in enumerate(buffers)]  # sent back to back
    for t in threads:
        t.join(30)
    assert len(set(digests)) == 2 and all(len(d) == 64 for d in digests)
    for rank in (1, 2):
        assert [v for v, _ in got[rank]] == [10, 11]
        for (_, received), sent in zip(got[rank], buffers, strict=True):
            assert all(torch.equal(r, s) for r, s in zip(received, sent, strict=True))


def test_a_wrong_digest_or_layout_is_an_error_on_the_receiving_side():
    _, groups = _group(1)
    payload = torch.arange(40, dtype=torch.uint8)
    header = torch.tensor([3, 40], dtype=torch.int64).view(torch.uint8)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(receive_buckets, groups[1], [40], CPU)
        for t in (header, payload, torch.zeros(32, dtype=torch.uint8)):  # a digest that does not match
            _broadcast(groups[0], t)
        with pytest.raises(WeightSyncError, match="v3 do not match"):
            pending.result(30)
        pending = pool.submit(receive_buckets, groups[1], [39], CPU)  # a manifest of another layout
        _broadcast(groups[0], header)
        with pytest.raises(WeightSyncError, match="40 bytes"):
            pending.result(30)
