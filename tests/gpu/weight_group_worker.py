"""One rank of the NCCL weight-group test (run by test_weight_group_nccl.py, one process per GPU)."""

from __future__ import annotations

import json
import sys
import time

import redis
import torch

from rredcot.transports.group import (
    GroupInfo,
    flatten,
    open_group,
    publish_group,
    read_group,
    receive_tensors,
    send_buckets,
)

SHAPES = [[1000, 64], [64], [3, 5, 7]]
DTYPES = ["bfloat16", "float32", "float32"]
BUCKETS = [1, 2]


def weights() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(getattr(torch, d)) for s, d in zip(SHAPES, DTYPES, strict=True)]


def main(spec: dict) -> None:
    rank = spec["rank"]
    torch.cuda.set_device(rank)
    client = redis.Redis.from_url(spec["redis_url"])
    if rank == 0:
        info, store = GroupInfo.host("127.0.0.1", 1, 60)
        assert info.backend == "nccl"
        publish_group(client, spec["run_id"], info)
        group = open_group(info, 0, 60, store)
        tensors = [t.cuda() for t in weights()]
        buffers = [flatten(tensors[:1], tensors[0].device), flatten(tensors[1:], tensors[0].device)]
        send_buckets(group, 7, buffers)
        return
    while (info := read_group(client, spec["run_id"])) is None:
        time.sleep(0.05)
    group = open_group(info, 1, 60)
    names = [f"w{i}" for i in range(len(SHAPES))]
    version, got = receive_tensors(group, names, SHAPES, DTYPES, BUCKETS, torch.device("cuda", 1))
    assert version == 7
    for name, want in zip(names, weights(), strict=True):
        assert got[name].device.type == "cuda" and torch.equal(got[name].cpu(), want), name


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
