"""Files: written so that readers polling for them never see them half-written, read only when
they are regular files of a bounded size, and digested by name and content."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

# what a path that is not a regular file is, for the message: reading one blocks (a FIFO with no
# writer) or never ends (/dev/zero)
_KINDS = [
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
]


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def unreadable_file(path: str | Path, max_bytes: int) -> str | None:
    """Why ``path`` must not be read whole (None: a regular file of at most ``max_bytes``). Only
    ``stat`` is called, so a FIFO is never opened (that would block until a writer came)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return (e.strerror or str(e)).lower()
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "something else")
        return f"is {kind}, not a regular file (reading it would block or never end)"
    if st.st_size > max_bytes:
        return f"is {st.st_size:,} bytes, over the bound of {max_bytes:,}"
    return None


def files_digest(files: Iterable[Path], root: Path | None = None, length: int = 12) -> str:
    """The first ``length`` hex digits of a SHA-256 over ``files``' names (relative to ``root``, or
    the bare name) and bytes, in the order given."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(root) if root else f.name}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:length]
