"""What a worker decides on its own GPU node (``launch.stages.node_env``)."""

from __future__ import annotations

import pytest
import torch

from rredcot.launch.stages import node_env

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_worker_that_sees_a_gpu_leaves_deepspeed_on_it():
    assert node_env() == {}
