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
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from rredcot.common.config import LearnerConfig
from rredcot.common.precision import resolve_dtype
from rredcot.learner.logprobs import TokenLogProbs, model_inputs
from rredcot.learner.loss import LossSettings, Stats, policy_loss, sample_coefficients
from rredcot.learner.packing import BudgetError, MicroBatch, TrainSample, micro_batches


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Initialise torch.distributed through DeepSpeed (gloo on CPU, nccl on GPU); returns (rank, world).

    Without a launcher, defaults to a single rank on a free local port.
    """
    import deepspeed

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    from deepspeed.utils import groups

    cached = groups._WORLD_GROUP
    if not dist.is_initialized() or (cached is not None and cached not in dist.distributed_c10d._world.pg_map):
        # Another library in this process (vLLM tears down its world group on shutdown, and makes a
        # new one for its next engine) may have replaced the group DeepSpeed cached: drop it.
        groups._release_process_group_references()
    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def ds_config(cfg: LearnerConfig) -> dict:
    zero: dict = {"stage": cfg.zero_stage, "overlap_comm": False}
    if cfg.zero_stage == 3:
        zero |= {
            "stage3_param_persistence_threshold": cfg.zero3_persistence_threshold,
            "stage3_gather_16bit_weights_on_model_save": False,
        }
    if cfg.offload and torch.cuda.is_available() and cfg.zero_stage >= 2:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": resolve_dtype(cfg.dtype).dtype == "bfloat16"},
        "steps_per_print": 2**62,
    }


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

    def __init__(self, model: torch.nn.Module, cfg: LearnerConfig, version: int = 0, temperature: float = 1.0) -> None:
        """``temperature``: the generators' sampling temperature (behaviour log-probs are taken after it)."""
        import deepspeed

        self.cfg = cfg
        self.settings = LossSettings.from_config(cfg)
        self.rank, self.world = init_distributed()
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
        self.engine, *_ = deepspeed.initialize(
            model=TokenLogProbs(model, cfg.logprob_chunk, temperature), optimizer=optimizer, config=ds_config(cfg)
        )
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
        for i in range(pending.micro_batches):
            last = i == pending.micro_batches - 1
            if not pending.bad:  # every rank runs one forward, then they agree on finiteness
                loss = self._micro_loss(mbs[i], denom, pending.stats) if i < len(mbs) else self._dummy_loss()
                pending.bad = self.all_reduce([0.0 if loss.isfinite() else 1.0], ["max"])[0] > 0
            if pending.bad:  # drop this micro-batch; the last one poisons the gradient so the step is skipped
                loss = self._dummy_loss(poison=last)
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
        skipped_before = self.engine.skipped_steps
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
            "version": self.version,
        }
        return StepResult(True, metrics)

    def _micro_loss(self, mb: MicroBatch, denom: float, stats: Stats) -> torch.Tensor:
        mb = mb.to(self.engine.device)
        logp = self.engine(**model_inputs(mb))
        ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                ref = self.ref_model(**model_inputs(mb))
        coef = sample_coefficients(mb, self.settings.loss_agg, denom)
        loss, mb_stats = policy_loss(logp, mb, self.version, coef, self.settings, ref)
        stats.add(mb_stats.sums, mb_stats.maxes)
        return loss

    def _dummy_loss(self, poison: bool = False) -> torch.Tensor:
        """A full forward with zero gradient (NaN gradient when ``poison``), keeping collectives aligned."""
        zero = torch.zeros((1, 1), dtype=torch.long, device=self.engine.device)
        logp = self.engine(input_ids=zero, position_ids=zero, attention_mask=None, token_index=zero[0], targets=zero[0])
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
        """All-reduce a few scalars with per-value op ('sum' or 'max')."""
        if self.world == 1:
            return [float(v) for v in values]
        out = []
        for op in ("sum", "max"):
            t = torch.tensor([v for v, o in zip(values, ops, strict=True) if o == op], dtype=torch.float64)
            if len(t):
                dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
            out.append(iter(t.tolist()))
        return [next(out[0] if o == "sum" else out[1]) for o in ops]

    def _reduce_stats(self, stats: Stats) -> Stats:
        if self.world > 1:
            sums, maxes = stats.as_tensors()
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
            stats.load_tensors(sums, maxes)
        return stats
