"""DeepSpeed training engine: one optimizer step per global batch of σ-weighted samples.

Each rank trains its share of the global batch in token-budget micro-batches (gradient
accumulation with ``managed_gradient_accumulation: false``: every ``backward`` accumulates and
``step`` is the boundary). Ranks run the same number of micro-batches (the short ones add
zero-gradient dummy passes) so that ZeRO-2/3 collectives line up. Loss denominators (samples or
tokens) are global, so the result does not depend on the number of ranks or micro-batches.

Guards: a non-finite loss anywhere skips the whole step (no weight or optimizer-state change,
counted in ``skipped_nonfinite``); a batch with no learning signal (all advantages zero and no
KL) makes no optimizer step (counted in ``skipped_empty``).
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
import types
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from rredcot.common.config import LearnerConfig
from rredcot.common.onednn import bound_primitive_cache
from rredcot.common.precision import resolve_dtype
from rredcot.learner.logprobs import TokenLogProbs, model_inputs
from rredcot.learner.loss import LossSettings, Stats, policy_loss, sample_coefficients
from rredcot.learner.packing import BudgetError, MicroBatch, TrainSample, micro_batches
from rredcot.models.store import load_causal_lm

MUON_MODULES = ("deepspeed.runtime.zero.muon.muon_optimizer", "deepspeed.runtime.zero.muon.original_muon")
SHM_OP = "deepspeed_shm_comm"  # DeepSpeed's shared-memory collective op for CPUs


def _without_shm_op() -> None:
    """DeepSpeed's CPU backend JIT-builds a shared-memory op at its first init (20-45 s and a C++
    compiler on each machine, under a lock a killed build leaves behind) and loads it in every process.
    It serves only DeepSpeed's ``inference_all_reduce`` (tensor-parallel inference), which the learner
    never calls: its collectives are torch.distributed's (gloo on CPU). Marked incompatible in
    DeepSpeed's own table of ops, it is never built or loaded."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_OP] = False


def _muon_stand_ins() -> None:
    """DeepSpeed imports its Muon optimizer only to ask whether the optimizer it was given is one (in
    ZeRO's optimizer check, ZeRO-3's and BF16's set-up, every ZeRO-1/2 gradient reduction) and Muon's
    update function wherever ZeRO-1/2 copies gradients, to call it on parameters marked for Muon. Those
    imports wrap Muon's kernels in ``torch.compile``: 1-2 s of CPU at every learner start. The learner's
    optimizer is torch's AdamW and marks no parameter, so both modules are stand-ins: a
    ``MuonWithAuxAdam`` no optimizer is an instance of, and update functions that say so if ever
    called. Where a real one was imported before, both stay real."""
    if any(name in sys.modules for name in MUON_MODULES):
        return

    def not_ours(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "DeepSpeed's Muon is not the learner's optimizer (rredcot/learner/engine.py stands in for it)"
        )

    for name in MUON_MODULES:
        stand_in = types.ModuleType(name, "rredcot's stand-in for DeepSpeed's Muon (the learner's optimizer is AdamW)")
        stand_in.MuonWithAuxAdam = type("MuonWithAuxAdam", (), {})  # type: ignore[attr-defined]
        stand_in.muon_update = stand_in.adam_update = not_ours  # type: ignore[attr-defined]
        sys.modules[name] = stand_in


def init_distributed(store: dist.Store | None = None) -> tuple[int, int]:
    """Initialise torch.distributed (gloo on CPU, nccl on GPU); returns (rank, world).

    With ``store`` (``learner.rendezvous``) the group forms on it; a single rank forms it on an
    in-process store; otherwise DeepSpeed forms it from ``env://`` (``MASTER_ADDR``/``MASTER_PORT``
    set by the launcher, e.g. torchrun).
    """
    import deepspeed

    gpu = torch.cuda.is_available()
    if not gpu:  # (on a GPU, DeepSpeed has no such op to build)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        _without_shm_op()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    if store is None and os.environ["WORLD_SIZE"] == "1":
        store = dist.HashStore()  # one rank: an in-process store, no socket (env:// would listen on every interface)
    if gpu:  # the rank's GPU, before anything picks one (NCCL, ZeRO-3's loading, comm_device)
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    from deepspeed.utils import groups

    cached = groups._WORLD_GROUP
    if not dist.is_initialized() or (cached is not None and cached not in dist.distributed_c10d._world.pg_map):
        # Another library in this process (vLLM tears down its world group on shutdown, and makes a
        # new one for its next engine) may have replaced the group DeepSpeed cached: drop it.
        groups._release_process_group_references()
    backend = "nccl" if gpu else "gloo"
    if not dist.is_initialized() and store is not None:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=backend)
    return dist.get_rank(), dist.get_world_size()


def load_policy(path: str, cfg: LearnerConfig) -> torch.nn.Module:
    """The model to train from ``path``, in the learner's dtype. Under ZeRO-3 it is loaded straight
    into its partitions (transformers runs ``zero.Init`` while an ``HfDeepSpeedConfig`` is alive), so
    no rank holds the whole model in host memory."""
    from transformers.integrations import HfDeepSpeedConfig

    init_distributed()
    hf_ds = HfDeepSpeedConfig(ds_config(cfg)) if cfg.zero_stage == 3 else None
    try:
        return load_causal_lm(path, cfg.dtype)
    finally:
        del hf_ds  # transformers holds it by weak reference: ZeRO-3 loading ends here


def ds_config(cfg: LearnerConfig) -> dict:
    """The DeepSpeed config of ``cfg``. Under bf16 with ZeRO 1–3, gradients accumulate over the
    micro-batches in float32 (``grad_accum_dtype``): a 25k-token step sums ~40 micro-batches, and
    bf16's 8-bit mantissa would drop the small ones (DeepSpeed has no such mix for stage 0).
    ``overlap_comm`` is used on GPUs only."""
    zero: dict = {"stage": cfg.zero_stage, "overlap_comm": cfg.overlap_comm and torch.cuda.is_available()}
    if cfg.zero_stage == 3:
        zero |= {
            "stage3_param_persistence_threshold": cfg.zero3_persistence_threshold,
            "stage3_gather_16bit_weights_on_model_save": False,
        }
    if cfg.offload and torch.cuda.is_available() and cfg.zero_stage >= 2:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    bf16 = resolve_dtype(cfg.dtype).dtype == "bfloat16"
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": bf16},
        "steps_per_print": 2**62,
    } | ({"data_types": {"grad_accum_dtype": "fp32"}} if bf16 and cfg.zero_stage >= 1 else {})


def lr_factor(step: int, cfg: LearnerConfig, total_steps: int) -> float:
    """Learning-rate multiplier for optimizer step ``step`` (0-based): a linear warm-up over
    ``lr_warmup_steps`` steps, then constant or a cosine decay to ``lr_min_ratio`` at ``total_steps``."""
    if step < cfg.lr_warmup_steps:
        return (step + 1) / cfg.lr_warmup_steps
    if cfg.lr_schedule == "constant" or total_steps <= cfg.lr_warmup_steps:
        return 1.0
    progress = min(1.0, (step - cfg.lr_warmup_steps) / (total_steps - cfg.lr_warmup_steps))
    return cfg.lr_min_ratio + (1 - cfg.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class Pending:
    """A global batch whose gradients are accumulated but not yet applied."""

    t0: float
    samples: int  # global
    tokens: int  # global input tokens
    micro_batches: int  # per rank
    stats: Stats = field(default_factory=Stats)
    bad: bool = False  # a non-finite loss was seen on some rank


@dataclass
class StepResult:
    applied: bool
    metrics: dict[str, float] = field(default_factory=dict)


class LearnerEngine:
    """A DeepSpeed-wrapped causal LM trained with the σ-weighted policy loss."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: LearnerConfig,
        version: int = 0,
        temperature: float = 1.0,
        total_steps: int = 0,
    ) -> None:
        """``temperature``: the generators' sampling temperature (behaviour log-probs are taken after it);
        ``total_steps``: the run's steps (the end of a cosine learning-rate schedule)."""
        import deepspeed

        bound_primitive_cache()  # a CPU's bf16 matmuls are oneDNN primitives, one per sequence length
        self.cfg = cfg
        self.settings = LossSettings.from_config(cfg)
        self.rank, self.world = init_distributed()
        self.comm_device = comm_device()
        # the float32 LM head is ~44% of a 25k-token step in IEEE float32 on an H100, ~17% in TF32
        torch.backends.cuda.matmul.fp32_precision = cfg.fp32_matmul
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = TokenLogProbs(
                copy.deepcopy(model).eval().requires_grad_(False), cfg.logprob_chunk, temperature
            )
        if cfg.grad_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        # stepped by DeepSpeed on applied steps only (a skipped step leaves it), saved in checkpoints
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg, total_steps))
        _muon_stand_ins()
        self.engine, *_ = deepspeed.initialize(
            model=TokenLogProbs(model, cfg.logprob_chunk, temperature),
            optimizer=optimizer,
            lr_scheduler=schedule,
            config=ds_config(cfg),
        )
        if self.ref_model is not None:
            self.ref_model.to(self.engine.device)
        self.version = version
        self.counters = {"steps": 0, "skipped_nonfinite": 0, "skipped_empty": 0, "samples": 0, "tokens": 0}

    @property
    def module(self) -> torch.nn.Module:
        """The Hugging Face model being trained (parameters partitioned under ZeRO-3)."""
        return self.engine.module.lm

    def train_step(self, samples: list[TrainSample]) -> StepResult:
        """One optimizer step on this rank's share of a global batch (every rank must call it)."""
        return self.apply(self.accumulate(samples))

    def accumulate(self, samples: list[TrainSample]) -> Pending:
        """Forward and backward over all micro-batches; gradients are ready, no step taken yet."""
        t0 = time.perf_counter()
        # the loss is normalised by the whole batch: skipping A = 0 samples (whose loss is 0) must not
        # raise the effective learning rate by the informative share
        batch_samples, batch_tokens = len(samples), sum(len(s.completion_ids) for s in samples)
        if self.cfg.skip_zero_advantage and self.ref_model is None:
            samples = [s for s in samples if s.advantage != 0.0]
        error: BudgetError | None = None
        try:
            mbs = micro_batches(samples, self.cfg.micro_token_budget, self.cfg.packing)
        except BudgetError as e:  # raised on every rank below, so no rank waits in a collective
            mbs, error = [], e
        n_samples, n_batch, n_tokens, n_mb, tokens, failed = self.all_reduce(
            [
                len(samples),
                batch_samples,
                batch_tokens,
                len(mbs),
                sum(m.n_tokens for m in mbs),
                float(error is not None),
            ],
            ["sum", "sum", "sum", "max", "sum", "max"],
        )
        if failed:
            raise error or BudgetError(
                f"a sample on another rank is longer than learner.micro_token_budget={self.cfg.micro_token_budget}"
            )
        pending = Pending(t0, int(n_samples), int(tokens), int(n_mb))
        if n_samples == 0:
            return pending
        denom = n_batch if self.settings.loss_agg == "sample" else n_tokens
        # the i-th micro-batch calls the LM head equally often on every rank (ZeRO-3 gathers per call)
        head = self.engine.module.head_calls
        calls = [
            int(c)
            for c in self.all_reduce(
                [head(len(m.targets)) for m in mbs] + [1] * (int(n_mb) - len(mbs)), ["max"] * int(n_mb)
            )
        ]
        for i in range(pending.micro_batches):
            last = i == pending.micro_batches - 1
            if not pending.bad:  # every rank runs one forward, then they agree on finiteness
                if i < len(mbs):
                    loss = self._micro_loss(mbs[i], denom, pending.stats, calls[i])
                else:
                    loss = self._dummy_loss(n_chunks=calls[i])
                pending.bad = self.all_reduce([0.0 if loss.isfinite() else 1.0], ["max"])[0] > 0
            if pending.bad:  # drop this micro-batch; the last one poisons the gradient so the step is skipped
                loss = self._dummy_loss(poison=last, n_chunks=calls[i])
            self.engine.set_gradient_accumulation_boundary(last)
            self.engine.backward(loss * self.world, scale_wrt_gas=False)
            if not last:
                self.engine.step()  # not a boundary: counts the micro-step only
        return pending

    def apply(self, pending: Pending) -> StepResult:
        """The optimizer step for ``pending`` (or its skip); every rank must call it."""
        if pending.samples == 0:
            self.counters["skipped_empty"] += 1
            return StepResult(False, {"skipped_empty": 1.0})
        metrics = self._reduce_stats(pending.stats).result()
        if pending.bad or self._grads_nonfinite():
            self._skip_step()
            return StepResult(False, {"skipped_nonfinite": 1.0, **metrics})
        skipped_before, lr = self.engine.skipped_steps, float(self.engine.get_lr()[0])
        self.engine.step()
        if self.engine.skipped_steps != skipped_before:  # DeepSpeed found a non-finite gradient
            self.counters["skipped_nonfinite"] += 1
            return StepResult(False, {"skipped_nonfinite": 1.0, **metrics})
        self.version += 1
        self.counters["steps"] += 1
        self.counters["samples"] += pending.samples
        self.counters["tokens"] += pending.tokens
        elapsed = time.perf_counter() - pending.t0
        metrics |= {
            "grad_norm": float(self.engine.get_global_grad_norm() or 0.0),
            "step_time_s": elapsed,
            "tokens_per_s": pending.tokens / elapsed,
            "micro_batches": pending.micro_batches,
            "lr": lr,  # the one this step used
            "version": self.version,
        }
        return StepResult(True, metrics)

    def _micro_loss(self, mb: MicroBatch, denom: float, stats: Stats, n_chunks: int) -> torch.Tensor:
        mb = mb.to(self.engine.device)
        logp = self.engine(**model_inputs(mb), n_chunks=n_chunks)
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self.ref_model(**model_inputs(mb))
        coef = sample_coefficients(mb, self.settings.loss_agg, denom)
        loss, mb_stats = policy_loss(logp, mb, self.version, coef, self.settings, ref)
        stats.add(mb_stats.sums, mb_stats.maxes)
        return loss

    def _dummy_loss(self, poison: bool = False, n_chunks: int = 1) -> torch.Tensor:
        """A full forward with zero gradient (NaN gradient when ``poison``), keeping collectives aligned."""
        zero = torch.zeros((1, 1), dtype=torch.long, device=self.engine.device)
        logp = self.engine(
            input_ids=zero,
            position_ids=zero,
            attention_mask=None,
            token_index=zero[0],
            targets=zero[0],
            n_chunks=n_chunks,
        )
        return logp.sum() * (float("nan") if poison else 0.0)

    def _grads_nonfinite(self) -> bool:
        """Stage 0 only (ZeRO optimizers check their gradients themselves)."""
        if self.cfg.zero_stage != 0:
            return False
        bad = any(p.grad is not None and not bool(p.grad.isfinite().all()) for p in self.module.parameters())
        return self.all_reduce([float(bad)], ["max"])[0] > 0

    def _skip_step(self) -> None:
        """Drop this step: ZeRO sees the NaN gradient and skips; stage 0 drops the gradients itself."""
        self.counters["skipped_nonfinite"] += 1
        if self.cfg.zero_stage == 0:
            self.engine.optimizer.zero_grad(set_to_none=True)
            return
        before = self.engine.skipped_steps
        self.engine.step()
        if self.engine.skipped_steps != before + 1:
            raise RuntimeError("DeepSpeed applied a step with a non-finite gradient")

    def all_reduce(self, values: list[float], ops: list[str]) -> list[float]:
        """All-reduce a few scalars with per-value op ('sum' or 'max') across the ranks."""
        if self.world == 1:
            return [float(v) for v in values]
        return all_reduce_scalars(values, ops, self.comm_device)

    def all_gather(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        return [data] if self.world == 1 else all_gather_bytes(data, self.comm_device)

    def _reduce_stats(self, stats: Stats) -> Stats:
        if self.world > 1:
            reduce_stats(stats, self.comm_device)
        return stats


def comm_device() -> torch.device:
    """Where tensors of the default process group's collectives live: the rank's GPU under NCCL
    (it reduces only device tensors), the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_scalars(values: list[float], ops: list[str], device: torch.device) -> list[float]:
    """``values`` all-reduced over the default group, each with its op ('sum' or 'max'); tensors on ``device``."""
    out = []
    for op in ("sum", "max"):
        t = torch.tensor([v for v, o in zip(values, ops, strict=True) if o == op], dtype=torch.float64, device=device)
        if len(t):
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        out.append(iter(t.tolist()))
    return [next(out[0] if o == "sum" else out[1]) for o in ops]


def all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Every rank's ``data`` over the default group, in rank order (byte tensors on ``device``; no pickle)."""
    size = torch.tensor([len(data)], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    lengths = [int(n) for n in sizes]
    buffer = torch.zeros(max(1, *lengths), dtype=torch.uint8, device="cpu")
    buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else buffer[:0]
    buffer = buffer.to(device)
    out = [torch.empty_like(buffer) for _ in lengths]
    dist.all_gather(out, buffer)
    return [bytes(t[:n].cpu().numpy()) for t, n in zip(out, lengths, strict=True)]


def reduce_stats(stats: Stats, device: torch.device) -> None:
    """Sum the statistics' sums and take the maximum of their maxima over the default group, in place."""
    sums, maxes = stats.as_tensors(device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    stats.load_tensors(sums, maxes)
