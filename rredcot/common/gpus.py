"""The GPUs this process can use, counted without importing torch where there can be none.

torch's import is a second of CPU in every process that asks (the driver, ``rredcot doctor``); a
machine without an NVIDIA or ROCm driver has no device node of one, and torch would count 0 there.
"""

from __future__ import annotations

from pathlib import Path

# what a GPU driver puts on a machine (and a container given its GPUs): NVIDIA's control device and
# /proc entry, ROCm's kernel fusion driver
DRIVER_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd")


def gpu_driver_present() -> bool:
    """Whether this machine has a GPU driver's device node (else torch finds no GPU)."""
    return any(Path(p).exists() for p in DRIVER_NODES)


def local_gpus() -> int:
    """torch's count of the GPUs this process can use: 0 without importing torch where no GPU driver is."""
    if not gpu_driver_present():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
