"""oneDNN's primitive cache, bounded: what torch's bf16 matmuls (the learner's on CPU) hold over many
row counts, at oneDNN's default of 1,024 primitives and at ``PRIMITIVE_CACHE``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rredcot.common.onednn import PRIMITIVE_CACHE, PRIMITIVE_CACHE_ENV, bound_primitive_cache

# a script that calls one matmul at 400 row counts (``call(m)`` after ``setup``) and prints the MiB the
# process still holds once glibc has handed its free pages back (a generator trims after every update)
ROW_COUNTS = """
import ctypes, psutil, torch
torch.set_num_threads(1)
{setup}
def call(m):
    {call}
for m in range(1, 9):
    call(m)
ctypes.CDLL("libc.so.6").malloc_trim(0)
before = psutil.Process().memory_info().rss
for m in range(9, 410):
    call(m)
ctypes.CDLL("libc.so.6").malloc_trim(0)
print((psutil.Process().memory_info().rss - before) / 2**20)
"""


def held_mib(setup: str, call: str, capacity: int) -> float:
    """What ``ROW_COUNTS`` holds (MiB) for this matmul, in a fresh process with oneDNN's cache at ``capacity``."""
    env = os.environ | {PRIMITIVE_CACHE_ENV: str(capacity), "OMP_NUM_THREADS": "1"}
    script = ROW_COUNTS.format(setup=setup, call=call)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.split()[-1])


def test_the_bound_keeps_a_users_setting(monkeypatch):
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    bound_primitive_cache()
    assert os.environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE)
    monkeypatch.setenv(PRIMITIVE_CACHE_ENV, "1024")
    bound_primitive_cache()
    assert os.environ[PRIMITIVE_CACHE_ENV] == "1024"


@pytest.mark.slow  # many bf16 matmul shapes
def test_the_bound_caps_what_torchs_bf16_matmuls_hold():
    """Where torch's bf16 matmuls run on oneDNN (CPUs with AVX-512), each row count leaves primitives
    in the cache; elsewhere they hold nothing at either setting."""
    # one bf16 linear layer (SmolLM2's MLP down-projection shape), forward and backward: a learner meets a
    # new sequence length at nearly every micro-batch
    setup = """w = torch.randn(1536, 576, dtype=torch.bfloat16)
x = torch.randn(410, 576, dtype=torch.bfloat16, requires_grad=True)"""
    call = "torch.nn.functional.linear(x[:m], w).sum().backward()"
    default, capped = held_mib(setup, call, 1024), held_mib(setup, call, PRIMITIVE_CACHE)
    assert capped < 0.5 * default + 16, (capped, default)  # 284 vs 656 MiB on an Intel Xeon with AMX
