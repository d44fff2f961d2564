"""The C heap's trade between RSS and page faults (glibc's ``malloc_trim`` and ``mallopt``).

glibc keeps freed memory in its arenas for reuse; after a large transient allocation (a weight
update reads a ~270 MiB file into bytes and unpacks it into tensors) the pages stay in the process's
RSS, spread over the arenas of its threads. ``trim_heap`` releases them.

The other way round: glibc serves blocks above its mmap threshold with their own mappings and hands
them back on free, so a loop that allocates the same large tensors every step (logits over a 151k
vocabulary, a float32 copy of the LM head) faults every page in again, every step.
``retain_large_blocks`` keeps such blocks in the heap for the rest of a process (every worker's, from
its start: a 5-step demo held to AVX2 took 226 s instead of 270), ``retained_heap`` for one loop (the
tiny model's SFT: 1.75x faster, its system time 20x lower); docs/benchmarks.md. Where the C library
is not glibc (macOS, musl) they do nothing.
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


_retained = False  # retain_large_blocks has run: the process keeps its large blocks for good


def _thresholds(mmap: int, trim: int) -> None:
    assert _MALLOPT is not None
    _MALLOPT(M_MMAP_THRESHOLD, mmap)
    _MALLOPT(M_TRIM_THRESHOLD, trim)


def retain_large_blocks() -> bool:
    """From now on, for the process's life: blocks up to 1 GiB come from the heap, and the heap is
    not trimmed when they are freed (``trim_heap`` still hands free pages back). What every worker's
    process does first (``launch.stages``): its tier allocates the same large blocks at every step.
    True where the C library could."""
    global _retained
    if _MALLOPT is None:
        return False
    _thresholds(RETAINED_THRESHOLD, RETAINED_THRESHOLD)
    _retained = True
    return True


@contextmanager
def retained_heap() -> Iterator[bool]:
    """``retain_large_blocks`` for a loop: after it, the heap is trimmed and blocks above 32 MiB are
    mapped again, unless the process retained them before. Yields True where the C library could."""
    if _retained or _MALLOPT is None:
        yield _retained
        return
    _thresholds(RETAINED_THRESHOLD, RETAINED_THRESHOLD)
    try:
        yield True
    finally:
        _thresholds(AFTER_MMAP_THRESHOLD, AFTER_TRIM_THRESHOLD)
        trim_heap()
