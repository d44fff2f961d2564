"""Which floating-point type to compute in: ``auto`` picks bf16 only where it is native.

bf16 halves memory traffic and is the right choice on GPUs with bf16 units and on CPUs with native
bf16 instructions (AVX-512 BF16, AMX). Elsewhere torch emulates it: 4× slower than fp32 on an
AVX-512 CPU without ``avx512_bf16``, ~470× slower on an AVX2-only CPU (a 512×2048 @ 2048×2048
matmul on an AVX2-only AMD EPYC: 14.2 s against 0.030 s in fp32; docs/benchmarks.md). So ``auto``
reads the CPU's flags (or, where the OS does not list them or the environment caps the instruction
sets torch may use, times one small matmul each way) and falls back to fp32. The choice is made
once per process, where the model runs, and says why.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rredcot.common.gpus import local_gpus

if TYPE_CHECKING:
    from rredcot.common.config import Config

DTYPES = ("auto", "float32", "bfloat16")
# x86: AVX-512 BF16 or AMX; aarch64: the ARMv8.6 BF16 extension ("bf16" in Features)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
# flags worth printing beside a measurement (what decides the speed of fp32 and bf16 matmuls)
log = logging.getLogger(__name__)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "bf16", "sve")
# environment variables that cap the instruction sets torch's kernels use below what the flags list
# (oneDNN's matmuls, ATen's vectorised ops, MKL): set, the flags no longer tell what runs natively
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype to use and, in words, why."""

    dtype: str  # "float32" | "bfloat16"; "auto" only from planned_dtype
    reason: str


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]  # empty when the OS does not list them

    def speed_flags(self) -> list[str]:
        return [f for f in SPEED_FLAGS if f in self.flags]

    def describe(self) -> str:
        """``AMD EPYC (avx2)``: the model and the flags that decide matmul speed."""
        return f"{self.model} ({', '.join(self.speed_flags()) or 'no AVX2/AVX-512/AMX flags'})"


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model name and flags from the text of ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``)."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif name in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model or platform.processor() or platform.machine() or "unknown CPU", flags)


@functools.cache
def cpu_info() -> CpuInfo:
    path = Path("/proc/cpuinfo")
    text = path.read_text(errors="replace") if path.exists() else ""
    return parse_cpuinfo(text)


def bf16_matmul_ratio(size: int = 256, repeats: int = 3) -> float:
    """Seconds of a bf16 matmul ÷ seconds of the same fp32 matmul (best of ``repeats``, ~50 ms)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        return min(times)

    return best(a.bfloat16(), b.bfloat16()) / max(best(a, b), 1e-9)


def cpu_native_bf16(info: CpuInfo) -> tuple[bool, str]:
    """Whether this CPU runs bf16 matmuls natively, and the evidence: its flags, or a timed matmul
    where it lists none or the environment caps the instruction sets (``ISA_CAPS``)."""
    caps = [f"{k}={os.environ[k]}" for k in ISA_CAPS if os.environ.get(k)]
    if info.flags and not caps:
        found = [f for f in NATIVE_BF16_FLAGS if f in info.flags]
        if found:
            return True, f"the CPU has native bf16 ({', '.join(found)})"
        return False, f"the CPU has no native bf16 (no {'/'.join(NATIVE_BF16_FLAGS)} flag)"
    ratio = bf16_matmul_ratio()
    verdict = ratio <= 1.0
    why = "the environment caps its instruction sets: " + ", ".join(caps) if caps else "flags not listed by the OS"
    return verdict, f"a bf16 matmul took {ratio:.2f}× the fp32 time on this CPU ({why})"


@functools.cache
def _auto_choice(device: str) -> DtypeChoice:
    """Decided once per process and device, and logged."""
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name()
        native, why = (
            torch.cuda.is_bf16_supported(),
            f"GPU {name} " + ("supports bf16" if torch.cuda.is_bf16_supported() else "has no bf16 support"),
        )
    else:
        native, why = cpu_native_bf16(cpu_info())
    choice = DtypeChoice("bfloat16" if native else "float32", why)
    log.info("dtype auto -> %s on %s: %s", choice.dtype, device, choice.reason)
    return choice


def resolve_dtype(requested: str, device: str | None = None) -> DtypeChoice:
    """``requested`` (``auto`` | ``float32`` | ``bfloat16``) → the dtype to use on ``device``
    (``cuda`` | ``cpu``; default: CUDA when available)."""
    if requested not in DTYPES:
        raise ValueError(f"dtype {requested!r}; expected one of {DTYPES}")
    if requested != "auto":
        return DtypeChoice(requested, "set in the config")
    if device is None:
        device = "cuda" if local_gpus() else "cpu"
    return _auto_choice(device)


def planned_dtype(requested: str, on_gpu: bool) -> DtypeChoice:
    """The dtype a tier will run in, as the driver can tell without touching a GPU: ``auto`` on a
    tier with GPUs is decided by each worker on its node (the driver's node may have other GPUs or
    none), on a tier without for this CPU."""
    if requested == "auto" and on_gpu:
        return DtypeChoice("auto", "decided by each GPU worker on its node")
    return resolve_dtype(requested, "cuda" if on_gpu else "cpu")


def dtype_settings(cfg: Config) -> list[tuple[str, str, bool]]:
    """(key, requested dtype, whether its tier has GPUs): ``model.dtype`` runs where the generators
    run, ``learner.dtype`` where the learner does."""
    c = cfg.cluster
    return [
        ("model.dtype", cfg.model.dtype, c.gpus_per_generator > 0),
        ("learner.dtype", cfg.learner.dtype, c.gpus_per_learner > 0),
    ]
