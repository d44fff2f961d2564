import platform

import psutil
import pytest

from rredcot.common.heap import trim_heap

MIB = 2**20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
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
