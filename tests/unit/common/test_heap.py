import platform
import resource

import psutil
import pytest
import torch

from rredcot.common.heap import retained_heap, trim_heap

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


def _page_faults_of_eight_64_mib_tensors() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):
        torch.ones(16 * MIB)  # 64 MiB of float32, every page written, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@glibc_only
def test_a_retained_heap_faults_a_large_block_in_once_not_at_every_allocation():
    """By default each 64 MiB tensor is a fresh mapping (16k page faults each); in ``retained_heap``
    the first one's pages serve the next seven; after it, the defaults are back."""
    pages = 64 * MIB // resource.getpagesize()
    assert _page_faults_of_eight_64_mib_tensors() > 7 * pages
    with retained_heap() as retained:
        assert retained
        inside = _page_faults_of_eight_64_mib_tensors()
    assert inside < 2 * pages, inside
    assert _page_faults_of_eight_64_mib_tensors() > 7 * pages
