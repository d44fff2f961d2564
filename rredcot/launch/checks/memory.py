"""The memory a run's plan holds on this machine, estimated before anything starts, and the
pre-start check that compares it with what is available (``check_memory``).

Each process of the plan is counted from the model's shape (``models.shape``) and the config:
- a tier's worker: Python with torch and its libraries (``PROCESS``), a vLLM engine's more
  (``ENGINE``);
- a generator, and the evaluator when there are held-out evaluations: the weights in
  ``model.dtype`` and the engine's KV cache (``generation.kv_cache_bytes``,
  ``logging.eval_kv_cache_bytes``);
- a redistributor: the scorer's weights;
- a learner rank: the weights in ``learner.dtype``; a float32 master copy, gradient and Adam's two
  moments (16 bytes a parameter, split across ranks by ZeRO); what the backward pass keeps of a
  micro-batch of ``learner.micro_token_budget`` tokens (``ACTIVATION_BYTES`` per token, layer and
  hidden unit at 16 bits, twice that in float32; with gradient checkpointing each layer's input and
  one layer's whole); the LM head's float32 logits and their gradient for ``learner.logprob_chunk``
  tokens;
- the weight versions the transport keeps in ``/dev/shm``, and the driver, Ray's daemons and the
  embedded Redis (``SERVICES``).
A tier on GPUs keeps only its process here (and, with ``learner.offload``, the optimizer's state).
The constants were measured on the CPU demo and the tests config (docs/benchmarks.md, "The memory
a plan holds"); the estimate errs high, as the micro-batch is taken at its budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rredcot.common.config import Config
from rredcot.common.precision import planned_dtype
from rredcot.launch.checks import GIB, Check
from rredcot.models.shape import Shape, model_shape
from rredcot.transports import deployment

PROCESS = int(0.5 * GIB)  # a worker's Python, torch and libraries, before its model
ENGINE = 1 * GIB  # a vLLM engine's process before its weights and KV cache
SERVICES = 1 * GIB  # the driver, Ray's daemons and the embedded Redis
OPTIMIZER_BYTES = 16  # a learner's float32 master weight, gradient and Adam's two moments, per parameter
ACTIVATION_BYTES = 34  # what backward keeps per token, layer and hidden unit at 16 bits (Korthikanti et al.)
CGROUP_ROOT = Path("/sys/fs/cgroup")
# where each cgroup version keeps a group's memory limit, usage and reclaimable page cache
CGROUP_FILES = {
    "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
    "v2": ("", "memory.max", "memory.current", "inactive_file"),
}
UNKNOWN_FLOOR = 4 * GIB  # what a run needs at least when the model's shape is unknown here (a hub id)

# the setting that shrinks each part, for the check's fix
LEVERS = {
    "learner": "learner.micro_token_budget or learner.logprob_chunk lower, or learner.grad_checkpointing=true",
    "evaluator": "logging.eval_kv_cache_bytes lower, or data.eval_size=0",
    "generators": "generation.kv_cache_bytes lower, or fewer cluster.generators",
    "redistributors": "fewer cluster.redistributors",
    "weight versions": "generation.weight_transport=file",
}


@dataclass(frozen=True)
class MemoryPlan:
    parts: dict[str, int]  # bytes, by part of the plan

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """``about 12.1 GiB (learner 6.5, evaluator 2.1, …)``, the largest part first."""
        parts = sorted(self.parts.items(), key=lambda kv: -kv[1])
        return f"about {self.total / GIB:.1f} GiB (" + ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts if v) + ")"


def dtype_bytes(requested: str, on_gpu: bool) -> int:
    """Bytes per weight in the dtype a tier will run in (2 where each GPU worker decides)."""
    return 4 if planned_dtype(requested, on_gpu).dtype == "float32" else 2


def learner_rank_bytes(cfg: Config, shape: Shape) -> int:
    """One learner rank's memory on its host (``learner_tokens`` for the micro-batch's size)."""
    le, ranks = cfg.learner, cfg.cluster.learner_ranks
    on_gpu = cfg.cluster.gpus_per_learner > 0
    if on_gpu:  # the model, its state and its activations live on the GPU
        return PROCESS + (12 * shape.params // ranks if le.offload else 0)
    weight = dtype_bytes(le.dtype, on_gpu)
    state = shape.params * OPTIMIZER_BYTES // (ranks if le.zero_stage else 1)
    tokens = learner_tokens(cfg)
    per_unit = ACTIVATION_BYTES * weight // 2  # per token, layer and hidden unit
    if le.grad_checkpointing:  # each layer's input kept, one layer's whole recomputed at a time
        activations = tokens * shape.hidden * (shape.layers * weight + per_unit)
    else:
        activations = tokens * shape.hidden * shape.layers * per_unit
    chunk = min(le.logprob_chunk or tokens, tokens)
    logits = 2 * chunk * shape.vocab * 4  # float32 logits and their gradient
    return PROCESS + shape.params * weight + state + activations + logits


def learner_tokens(cfg: Config) -> int:
    """Tokens of a rank's micro-batch at most: its budget, or a whole step's samples at the model's
    context if fewer."""
    g = cfg.generation
    step = g.prompts_per_step * g.group_size * cfg.model.max_model_len // cfg.cluster.learner_ranks
    return min(cfg.learner.micro_token_budget, step)


def plan_memory(cfg: Config, shape: Shape) -> MemoryPlan:
    """What the plan's processes hold at once on one machine, by part."""
    c = cfg.cluster
    engine_weights = shape.params * dtype_bytes(cfg.model.dtype, c.gpus_per_generator > 0)
    generator = ENGINE + (0 if c.gpus_per_generator else engine_weights + cfg.generation.kv_cache_bytes)
    scorer = 0 if c.gpus_per_redistributor else shape.params * dtype_bytes(cfg.model.dtype, False)
    parts = {
        "services": SERVICES,
        "generators": c.generators * generator,
        "redistributors": c.redistributors * (PROCESS + scorer),
        "learner": c.learner_ranks * learner_rank_bytes(cfg, shape),
        "weight versions": deployment(cfg).shm_versions(cfg) * shape.params * dtype_bytes(cfg.learner.dtype, False),
    }
    if cfg.data.eval_size:
        on_gpu = bool(c.gpus_per_evaluator or c.gpus_per_generator)
        kv = cfg.logging.eval_kv_cache_bytes or cfg.generation.kv_cache_bytes
        parts["evaluator"] = ENGINE + (0 if on_gpu else engine_weights + kv)
    return MemoryPlan(parts)


def cgroup_room(root: Path = CGROUP_ROOT, membership: str | None = None) -> tuple[int, int] | None:
    """(limit, room) of the tightest memory limit over this process's cgroup and its parents, in
    either cgroup version (a container's ``--memory``, which /proc/meminfo does not show): room is the
    limit less the usage, less the page cache the kernel can reclaim. None without a limit.
    ``membership``: /proc/self/cgroup's text."""
    try:
        text = Path("/proc/self/cgroup").read_text() if membership is None else membership
    except OSError:  # not Linux
        return None
    found: list[tuple[int, int]] = []
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        version = "v2" if not controllers else "v1" if "memory" in controllers.split(",") else None
        if version is None:
            continue
        mount, limit_file, usage_file, cache_key = CGROUP_FILES[version]
        group = root / mount / path.lstrip("/")
        for folder in [group, *group.parents]:
            if not folder.is_relative_to(root / mount):
                break
            try:
                limit = (folder / limit_file).read_text().strip()
                usage = int((folder / usage_file).read_text())
                stat = dict(row.split() for row in (folder / "memory.stat").read_text().splitlines())
            except (OSError, ValueError):
                continue
            if limit.isdigit() and int(limit) < 2**60:  # v1 writes "no limit" as about 2^63
                found.append((int(limit), int(limit) - usage + int(stat.get(cache_key, 0))))
    return min(found, key=lambda f: f[1]) if found else None


def available_memory() -> tuple[int, int]:
    """(available, total) bytes for a run started here: the machine's, or its cgroup's if tighter."""
    import psutil

    mem = psutil.virtual_memory()
    limit = cgroup_room()
    if limit is None:
        return mem.available, mem.total
    return min(mem.available, limit[1]), min(mem.total, limit[0])


def check_memory(cfg: Config, available: int, total: int) -> Check:
    """The plan's memory against ``available`` bytes (of ``total``): an error naming the largest
    part's setting when it does not fit. On a Ray cluster the plan is spread over the nodes: only the
    driver's share (``SERVICES``) is asked of this one."""
    plan, shape = None, None if cfg.cluster.address else model_shape(cfg.model.path)
    if cfg.cluster.address:
        need, what = SERVICES, f"{SERVICES / GIB:.1f} GiB here (the driver's; the workers' is on the cluster's nodes)"
    elif shape is None:
        need = UNKNOWN_FLOOR
        what = f"at least {need / GIB:.1f} GiB ({cfg.model.path}'s size is unknown before it is downloaded)"
    else:
        plan = plan_memory(cfg, shape)
        need, what = plan.total, plan.describe()
    found = f"{available / GIB:.1f} of {total / GIB:.1f} GiB available; the run needs {what}"
    if available >= need:
        return Check("ok", "memory", found)
    lever = LEVERS.get(max(plan.parts, key=plan.parts.get)) if plan else None
    instead = "stop other processes or use a machine with more memory"
    return Check("error", "memory", found, f"set {lever}; or {instead}" if lever else instead)
