"""What a worker decides on its own GPU node (``launch.stages.node_env``): DeepSpeed's accelerator
follows the GPU Ray gave the process, whatever the driver's node has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

WORKER = """
import os
from rredcot.common.config import load_config
from rredcot.launch.stages import node_env, stage_env
cfg = load_config("tests", ["cluster.gpus_per_learner=1"])
os.environ.update(stage_env(cfg, "learner", 0, ("127.0.0.1", "ab12")) | node_env())
from deepspeed.accelerator import get_accelerator
print(get_accelerator().device_name())
"""


def test_a_learner_worker_on_a_gpu_node_gets_deepspeeds_cuda_accelerator():
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}  # as on a fresh node
    out = subprocess.run(
        [sys.executable, "-c", WORKER], cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.split()[-1:] == ["cuda"], (out.stdout + out.stderr)[-4000:]
