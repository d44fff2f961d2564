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

RANK = """
import datetime, math
import torch, torch.distributed as dist
from rredcot.common.config import LearnerConfig
from rredcot.learner.engine import LearnerEngine, init_distributed
from tests.learner_samples import random_samples, tiny_lm

device, backend = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=60), wait_for_workers=False)
assert init_distributed(store) == (0, 1) and dist.get_backend() == backend, dist.get_backend()
x = torch.full((4,), 2.0, device=device)
dist.all_reduce(x)
assert x.device.type == device and x.tolist() == [2.0] * 4
engine = LearnerEngine(tiny_lm(0), LearnerConfig(dtype="bfloat16", zero_stage=2, lr=1e-5, micro_token_budget=64))
result = engine.train_step(random_samples(4))
assert result.applied and math.isfinite(result.metrics["loss"]), result.metrics
print("ok", backend, store.port)
"""


def test_nccl_group_on_a_store_rank_0_bound_trains_a_step():
    out = subprocess.run(
        [sys.executable, "-c", RANK], cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "ok nccl" in out.stdout, (out.stdout + out.stderr)[-4000:]
