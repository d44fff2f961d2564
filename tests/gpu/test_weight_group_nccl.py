"""The collective weight transport on its GPU backend: NCCL between two processes on two GPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("weight_group_worker.py")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL allows one rank per GPU); skipped without"
    ),
]


def test_nccl_group_carries_a_version_with_its_digest(redis_server, run_id):
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps({"rank": rank, "redis_url": redis_server.url, "run_id": run_id})],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out[-4000:]
