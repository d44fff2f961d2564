"""The GPUs of this machine, counted without torch where no GPU driver is."""

import subprocess
import sys

import pytest
import torch

from rredcot.common import gpus


def test_without_a_gpu_driver_no_gpu_and_no_torch_import():
    """In a fresh process on a machine without a GPU driver (this one, or one whose driver nodes are
    made absent), torch is never imported to learn there are none."""
    code = (
        "import sys; from rredcot.common import gpus; gpus.DRIVER_NODES = ('/nonexistent/nvidiactl',); "
        "print(gpus.local_gpus(), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_with_a_gpu_driver_torch_counts(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(gpus, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert gpus.local_gpus() == 4
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a driver, but a CPU build of torch
    assert gpus.local_gpus() == 0


def test_the_driver_nodes_agree_with_torch_here():
    """Where torch sees a GPU, a driver node is there (else the count above would miss it)."""
    assert gpus.gpu_driver_present() or not torch.cuda.is_available()
    assert gpus.local_gpus() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
