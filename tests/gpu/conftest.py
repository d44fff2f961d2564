"""GPU tests share one process: a test that sets a process-wide CUDA setting (the learner engine sets
``torch.backends.cuda.matmul.fp32_precision`` from ``learner.fp32_matmul``) must not change the
precision of the tests after it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_fp32_matmul():
    previous = torch.backends.cuda.matmul.fp32_precision
    yield
    torch.backends.cuda.matmul.fp32_precision = previous
