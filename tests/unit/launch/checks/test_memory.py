"""The memory a plan holds, against hand-computed parts and the demo's measured peak, and the
pre-start check that refuses a machine without room, naming what to change."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.checks import GIB
from rredcot.launch.checks.memory import (
    CGROUP_ROOT,
    ENGINE,
    PROCESS,
    SERVICES,
    cgroup_room,
    check_memory,
    learner_rank_bytes,
    plan_memory,
)
from rredcot.models.shape import Shape, model_shape

SHAPE = Shape(params=1000, vocab=10, hidden=4, layers=2)
SMALL = [
    "model.dtype=float32",
    "learner.dtype=float32",
    "model.max_model_len=16",
    "generation.max_tokens=8",
    "learner.micro_token_budget=16",
    "learner.logprob_chunk=8",
    "generation.kv_cache_bytes=1048576",
    "generation.weight_transport=file",
    "data.eval_size=0",
]
# the demo's peak, its 13 steps, its model built before (docs/benchmarks.md, "The memory a plan holds")
DEMO_PEAK_GIB = 11.62


def test_every_part_by_hand() -> None:
    cfg = load_config("tests", SMALL)
    parts = plan_memory(cfg, SHAPE).parts
    assert parts["generators"] == ENGINE + 1000 * 4 + 2**20
    assert parts["redistributors"] == PROCESS + 1000 * 4
    # weights, master/gradient/moments, 16 tokens · 4 hidden · 2 layers · 68 bytes, 8 logits of 10 and gradients
    assert parts["learner"] == PROCESS + 1000 * 4 + 1000 * 16 + 16 * 4 * 2 * 68 + 2 * 8 * 10 * 4
    assert parts["weight versions"] == 0 and parts["services"] == SERVICES and "evaluator" not in parts
    with_eval = plan_memory(load_config("tests", [*SMALL, "data.eval_size=4"]), SHAPE).parts
    assert with_eval["evaluator"] == ENGINE + 1000 * 4 + 2**20


def test_what_shrinks_the_learner() -> None:
    plain = learner_rank_bytes(load_config("tests", SMALL), SHAPE)
    checkpointed = learner_rank_bytes(load_config("tests", [*SMALL, "learner.grad_checkpointing=true"]), SHAPE)
    # each layer's input (4 bytes) and one layer's whole (68) instead of every layer's 68
    assert plain - checkpointed == 16 * 4 * (2 * 68 - (2 * 4 + 68))
    two = learner_rank_bytes(load_config("tests", [*SMALL, "cluster.learner_ranks=2"]), SHAPE)
    assert plain - two == 1000 * 16 // 2  # ZeRO splits the state
    on_gpu = learner_rank_bytes(load_config("tests", [*SMALL, "cluster.gpus_per_learner=1"]), SHAPE)
    assert on_gpu == PROCESS


def test_the_demo_is_counted_at_or_above_its_measured_peak() -> None:
    """Below it, a machine could pass the check and then run out; far above, it refuses machines the
    demo fits."""
    cfg = load_config("demo_cpu")
    total = plan_memory(cfg, model_shape(cfg.model.path)).total / GIB
    assert DEMO_PEAK_GIB <= total <= 1.25 * DEMO_PEAK_GIB


def test_too_little_memory_is_an_error_naming_the_setting_of_the_largest_part() -> None:
    cfg = load_config("demo_cpu")
    enough = check_memory(cfg, 16 * GIB, 16 * GIB)
    assert enough.level == "ok" and "learner 6.5" in enough.found
    short = check_memory(cfg, 8 * GIB, 8 * GIB)
    assert short.level == "error" and "8.0 of 8.0 GiB available; the run needs about 12.5 GiB (learner" in short.found
    assert short.fix.startswith("set learner.micro_token_budget")
    kv = load_config("demo_cpu", ["logging.eval_kv_cache_bytes=17179869184"])  # a 16 GiB cache
    assert check_memory(kv, 8 * GIB, 8 * GIB).fix.startswith("set logging.eval_kv_cache_bytes lower")


@pytest.mark.parametrize(
    ("overrides", "need_gib"),
    [
        (["cluster.address=10.0.0.1:6379"], SERVICES / GIB),  # the workers are on the cluster's nodes
        (["model.path=Qwen/Qwen2.5-7B"], 4.0),  # a hub id's size is unknown: the floor
    ],
    ids=["cluster", "hub-id"],
)
def test_without_a_plan_to_count_the_check_asks_a_floor(overrides: list[str], need_gib: float) -> None:
    cfg = load_config("demo_cpu", overrides)
    assert check_memory(cfg, int(need_gib * GIB), 32 * GIB).level == "ok"
    short = check_memory(cfg, int(need_gib * GIB) - 1, 32 * GIB)
    assert short.level == "error" and short.fix == "stop other processes or use a machine with more memory"


def write_group(folder, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_the_tightest_cgroup_limit_over_the_process_and_its_parents(tmp_path) -> None:
    """A container's limit is its cgroup's (/proc/meminfo shows the host's): in cgroup v2 the parent
    ``a`` limits to 8 GiB; the child holds 3 GiB of which 1 GiB is page cache the kernel can take back."""
    v2 = tmp_path / "v2"
    write_group(v2 / "a", {"memory.max": f"{8 * GIB}\n", "memory.current": f"{2 * GIB}", "memory.stat": "anon 1\n"})
    child = {"memory.max": "max\n", "memory.current": f"{3 * GIB}", "memory.stat": f"anon 5\ninactive_file {GIB}\n"}
    write_group(v2 / "a" / "b", child)
    assert cgroup_room(v2, "0::/a/b\n") == (8 * GIB, 6 * GIB)  # the parent's room: 8 − 2
    write_group(v2 / "a" / "b", {"memory.max": f"{4 * GIB}\n"})
    assert cgroup_room(v2, "0::/a/b\n") == (4 * GIB, 2 * GIB)  # the child's: 4 − 3 + 1
    v1 = tmp_path / "v1"  # v1 writes "no limit" as about 2^63; its cache key is total_inactive_file
    write_group(
        v1 / "memory",
        {"memory.limit_in_bytes": "9223372036854771712\n", "memory.usage_in_bytes": "1", "memory.stat": ""},
    )
    write_group(v1 / "memory" / "job", {"memory.limit_in_bytes": f"{8 * GIB}", "memory.usage_in_bytes": f"{GIB}",
                                        "memory.stat": f"total_inactive_file {GIB // 2}\n"})  # fmt: skip
    assert cgroup_room(v1, "5:cpu:/\n4:memory:/job\n0::/\n") == (8 * GIB, 7 * GIB + GIB // 2)
    assert cgroup_room(v1, "4:memory:/\n") is None  # the root: no limit
    assert cgroup_room(tmp_path / "none", "0::/\n") is None  # nothing mounted
    assert cgroup_room(v1, "garbled\n\n") is None


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup folder, where a child group can be made (v1, or v2 with the
    memory controller); None elsewhere."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = CGROUP_ROOT / "memory" / path.lstrip("/")
        elif not controllers and "memory" in (CGROUP_ROOT / path.lstrip("/") / "cgroup.subtree_control").read_text():
            folder = CGROUP_ROOT / path.lstrip("/")
        else:
            continue
        if os.access(folder, os.W_OK):
            return folder
    return None


@pytest.fixture
def cgroup_of_8_gib(request) -> Iterator[Path]:
    """A child memory cgroup limited to 8 GiB, removed after the test (root only)."""
    parent = own_memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup this process may write (the test makes a child group of 8 GiB)")
    group = parent / f"rredcot-test-{os.getpid()}"
    group.mkdir()
    limit = "memory.limit_in_bytes" if (group / "memory.limit_in_bytes").exists() else "memory.max"
    (group / limit).write_text(str(8 * GIB))
    yield group
    group.rmdir()


def test_the_demo_in_a_container_of_8_gib_says_what_to_change_before_anything_starts(cgroup_of_8_gib, tmp_path):
    """``rredcot train demo_cpu`` inside a cgroup of 8 GiB on a bigger machine: one line, exit 2, before
    anything starts (no run folder). The check used to read /proc/meminfo alone, the host's memory."""
    run_dir = tmp_path / "demo"
    procs = cgroup_of_8_gib / "cgroup.procs"
    command = f"echo $$ > {procs} && exec {Path(sys.executable).parent / 'rredcot'} train demo_cpu run.dir={run_dir}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("rredcot:")]
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert (
        lines[0].startswith("rredcot: cannot start: memory: ")
        and "of 8.0 GiB available; the run needs about" in lines[0]
    )
    assert "-> set learner.micro_token_budget" in lines[0]
    assert not run_dir.exists()
