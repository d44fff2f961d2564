"""dtype ``auto``: bf16 only where the hardware runs it natively; explicit choices pass through."""

from __future__ import annotations

import pytest

from rredcot.common import precision
from rredcot.common.precision import CpuInfo, cpu_native_bf16, parse_cpuinfo, planned_dtype, resolve_dtype

XEON_SAPPHIRE = (
    "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
)
XEON_NO_BF16 = "model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t\t: fpu sse4_2 avx2 avx512f avx512bw\n"
EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx avx2 fma\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("text", "native"),
    [(XEON_SAPPHIRE, True), (XEON_NO_BF16, False), (EPYC_AVX2, False), (GRAVITON3, True)],
)
def test_native_bf16_follows_the_cpu_flags(text: str, native: bool) -> None:
    got, why = cpu_native_bf16(parse_cpuinfo(text))
    assert got is native
    assert ("native bf16" in why) and (("no native" in why) is not native)


def test_parse_cpuinfo_reads_model_and_flags() -> None:
    info = parse_cpuinfo(EPYC_AVX2 + "\nprocessor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2\n")
    assert info.model == "AMD EPYC"
    assert {"avx2", "fma"} <= info.flags  # the first processor's line
    assert info.speed_flags() == ["avx2"]
    assert info.describe() == "AMD EPYC (avx2)"


def test_without_flags_the_choice_comes_from_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = CpuInfo("some cpu", frozenset())
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda: 0.6)
    assert cpu_native_bf16(bare)[0] is True
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda: 4.0)
    native, why = cpu_native_bf16(bare)
    assert native is False and "4.00×" in why


def test_capped_instruction_sets_make_the_choice_come_from_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AVX-512 BF16 CPU whose oneDNN is held to AVX2 (a container's setting, or emulating an
    AVX2-only machine) runs bf16 matmuls ~200× slower than fp32: the flags must not decide."""
    for cap in precision.ISA_CAPS:
        monkeypatch.delenv(cap, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setattr(precision, "bf16_matmul_ratio", lambda: 200.0)
    native, why = cpu_native_bf16(parse_cpuinfo(XEON_SAPPHIRE))
    assert native is False and "ONEDNN_MAX_CPU_ISA=AVX2" in why and "200.00×" in why
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert cpu_native_bf16(parse_cpuinfo(XEON_SAPPHIRE))[0] is True  # uncapped: the flags decide again


def test_bf16_matmul_ratio_measures_something() -> None:
    assert precision.bf16_matmul_ratio(size=32, repeats=1) > 0


def test_auto_on_cpu_follows_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    precision._auto_choice.cache_clear()
    monkeypatch.setattr(precision, "cpu_info", lambda: parse_cpuinfo(EPYC_AVX2))
    assert resolve_dtype("auto", "cpu").dtype == "float32"
    precision._auto_choice.cache_clear()
    monkeypatch.setattr(precision, "cpu_info", lambda: parse_cpuinfo(XEON_SAPPHIRE))
    assert resolve_dtype("auto", "cpu").dtype == "bfloat16"
    precision._auto_choice.cache_clear()


def test_explicit_dtypes_pass_through_and_bad_ones_fail() -> None:
    assert resolve_dtype("bfloat16", "cpu").dtype == "bfloat16"
    assert resolve_dtype("float32", "cuda").reason == "set in the config"
    with pytest.raises(ValueError, match="float16"):
        resolve_dtype("float16")


def test_the_driver_does_not_decide_auto_for_gpu_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU head node used to report its own CPU's choice for GPU workers (float32 on an AVX2 head
    while the H100 workers ran bf16); a GPU head would start CUDA in the driver to decide."""
    precision._auto_choice.cache_clear()
    monkeypatch.setattr(precision, "cpu_info", lambda: parse_cpuinfo(EPYC_AVX2))
    assert planned_dtype("auto", on_gpu=False).dtype == "float32"
    on_gpu = planned_dtype("auto", on_gpu=True)
    assert (on_gpu.dtype, on_gpu.reason) == ("auto", "decided by each GPU worker on its node")
    assert planned_dtype("bfloat16", on_gpu=True).dtype == "bfloat16"
    precision._auto_choice.cache_clear()
