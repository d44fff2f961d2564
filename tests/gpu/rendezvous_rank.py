"""One learner rank as ``rredcot train`` forms its group (run by test_rendezvous_nccl.py): NCCL on a
GPU, gloo on a CPU (deploy/gpu/gpu_rehearsal.sh runs it there), on a store whose port rank 0 bound
itself (``learner.rendezvous``), then a DeepSpeed step on that group."""

from __future__ import annotations

import datetime
import math

import torch
import torch.distributed as dist

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
