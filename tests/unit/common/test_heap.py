import platform
import resource
import subprocess
import sys

import psutil
import pytest

from rredcot.common.heap import trim_heap

MIB = 2**20


glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim and mallopt are glibc's")


@glibc_only
def test_trimming_returns_the_pages_freed_between_live_allocations():
    proc = psutil.Process()
    blocks = [bytes(4096) for _ in range(60_000)]  # ~234 MiB of malloc'd blocks (above pymalloc's 512 B)
    kept = blocks[::64]  # one live block every 256 KiB: glibc cannot shrink the heap past them
    del blocks
    before = proc.memory_info().rss
    assert trim_heap()
    after = proc.memory_info().rss
    assert before - after > 100 * MIB, (before / MIB, after / MIB)
    assert len(kept) == 938


FAULTS = """
import resource, torch
from rredcot.common.heap import retained_heap

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        torch.ones(16 * 2**20)  # 64 MiB of float32, every page written, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

first = faults()
with retained_heap() as retained:
    faults()  # the heap grows to hold them (glibc faults part of it in again while it does)
    inside = faults()
print(first, retained, inside)
"""


@glibc_only
def test_a_retained_heap_faults_a_large_block_in_once_not_at_every_allocation():
    """By default each 64 MiB tensor is a fresh mapping (16k page faults each); in ``retained_heap``,
    once the heap has grown to hold them, the same pages serve every next one. (A process of its own:
    the test worker's heap holds other tests' blocks.)"""
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True).stdout
    first, retained, inside = out.split()
    pages = 64 * MIB // resource.getpagesize()
    assert retained == "True"
    assert int(first) > 7 * pages, out
    assert int(inside) < 2 * pages, out
