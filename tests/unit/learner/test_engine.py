"""The DeepSpeed engine (real DeepSpeed, CPU, one rank): exact gradients and the bad-batch guards."""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import pytest
import torch
from deepspeed.utils import safe_get_full_grad

from rredcot.common.config import LearnerConfig
from rredcot.common.onednn import PRIMITIVE_CACHE, PRIMITIVE_CACHE_ENV
from rredcot.learner.engine import (
    MUON_MODULES,
    LearnerEngine,
    all_gather_bytes,
    all_reduce_scalars,
    comm_device,
    init_distributed,
    load_policy,
    lr_factor,
    reduce_stats,
)
from rredcot.learner.logprobs import token_logprobs
from rredcot.learner.loss import LossSettings, Stats, policy_loss, sample_coefficients
from rredcot.learner.packing import BudgetError, collate
from rredcot.learner.weights import full_state


def config(**kw) -> LearnerConfig:
    return LearnerConfig(
        **{"dtype": "float32", "lr": 1e-3, "micro_token_budget": 64, "zero3_persistence_threshold": 0, **kw}
    )


@pytest.mark.parametrize(("stage", "grad_ckpt", "chunk"), [(2, False, 0), (3, False, 8), (2, True, 8)])
def test_deepspeed_gradient_equals_autograd_of_sigma_weighted_loss(make_model, make_samples, stage, grad_ckpt, chunk):
    """Non-uniform σ, several micro-batches: DeepSpeed's accumulated gradient == autograd of Σ_i c_i Σ_j σ_j ℓ_j."""
    model = make_model()
    reference = copy.deepcopy(model).train()
    samples = make_samples(6)
    engine = LearnerEngine(model, config(zero_stage=stage, grad_checkpointing=grad_ckpt, logprob_chunk=chunk))
    pending = engine.accumulate(samples)
    assert pending.micro_batches > 1
    mb = collate(samples)  # the whole batch at once, one packed row, plain autograd
    loss, _ = policy_loss(token_logprobs(reference, mb), mb, 0, sample_coefficients(mb, "sample", 6), LossSettings())
    loss.backward()
    for name, p in engine.module.named_parameters():
        ref = dict(reference.named_parameters())[name].grad
        torch.testing.assert_close(safe_get_full_grad(p), ref, atol=1e-6, rtol=1e-4, msg=name)
    assert engine.apply(pending).applied and engine.version == 1


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_the_engine_sets_the_float32_matmul_precision_of_its_process(make_model, precision):
    """learner.fp32_matmul reaches torch's CUDA matmul setting (the float32 LM head's precision on a GPU)."""
    previous = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32" if precision == "ieee" else "ieee"
        LearnerEngine(make_model(), config(zero_stage=0, fp32_matmul=precision))
        assert torch.backends.cuda.matmul.fp32_precision == precision
    finally:
        torch.backends.cuda.matmul.fp32_precision = previous


def test_the_engine_bounds_onednns_primitive_cache_before_its_first_matmul(make_model, monkeypatch):
    """The cap (tests/unit/common/test_onednn.py) must be in the environment before the first step."""
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    LearnerEngine(make_model(), config(zero_stage=0))
    assert os.environ[PRIMITIVE_CACHE_ENV] == str(PRIMITIVE_CACHE)


def test_the_engine_neither_builds_nor_loads_deepspeeds_shared_memory_op(make_model):
    """DeepSpeed's CPU backend built its shared-memory op at a learner's first start on each machine
    (20-45 s, a C++ compiler) and loaded it in every learner; it serves only DeepSpeed's inference
    all-reduce, which the learner never calls."""
    from deepspeed.comm import comm

    LearnerEngine(make_model(), config(zero_stage=0))
    assert comm.cdb is not None and comm.cdb.shm_comm_op is None  # this process's DeepSpeed backend
    assert not hasattr(torch.ops.deepspeed, "inference_all_reduce_")  # the op's kernel never registered


@pytest.mark.parametrize("stage", [2, 3])
def test_a_zero_engine_trains_without_importing_deepspeeds_muon(make_model, make_samples, monkeypatch, stage):
    """DeepSpeed imports its Muon optimizer (and torch.compiles its kernels, 1-2 s of CPU at every
    learner start) in ZeRO's checks and at the first gradient reduction, only to find the optimizer is
    not Muon: the learner's AdamW trains on stand-ins, which no real import replaced."""
    for name in MUON_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    engine = LearnerEngine(make_model(), config(zero_stage=stage))
    assert engine.engine.zero_optimization_stage() == stage
    assert engine.train_step(make_samples(4)).applied  # the first reduction, which imported Muon's update
    assert all(getattr(sys.modules[name], "__file__", None) is None for name in MUON_MODULES)  # still stand-ins


def test_bf16_step_trains(make_model, make_samples):
    engine = LearnerEngine(make_model(), config(zero_stage=2, dtype="bfloat16", grad_checkpointing=True))
    before = full_state(engine.module)
    result = engine.train_step(make_samples(4))
    assert result.applied and np.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
    after = full_state(engine.module)
    assert after["model.norm.weight"].dtype == torch.bfloat16
    assert engine.engine.optimizer.gradient_accumulation_dtype == torch.float32  # not bf16 over micro-batches
    assert any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.parametrize(("stage", "mu"), [(0, np.nan), (2, np.nan), (3, np.nan), (0, -np.inf), (2, -np.inf)])
def test_nonfinite_loss_or_gradient_skips_step_and_run_continues(make_model, make_samples, stage, mu):
    """NaN behaviour log-probs give a NaN loss; -inf ones an infinite ratio (finite loss, NaN gradient)."""
    engine = LearnerEngine(make_model(), config(zero_stage=stage))
    bad = make_samples(5, seed=3)
    bad[2] = type(bad[2])(**{**bad[2].__dict__, "behaviour_logprobs": np.full_like(bad[2].behaviour_logprobs, mu)})
    before = full_state(engine.module)
    result = engine.train_step(bad)
    assert not result.applied and result.metrics["skipped_nonfinite"] == 1
    assert engine.counters["skipped_nonfinite"] == 1 and engine.version == 0
    after = full_state(engine.module)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert engine.train_step(make_samples(5, seed=4)).applied and engine.version == 1
    assert any(not torch.equal(after[n], t) for n, t in full_state(engine.module).items())


def test_zero_advantages_make_no_update(make_model, make_samples):
    engine = LearnerEngine(make_model(), config(zero_stage=0))
    samples = [type(s)(**{**s.__dict__, "advantage": 0.0}) for s in make_samples(4)]
    before = full_state(engine.module)
    result = engine.train_step(samples)
    assert not result.applied and engine.counters["skipped_empty"] == 1 and engine.version == 0
    assert all(torch.equal(before[n], t) for n, t in full_state(engine.module).items())


@pytest.mark.parametrize("agg", ["sample", "token"])
def test_skipping_zero_advantages_keeps_the_learning_rate(make_model, make_samples, agg):
    """Issue 13.7: with skip_zero_advantage the loss was divided by the informative samples only,
    so the step grew with the share of A = 0 samples. Skipping must give the update of not skipping."""
    samples = make_samples(6, seed=7)
    samples[1:5] = [type(s)(**{**s.__dict__, "advantage": 0.0}) for s in samples[1:5]]
    states, losses = [], []
    for skip in (True, False):
        engine = LearnerEngine(make_model(), config(zero_stage=0, skip_zero_advantage=skip, loss_agg=agg))
        result = engine.train_step(samples)
        assert result.applied
        states.append(full_state(engine.module))
        losses.append(result.metrics["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)  # the same loss scale, not 6/2 of it
    for name, t in states[0].items():
        torch.testing.assert_close(t, states[1][name], atol=1e-6, rtol=1e-5, msg=name)


def test_too_long_sample_raises_naming_the_budget(make_model, make_samples):
    engine = LearnerEngine(make_model(), config(zero_stage=1, micro_token_budget=32))
    with pytest.raises(BudgetError, match=r"micro_token_budget=32"):
        engine.train_step(make_samples(2, lengths=[5, 40]))


def test_reductions_place_tensors_on_the_collective_device():
    """The scalars, statistics and bytes the ranks exchange are made on the backend's device (the
    GPU under NCCL), not on the default one: with ``meta`` as the default they still work on gloo."""
    init_distributed()
    stats = Stats()
    stats.add({"tokens": 3.0, "clipped": 1.0}, {"ratio_max": 2.0})
    with torch.device("meta"):
        device = comm_device()
        scalars = all_reduce_scalars([1.0, 2.0, 3.0], ["sum", "max", "sum"], device)
        reduce_stats(stats, device)
        gathered = all_gather_bytes(b"abc", device)
    assert device.type == "cpu" and scalars == [1.0, 2.0, 3.0] and gathered == [b"abc"]
    assert stats.result()["clip_frac"] == pytest.approx(1 / 3) and stats.result()["ratio_max"] == 2.0


def test_lr_factor_hand_values():
    cosine = LearnerConfig(lr_warmup_steps=4, lr_schedule="cosine", lr_min_ratio=0.1)
    assert [lr_factor(s, cosine, 14) for s in (0, 1, 3, 4)] == [0.25, 0.5, 1.0, 1.0]
    assert lr_factor(9, cosine, 14) == pytest.approx(0.55)  # half-way down: 0.1 + 0.9 / 2
    assert lr_factor(14, cosine, 14) == pytest.approx(0.1) and lr_factor(30, cosine, 14) == pytest.approx(0.1)
    assert [lr_factor(s, LearnerConfig(lr_warmup_steps=2), 14) for s in (0, 1, 10)] == [0.5, 1.0, 1.0]


def test_engine_steps_follow_the_warm_up(make_model, make_samples):
    engine = LearnerEngine(make_model(), config(zero_stage=1, lr_warmup_steps=2), total_steps=4)
    lrs = [engine.train_step(make_samples(3, seed=i)).metrics["lr"] for i in range(3)]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3])


def test_zero3_loads_the_policy_into_partitions(make_model, tmp_path):
    """Under ZeRO-3 the weights are loaded inside ``zero.Init`` (no whole copy per rank) and train
    from the saved values."""
    model = make_model()
    model.save_pretrained(tmp_path)
    loaded = load_policy(str(tmp_path), config(zero_stage=3))
    assert all(hasattr(p, "ds_id") for p in loaded.parameters())
    engine = LearnerEngine(loaded, config(zero_stage=3))
    saved = {n: p.detach() for n, p in model.named_parameters()}
    state = full_state(engine.module)
    assert state.keys() == saved.keys()
    for name, tensor in saved.items():
        torch.testing.assert_close(state[name], tensor, atol=0, rtol=0, msg=name)


def test_the_kl_term_measures_the_policy_against_the_frozen_initial_model(make_model, make_samples):
    """``kl_coef > 0``: the step's ``kl`` is the token mean of k3 = e^r − r − 1, r = log π_ref − log π,
    with π_ref the initial model, frozen (its copy stays the initial weights), recomputed by hand with
    plain autograd-free forwards; 0 at the first step (π = π_ref), positive after an update."""
    model = make_model()
    initial = copy.deepcopy(model).eval()
    engine = LearnerEngine(model, config(zero_stage=0, kl_coef=0.1))
    first = engine.train_step(make_samples(4, seed=1))
    assert first.applied and first.metrics["kl"] == pytest.approx(0.0, abs=1e-9)
    samples = make_samples(4, seed=2)
    mb = collate(samples)
    now = copy.deepcopy(initial)
    assert not now.load_state_dict(full_state(engine.module), strict=False).unexpected_keys  # lm_head: tied
    with torch.no_grad():
        r = token_logprobs(initial, mb) - token_logprobs(now.eval(), mb)
    expected = (torch.exp(r) - r - 1).mean().item()
    second = engine.train_step(samples)
    assert expected > 1e-6 and second.metrics["kl"] == pytest.approx(expected, rel=1e-4)
    ref = dict(engine.ref_model.lm.named_parameters())
    assert all(torch.equal(ref[n], p) for n, p in initial.named_parameters())
