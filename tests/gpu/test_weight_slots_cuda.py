"""The ipc transport's GPU slots: two processes on one GPU, where NCCL refuses two ranks. This
process owns the slots (as learner rank 0 does); a second one opens a slot by CUDA IPC from its
msgpack handle, copies it to its GPU memory and to the host, then copies it again after it was
rewritten in place (each version reuses its slot)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch

from rredcot.transports.slots import SlotRing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

RECEIVER = """
import sys, msgpack, torch
from rredcot.transports.slots import copy_slot, reachable
for line in sys.stdin:
    handle = msgpack.unpackb(bytes.fromhex(line.strip()), raw=False)
    why = reachable(handle)
    on_gpu = copy_slot(handle, torch.device("cuda", torch.cuda.current_device()))
    on_host = copy_slot(handle, torch.device("cpu"))
    assert torch.equal(on_gpu.cpu(), on_host)
    print(repr(why), int(on_host.to(torch.int64).sum()), on_host[:4].tolist(), flush=True)
"""


def _pattern(n: int, shift: int) -> torch.Tensor:
    return (torch.arange(n, device="cuda") + shift).remainder(251).to(torch.uint8)


def test_a_gpu_slot_is_read_by_another_process_on_the_same_gpu_and_again_after_a_rewrite():
    n = 48 * 2**20 + 16  # larger than one allocator block class, not a power of two
    ring = SlotRing("gpu-test", "0123456789ab", n, torch.device("cuda", torch.cuda.current_device()))
    assert ring.kind == "cuda" and ring.handles[1]["ipc"][0] == str(torch.cuda.get_device_properties(0).uuid)
    receiver = subprocess.Popen(
        [sys.executable, "-c", RECEIVER],
        cwd=Path(__file__).parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for shift in (0, 7):  # the second version rewrites the same slot in place
            expected = _pattern(n, shift)
            ring.buffers[1].copy_(expected)
            torch.cuda.synchronize()
            receiver.stdin.write(msgpack.packb(ring.handles[1]).hex() + "\n")
            receiver.stdin.flush()
            line = receiver.stdout.readline()
            assert line, receiver.stderr.read()[-4000:]
            assert line.split(" ", 2) == [
                "''",
                str(int(expected.to(torch.int64).sum())),
                f"{expected[:4].tolist()}\n",
            ], line
    finally:
        receiver.stdin.close()
        receiver.wait(timeout=60)
        ring.close()
    assert receiver.returncode == 0, receiver.stderr.read()[-4000:]
