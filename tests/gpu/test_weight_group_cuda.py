"""The collective transport's host buckets on a CUDA device: staged there, checksummed there (a gloo
group of threads carries CUDA tensors; ``tests/unit/transports/test_group.py`` on CPU)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rredcot.transports.group import checksum, flatten, receive_buckets, send_buckets
from tests.unit.transports.test_group import thread_group

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CPU = torch.device("cpu")


def test_host_buckets_are_staged_on_the_device_and_checked_there():
    cuda = torch.device("cuda", torch.cuda.current_device())
    _, groups = thread_group(1, backend="gloo")
    host = [flatten([torch.randn(1000)], CPU), flatten([torch.randn(77, 3)], CPU)]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(receive_buckets, groups[1], [b.numel() for b in host], cuda)
        sums = send_buckets(groups[0], 4, host, cuda)
        version, received = pending.result(30)
    assert version == 4 and sums == [checksum(b.to(cuda)).item() for b in host]  # computed on the group's device
    assert all(r.device == cuda and torch.equal(r.cpu(), h) for r, h in zip(received, host, strict=True))
