"""A bound on oneDNN's primitive cache, for processes that run matmuls on a CPU.

oneDNN (in torch's bf16 matmuls, and in vLLM-CPU's matmul op) JIT-compiles one primitive per
(weight shape, rows) and keeps the last 1,024 it made in a process-wide cache, about 0.7 MiB each
with AMX. New batch sizes and sequence lengths keep coming in RL, so a process's RSS crept for hours
until the cache was full (docs/benchmarks.md, "Soak"). 128 holds a stage's working set at the same
speed.
"""

from __future__ import annotations

import os

PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
PRIMITIVE_CACHE = 128


def bound_primitive_cache() -> None:
    """Cap oneDNN's cache at ``PRIMITIVE_CACHE`` primitives unless the user set the variable. oneDNN
    reads it when it makes its first primitive: call this before the process's first matmul."""
    os.environ.setdefault(PRIMITIVE_CACHE_ENV, str(PRIMITIVE_CACHE))
