"""Hand the C heap's free pages back to the OS (glibc's ``malloc_trim``).

glibc keeps freed memory in its arenas for reuse; after a large transient allocation (a weight
update reads a ~270 MiB file into bytes and unpacks it into tensors) the pages stay in the process's
RSS, spread over the arenas of its threads. ``trim_heap`` releases them; where the C library is not
glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    return getattr(ctypes.CDLL(name), "malloc_trim", None)


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Release the free pages of every malloc arena; True if the C library could (glibc)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
