"""The σ-weighted policy loss against independent reference computations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.learner.loss import LossSettings, Stats, policy_loss, sample_coefficients
from rredcot.learner.packing import TrainSample, collate


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
    assert m["sigma_zero_frac"] == 0.0


def test_sigma_zero_fraction_counts_the_tokens_sigma_leaves_without_gradient(make_samples):
    """RREDCoT's relu σ with λ = 0 is zero on segments against the advantage's sign: 4 of 7 tokens here."""
    a, b = make_samples(2, lengths=[4, 3])
    mb = collate(
        [
            type(a)(**{**a.__dict__, "sigma": np.array([0.0, 0.0, 0.5, 0.5], np.float32)}),
            type(b)(**{**b.__dict__, "sigma": np.array([1.0, 0.0, 0.0], np.float32)}),
        ]
    )
    _, stats = policy_loss(mb.behaviour_logprobs, mb, 0, torch.ones(2), LossSettings())
    assert stats.result()["sigma_zero_frac"] == pytest.approx(4 / 7)


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


def _with(sample, **fields):
    return dataclasses.replace(sample, **fields)


def test_fresh_token_gradient_by_hand(make_samples):
    """∂loss/∂log π_θ for fresh tokens (version = the learner's): −c·σ_j·A·ρ_j where the unclipped term
    ρA is the minimum, 0 where the clipped one is (ρ beyond 1 + ε_high with A > 0, below 1 − ε_low with
    A < 0) and 0 where the dual clip c_dual·A binds (A < 0, ρ > c_dual)."""
    base = make_samples(2, lengths=[4, 4])
    sigma = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    samples = [_with(base[0], advantage=1.0, sigma=sigma), _with(base[1], advantage=-0.5, sigma=sigma[::-1].copy())]
    mb = collate(samples)
    # log ρ per token; ε_low = 0.2, ε_high = 0.28, dual clip 3
    delta = torch.tensor([0.0, 0.1, 0.5, -0.5, 0.0, -0.5, 0.5, 1.5])
    # A = +1: ρ = 1, e^0.1 (inside), e^0.5 = 1.65 > 1.28 (clipped), e^-0.5 = 0.61 (ρA < 0.8A: unclipped)
    # A = -0.5: ρ = 1, e^-0.5 = 0.61 < 0.8 (clipped), e^0.5 (ρA < 1.28A: unclipped), e^1.5 = 4.5 > 3 (dual clip)
    live = torch.tensor([1, 1, 0, 1, 1, 0, 1, 0], dtype=torch.bool)
    logp = (mb.behaviour_logprobs + delta).requires_grad_(True)
    coef = torch.tensor([0.25, 0.75])
    loss, stats = policy_loss(logp, mb, 0, coef, LossSettings(eps_low=0.2, eps_high=0.28, dual_clip=3.0))
    loss.backward()
    c = coef[mb.sample_of_token]
    rho = delta.exp()
    expected = torch.where(live, -c * mb.sigma * mb.advantages * rho, torch.zeros(8))
    torch.testing.assert_close(logp.grad, expected, atol=1e-7, rtol=1e-5)
    assert logp.grad[~live].eq(0).all()
    m = stats.result()
    assert m["clip_frac"] == pytest.approx(2 / 8) and m["dual_clip_frac"] == pytest.approx(1 / 8)
    # the loss value by hand: −c·σ·(objective), objective = ρA, (1 + ε)A, (1 − ε)A or 3A
    objective = [1.0, math.exp(0.1), 1.28, math.exp(-0.5), -0.5, -0.5 * 0.8, -0.5 * math.exp(0.5), -1.5]
    weights = [0.25 * s for s in sigma.tolist()] + [0.75 * s for s in sigma[::-1].tolist()]
    assert loss.item() == pytest.approx(-sum(w * o for w, o in zip(weights, objective)), rel=1e-5)


def test_a_version_newer_than_the_learners_is_stale(make_samples):
    """A token generated by a newer version than the learner's (a learner restored from an older
    checkpoint) is corrected like a stale one, not clipped against μ: ρ = π_θ/sg(π_θ), weight
    min(e^{log π_θ − μ}, tis_cap). With log ρ = 1.0 and A > 0 a fresh token would be clipped (no gradient)."""
    (sample,) = make_samples(1, lengths=[3])
    versions = np.array([4, 5, 6], np.int32)  # learner version 5: stale, fresh, newer
    mb = collate([_with(sample, advantage=2.0, versions=versions, sigma=np.full(3, 1 / 3, np.float32))])
    logp = (mb.behaviour_logprobs + 1.0).requires_grad_(True)
    loss, stats = policy_loss(logp, mb, 5, torch.ones(1), LossSettings(tis_cap=2.0, eps_high=0.28))
    loss.backward()
    capped = -(1 / 3) * 2.0 * 2.0  # −σ·min(e, 2)·A
    torch.testing.assert_close(logp.grad, torch.tensor([capped, 0.0, capped]), atol=1e-7, rtol=1e-5)
    assert stats.result()["stale_frac"] == pytest.approx(2 / 3)
    assert loss.item() == pytest.approx((1 / 3) * (-4.0 - 1.28 * 2.0 - 4.0), rel=1e-5)


def reference_loss_and_grad(logp, mu, ref, sigma, adv, versions, sample_of, coef, version, s: LossSettings):
    """The loss and ∂loss/∂log π_θ per token, written out from the loss definition (loss.py, docs/learner.md
    "The loss") in float64 Python: a token of another version than the learner's (older or newer)
    has ρ = π_θ/sg(π_θ) (value 1, derivative 1) and weight w = min(π_θ/μ, tis_cap) with no gradient;
    a fresh one ρ = π_θ/μ, w = 1. s = min(ρA, clip(ρ)A), then max(s, c·A) for A < 0 when the dual clip
    c > 0; ℓ = −w·s + β·(e^r − r − 1), r = log π_ref − log π_θ; loss = Σ coef_i σ_j ℓ_j."""
    loss, grad = 0.0, []
    for j, lp in enumerate(logp):
        a, c = adv[j], coef[sample_of[j]]
        if versions[j] != version:
            rho, d_rho, w = 1.0, 1.0, min(math.exp(lp - mu[j]), s.tis_cap)
        else:
            rho = math.exp(lp - mu[j])
            d_rho, w = rho, 1.0
        lo, hi = 1 - s.eps_low, 1 + s.eps_high
        clipped = min(max(rho, lo), hi)
        if rho * a <= clipped * a:
            surrogate, d_surrogate = rho * a, d_rho * a
        else:  # the clipped ratio sits at its bound: constant
            surrogate, d_surrogate = clipped * a, 0.0
        if s.dual_clip > 0 and a < 0 and surrogate < s.dual_clip * a:
            surrogate, d_surrogate = s.dual_clip * a, 0.0
        tok, d_tok = -w * surrogate, -w * d_surrogate
        if ref is not None and s.kl_coef > 0:
            r = ref[j] - lp
            tok += s.kl_coef * (math.exp(r) - r - 1)
            d_tok += s.kl_coef * (1 - math.exp(r))
        loss += c * sigma[j] * tok
        grad.append(c * sigma[j] * d_tok)
    return loss, grad


def _near_a_kink(lp, mu, adv, versions, version, s: LossSettings) -> list[bool]:
    """Tokens whose ratio sits within float32 rounding of a clip or dual-clip bound, where the
    float32 loss and the float64 reference may take different branches (the gradient jumps there)."""
    out = []
    for j in range(len(lp)):
        rho = 1.0 if versions[j] != version else math.exp(lp[j] - mu[j])
        kinks = [1 - s.eps_low, 1 + s.eps_high] + ([s.dual_clip] if s.dual_clip > 0 else [])
        out.append(any(abs(rho - k) < 1e-4 * max(1.0, k) for k in kinks))
    return out


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    lengths=st.lists(st.integers(1, 10), min_size=1, max_size=4),
    version=st.integers(2, 6),
    eps_low=st.floats(0.05, 0.5),
    eps_high=st.floats(0.05, 0.5),
    dual_clip=st.one_of(st.just(0.0), st.floats(1.6, 5.0)),
    kl_coef=st.one_of(st.just(0.0), st.floats(0.01, 1.0)),
    tis_cap=st.floats(1.0, 3.0),
    agg=st.sampled_from(["sample", "token"]),
)
def test_loss_and_gradient_match_the_per_token_reference(
    data, lengths, version, eps_low, eps_high, dual_clip, kl_coef, tis_cap, agg
):
    """Random σ, advantages of both signs (and 0), per-token versions older, equal to and newer than the
    learner's, log-ratios across both clip bounds and the dual clip, with and without KL: the loss and
    logp.grad equal the float64 reference above (coefficients c_i = 1/N_samples or |o_i|/N_tokens)."""
    samples = []
    for i, n in enumerate(lengths):
        floats = lambda lo, hi: st.lists(st.floats(lo, hi), min_size=n, max_size=n)  # noqa: E731, B023
        samples.append(
            TrainSample(
                id=f"s{i}",
                prompt_ids=np.arange(1, 4, dtype=np.int32),
                completion_ids=np.arange(1, n + 1, dtype=np.int32),
                behaviour_logprobs=np.array(data.draw(floats(-8.0, -0.01)), np.float32),
                sigma=np.array(data.draw(floats(0.0, 1.0)), np.float32),
                versions=np.array(data.draw(st.lists(st.integers(version - 2, version + 2), min_size=n, max_size=n))),
                advantage=data.draw(st.one_of(st.just(0.0), st.floats(-2.0, 2.0))),
            )
        )
    mb = collate(samples)
    n_tokens = sum(lengths)
    delta = np.array(data.draw(st.lists(st.floats(-2.0, 2.0), min_size=n_tokens, max_size=n_tokens)), np.float32)
    logp = (mb.behaviour_logprobs + torch.from_numpy(delta)).requires_grad_(True)
    ref = mb.behaviour_logprobs + torch.from_numpy(
        np.array(data.draw(st.lists(st.floats(-1.0, 1.0), min_size=n_tokens, max_size=n_tokens)), np.float32)
    )
    s = LossSettings(eps_low, eps_high, tis_cap, kl_coef, agg, dual_clip)
    denom = len(samples) if agg == "sample" else float(n_tokens)
    loss, stats = policy_loss(logp, mb, version, sample_coefficients(mb, agg, denom), s, ref_logp=ref)
    loss.backward()

    sample_of = [i for i, n in enumerate(lengths) for _ in range(n)]
    coef = [1 / len(lengths) if agg == "sample" else n / n_tokens for n in lengths]
    lp, mu = logp.detach().double().tolist(), mb.behaviour_logprobs.double().tolist()
    adv = [samples[i].advantage for i in sample_of]
    versions = [int(v) for smp in samples for v in smp.versions]
    sigma = mb.sigma.double().tolist()
    expected, grad = reference_loss_and_grad(
        lp, mu, ref.double().tolist(), sigma, adv, versions, sample_of, coef, version, s
    )
    assert loss.item() == pytest.approx(expected, rel=1e-4, abs=1e-5)
    keep = [not k for k in _near_a_kink(lp, mu, adv, versions, version, s)]
    np.testing.assert_allclose(logp.grad.double().numpy()[keep], np.array(grad)[keep], rtol=1e-4, atol=1e-6)
    assert stats.result()["stale_frac"] == pytest.approx(sum(v != version for v in versions) / n_tokens)
