"""The learner on a GPU (needs only torch, transformers and DeepSpeed, e.g. a carried wheel): one
25k-token step of a Qwen2.5-1.5B-shaped model, and the device placement of every learner tensor.

On a GPU machine without DeepSpeed or network: ``deploy/gpu/gpu_wheels.sh`` here builds ``.whl/``, and
``deploy/gpu/gpu_check.sh`` there installs it and runs ``tests/gpu`` and ``bench/learner_long.py``."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from rredcot.common.config import LearnerConfig
from tests.learner_samples import SHAPES, random_samples, tiny_lm

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _engine(model: torch.nn.Module, **kw):
    from rredcot.learner.engine import LearnerEngine

    return LearnerEngine(model, LearnerConfig(**{"dtype": "bfloat16", "lr": 1e-5, **kw}))


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    now = dict(module.named_parameters())
    return any(not torch.equal(t, now[n].detach()) for n, t in before.items())


def test_25k_token_step_of_a_1_5b_model_zero2_bf16():
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES["qwen2.5-1.5b"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    engine = _engine(model, zero_stage=2, grad_checkpointing=True, micro_token_budget=26_000, logprob_chunk=4096)
    before = {n: p.detach().clone() for n, p in list(engine.module.named_parameters())[-4:]}
    result = engine.train_step(random_samples(1, lengths=[25_000], prompt=256, vocab=config.vocab_size))
    assert result.applied, result.metrics
    assert math.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
    assert _changed(before, engine.module)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_every_tensor_on_the_gpu_with_a_kl_term_and_chunks(stage):
    """Loss, statistics, reductions and the KL reference model on the GPU (stage 3: no KL, refused);
    the second step's KL is positive (the first one's is 0: the policy is still the reference)."""
    kl = 0.1 if stage < 3 else 0.0
    engine = _engine(tiny_lm(0), zero_stage=stage, kl_coef=kl, logprob_chunk=8, micro_token_budget=64)
    if kl:
        assert next(engine.ref_model.parameters()).device.type == "cuda"
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    result = engine.train_step(random_samples(6))
    assert result.applied and math.isfinite(result.metrics["loss"])
    assert _changed(before, engine.module)
    second = engine.train_step(random_samples(6, seed=1))
    assert second.applied and (second.metrics["kl"] > 0) == (kl > 0)


def test_zero3_loads_a_saved_policy_into_partitions_and_steps(tmp_path):
    """``rredcot train``'s ZeRO-3 path: the saved policy loads inside ``zero.Init`` (transformers
    needs accelerate for it, which the GPU image may lack: deploy/gpu/gpu_wheels.sh carries it), every
    partition lives on the GPU, and a step trains it."""
    from rredcot.learner.engine import load_policy

    tiny_lm(0).save_pretrained(tmp_path)
    cfg = LearnerConfig(dtype="bfloat16", lr=1e-5, zero_stage=3, logprob_chunk=8, micro_token_budget=64)
    policy = load_policy(str(tmp_path), cfg)
    assert all(hasattr(p, "ds_id") and p.ds_tensor.device.type == "cuda" for p in policy.parameters())
    engine = _engine(policy, zero_stage=3, logprob_chunk=8, micro_token_budget=64)
    result = engine.train_step(random_samples(6))
    assert result.applied and math.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
