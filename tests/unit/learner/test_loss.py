"""The σ-weighted policy loss against independent reference computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rredcot.learner.loss import LossSettings, Stats, policy_loss, sample_coefficients
from rredcot.learner.packing import collate


def grpo_reference(logp, mu, adv, lengths, eps_low, eps_high, agg):
    """Textbook GRPO (sample: mean over tokens then samples) / DAPO token-mean, written out per sample."""
    per_sample, total, start = [], [], 0
    for L, a in zip(lengths, adv, strict=True):
        terms = []
        for j in range(start, start + L):
            r = math.exp(logp[j] - mu[j])
            terms.append(-min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a))
        per_sample.append(sum(terms) / L)
        total.extend(terms)
        start += L
    return sum(per_sample) / len(lengths) if agg == "sample" else sum(total) / len(total)


@pytest.mark.parametrize("agg", ["sample", "token"])
def test_uniform_sigma_fresh_tokens_is_grpo(make_samples, agg):
    samples = make_samples(6, sigma="uniform", lengths=[4, 17, 1, 30, 9, 12])
    mb = collate(samples)
    logp = mb.behaviour_logprobs + torch.randn(len(mb.targets), generator=torch.Generator().manual_seed(0)) * 0.4
    logp.requires_grad_(True)
    s = LossSettings(eps_low=0.2, eps_high=0.28, loss_agg=agg)
    denom = len(samples) if agg == "sample" else float(mb.completion_lengths.sum())
    loss, stats = policy_loss(logp, mb, 0, sample_coefficients(mb, agg, denom), s)
    ref = grpo_reference(
        logp.tolist(),
        mb.behaviour_logprobs.tolist(),
        [x.advantage for x in samples],
        mb.completion_lengths.tolist(),
        0.2,
        0.28,
        agg,
    )
    assert loss.item() == pytest.approx(ref, abs=1e-6)
    m = stats.result()
    assert 0.05 < m["clip_frac"] < 0.95  # the clip branch is exercised
    assert m["sigma_max_scaled_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["sigma_entropy_norm"] == pytest.approx(1.0, abs=1e-5)
    assert m["stale_frac"] == 0


def test_stale_tokens_get_truncated_importance_weight(make_samples):
    samples = make_samples(3, version=2)
    mb = collate(samples)
    logp = mb.behaviour_logprobs + torch.linspace(-1.5, 1.5, len(mb.targets))
    logp.requires_grad_(True)
    coef = sample_coefficients(mb, "sample", 3)
    loss, stats = policy_loss(logp, mb, 5, coef, LossSettings(tis_cap=2.0))
    loss.backward()
    w = torch.exp(logp.detach() - mb.behaviour_logprobs).clamp(max=2.0)
    expected_grad = -w * mb.advantages * mb.sigma * coef[mb.sample_of_token]
    torch.testing.assert_close(logp.grad, expected_grad, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(loss.detach(), expected_grad.sum(), atol=1e-6, rtol=1e-5)
    m = stats.result()
    assert m["stale_frac"] == 1 and m["is_weight_max"] == pytest.approx(2.0)
    assert 0 < m["is_truncated_frac"] < 1 and m["clip_frac"] == 0


def test_k3_kl_term(make_samples):
    samples = make_samples(2, sigma="uniform", lengths=[5, 8])
    mb = collate(samples)
    logp = mb.behaviour_logprobs.clone()
    ref = logp + 0.3
    coef = sample_coefficients(mb, "token", 13.0)
    base, _ = policy_loss(logp, mb, 0, coef, LossSettings())
    with_kl, stats = policy_loss(logp, mb, 0, coef, LossSettings(kl_coef=0.5), ref_logp=ref)
    k3 = math.exp(0.3) - 0.3 - 1
    assert (with_kl - base).item() == pytest.approx(0.5 * k3, rel=1e-4)
    assert stats.result()["kl"] == pytest.approx(k3, rel=1e-4)


def test_sigma_statistics_non_uniform(make_samples):
    sample = make_samples(1, lengths=[4])[0]
    sigma = np.array([0.7, 0.1, 0.1, 0.1], np.float32)
    mb = collate([type(sample)(**{**sample.__dict__, "sigma": sigma})])
    _, stats = policy_loss(mb.behaviour_logprobs, mb, 0, torch.ones(1), LossSettings())
    m = stats.result()
    assert m["sigma_entropy"] == pytest.approx(-(0.7 * math.log(0.7) + 0.3 * math.log(0.1)), rel=1e-5)
    assert m["sigma_max_scaled_max"] == pytest.approx(2.8, rel=1e-5)


def test_stats_merge_and_tensor_roundtrip():
    a, b = Stats(), Stats()
    a.add({"tokens": 4, "clipped": 1}, {"ratio_max": 1.5})
    b.add({"tokens": 6, "clipped": 4}, {"ratio_max": 3.0})
    merged = Stats()
    sums = a.as_tensors()[0] + b.as_tensors()[0]
    maxes = torch.maximum(a.as_tensors()[1], b.as_tensors()[1])
    merged.load_tensors(sums, maxes)
    assert merged.result()["clip_frac"] == 0.5 and merged.result()["ratio_max"] == 3.0


def test_loss_allocates_on_the_batch_device(make_samples):
    """Every tensor the loss makes lives on the micro-batch's device: with ``meta`` as the default
    device, a bare ``torch.zeros(n)`` (what a CUDA learner would get on the CPU) fails to mix."""
    samples = make_samples(4, version=1)
    mb = collate(samples)
    logp = mb.behaviour_logprobs + 0.1
    expected, expected_stats = policy_loss(
        logp, mb, 2, sample_coefficients(mb, "sample", 4), LossSettings(kl_coef=0.1), logp - 0.2
    )
    with torch.device("meta"):
        for agg, denom in (("sample", 4), ("token", float(mb.completion_lengths.sum()))):
            coef = sample_coefficients(mb, agg, denom)
            assert coef.device.type == "cpu"
        loss, stats = policy_loss(
            logp, mb, 2, sample_coefficients(mb, "sample", 4), LossSettings(kl_coef=0.1), logp - 0.2
        )
        sums, maxes = stats.as_tensors("cpu")
    assert loss.device.type == "cpu" and sums.device.type == "cpu" and maxes.device.type == "cpu"
    assert loss.item() == pytest.approx(expected.item()) and stats.result() == expected_stats.result()


@pytest.mark.parametrize("dual_clip", [0.0, 3.0])
def test_dual_clip_bounds_fresh_tokens_with_negative_advantage(make_samples, dual_clip):
    """A fresh token with A < 0 whose ratio exploded (e^3 ≈ 20): without the dual clip its loss is
    ρ·|A| and its gradient pushes hard; with it the objective is c·A, with no gradient."""
    sample = make_samples(1, lengths=[5])[0]
    sample = type(sample)(**{**sample.__dict__, "advantage": -0.5})
    mb = collate([sample])
    logp = (mb.behaviour_logprobs + 3.0).requires_grad_(True)
    loss, stats = policy_loss(logp, mb, 0, torch.ones(1), LossSettings(dual_clip=dual_clip))
    loss.backward()
    sigma = mb.sigma.double()
    if dual_clip:
        assert loss.item() == pytest.approx(float((sigma * dual_clip * 0.5).sum()), rel=1e-5)
        assert torch.count_nonzero(logp.grad) == 0 and stats.result()["dual_clip_frac"] == 1.0
    else:
        assert loss.item() == pytest.approx(float((sigma * math.exp(3.0) * 0.5).sum()), rel=1e-4)
        assert bool((logp.grad > 0).all()) and stats.result()["dual_clip_frac"] == 0.0


def test_dual_clip_leaves_tokens_below_it_and_positive_advantages_alone(make_samples):
    samples = make_samples(6, version=0)
    mb = collate(samples)
    logp = mb.behaviour_logprobs + torch.linspace(-0.5, 1.0, len(mb.targets))  # ratios up to e ≈ 2.7 < 3
    coef = sample_coefficients(mb, "sample", 6)
    with_dual, _ = policy_loss(logp, mb, 0, coef, LossSettings(dual_clip=3.0))
    without, _ = policy_loss(logp, mb, 0, coef, LossSettings(dual_clip=0.0))
    assert with_dual.item() == pytest.approx(without.item(), abs=1e-7)
