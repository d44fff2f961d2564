"""Shared weight slots on the learner's node: a slot written here is read by another process, the
stamps guard against a slot overwritten during a copy, and a receiver elsewhere is told why not."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import pytest
import torch

from rredcot.transports.slots import SLOTS, SlotRing, copy_slot, holds, node_id, reachable, slot_path, stamp

CPU = torch.device("cpu")

_READER = """
import sys, msgpack, torch
from rredcot.transports.slots import copy_slot
handle = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
own = copy_slot(handle, torch.device("cpu"))
sys.stdout.write(",".join(str(x) for x in own[:: handle["nbytes"] // 8].tolist()) + ";" + str(int(own.sum())))
"""


def test_a_slot_written_here_is_read_by_another_process(tmp_path):
    ring = SlotRing("r/1", "0123456789ab", 4096, CPU, tmp_path)
    assert [p.name for p in sorted(tmp_path.iterdir())] == [f"rredcot-r_1-0123456789ab-slot{i}" for i in range(SLOTS)]
    pattern = torch.arange(4096, dtype=torch.int64).remainder(251).to(torch.uint8)
    ring.buffers[1].copy_(pattern)
    handle = ring.handles[1]
    assert handle["index"] == 1 and handle["node"] == node_id() and reachable(handle) == ""
    out = subprocess.run(
        [sys.executable, "-c", _READER], input=msgpack.packb(handle), capture_output=True, check=True
    ).stdout.decode()
    every_512th, total = out.split(";")
    assert every_512th == ",".join(str(x) for x in pattern[::512].tolist()) and int(total) == int(pattern.sum())
    assert torch.equal(copy_slot(ring.handles[0], CPU), torch.zeros(4096, dtype=torch.uint8))  # reserved, zeroed
    ring.close()
    assert not any(tmp_path.iterdir())


def test_a_restarted_learner_replaces_its_slots_and_an_old_mapping_keeps_its_pages(tmp_path):
    old = SlotRing("r", "u1", 64, CPU, tmp_path)
    old.buffers[0].fill_(7)
    mapped = copy_slot(old.handles[0], CPU)
    new = SlotRing("r", "u1", 128, CPU, tmp_path)  # the old learner was killed: its files are replaced
    assert slot_path("r", "u1", 0, tmp_path).stat().st_size == 128
    assert int(old.buffers[0].sum()) == 7 * 64 and int(mapped.sum()) == 7 * 64  # unlinked, still readable
    assert int(copy_slot(new.handles[0], CPU).sum()) == 0
    new.close()


def test_slots_that_do_not_fit_are_an_error_at_allocation_and_leave_no_file(tmp_path):
    with pytest.raises(OSError):
        SlotRing("r", "u1", 2**55, CPU, tmp_path)  # 32 PiB: no tmpfs or disk has that much
    assert not any(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError):
        SlotRing("r", "u1", 64, CPU, tmp_path / "missing")


def test_the_stamp_names_the_version_a_slot_holds(redis_client, run_id):
    assert not holds(redis_client, run_id, 0, 0)  # never stamped
    stamp(redis_client, run_id, 1, 5)
    assert holds(redis_client, run_id, 1, 5) and not holds(redis_client, run_id, 1, 3)
    stamp(redis_client, run_id, 1, -1)  # being overwritten
    assert not holds(redis_client, run_id, 1, 5)


def test_a_slot_of_another_node_or_an_unseen_gpu_is_unreachable_with_the_reason():
    here = {"kind": "host", "node": node_id(), "nbytes": 8, "index": 0, "path": "/dev/shm/x"}
    assert reachable(here) == ""
    assert "memory of another node (elsewhere/1)" in reachable({**here, "node": "elsewhere/1"})
    gpu = {**here, "kind": "cuda", "ipc": ["GPU-0000", b"", 8, 0, b"", 0, b"", False]}
    assert reachable(gpu).startswith("the slots are on GPU GPU-0000, which this process does not see")
