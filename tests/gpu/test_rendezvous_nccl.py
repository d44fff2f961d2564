"""The learner group as ``rredcot train`` forms it on a GPU: NCCL on a store whose port rank 0
bound itself (``learner.rendezvous``), then a DeepSpeed step on that group. One rank, in a fresh
process: NCCL takes one rank per GPU, and this pytest process already has a group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_nccl_group_on_a_store_rank_0_bound_trains_a_step():
    out = subprocess.run(
        [sys.executable, "-m", "tests.gpu.rendezvous_rank"],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "ok nccl" in out.stdout, (out.stdout + out.stderr)[-4000:]
