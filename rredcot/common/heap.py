"""The C heap's trade between RSS and page faults (glibc's ``malloc_trim`` and ``mallopt``).

glibc keeps freed memory in its arenas for reuse; after a large transient allocation (a weight
update reads a ~270 MiB file into bytes and unpacks it into tensors) the pages stay in the process's
RSS, spread over the arenas of its threads. ``trim_heap`` releases them.

The other way round: glibc serves blocks above its mmap threshold with their own mappings and hands
them back on free, so a loop that allocates the same large tensors every step (logits over a 151k
vocabulary) faults every page in again, every step. ``retained_heap`` keeps such blocks in the heap
for the length of a loop: the tiny model's SFT runs 1.75x faster, its system time 20x lower
(docs/benchmarks.md). Where the C library is not glibc (macOS, musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
RETAINED_THRESHOLD = 2**30  # blocks up to 1 GiB come from the heap, and the heap is not trimmed
# After: where glibc's own dynamic thresholds end once large blocks have been freed (a mmap threshold
# of at most 32 MiB on 64-bit, trimming at twice it). Setting a threshold ends glibc's adjustment for
# the process: its start (128 KiB) would map and unmap every block above 128 KiB from then on.
AFTER_MMAP_THRESHOLD, AFTER_TRIM_THRESHOLD = 32 * 2**20, 64 * 2**20


def _libc_function(name: str) -> Callable[[int], int] | Callable[[int, int], int] | None:
    libc = ctypes.util.find_library("c")
    return None if libc is None else getattr(ctypes.CDLL(libc), name, None)


_TRIM = _libc_function("malloc_trim")
_MALLOPT = _libc_function("mallopt")


def trim_heap() -> bool:
    """Release the free pages of every malloc arena; True if the C library could (glibc)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


@contextmanager
def retained_heap() -> Iterator[bool]:
    """Inside, freed blocks up to 1 GiB stay in the heap for the next allocation; after, the heap is
    trimmed and blocks above 32 MiB are mapped again. Yields True where the C library could."""
    if _MALLOPT is None:
        yield False
        return
    _MALLOPT(M_MMAP_THRESHOLD, RETAINED_THRESHOLD)
    _MALLOPT(M_TRIM_THRESHOLD, RETAINED_THRESHOLD)
    try:
        yield True
    finally:
        _MALLOPT(M_MMAP_THRESHOLD, AFTER_MMAP_THRESHOLD)
        _MALLOPT(M_TRIM_THRESHOLD, AFTER_TRIM_THRESHOLD)
        trim_heap()
