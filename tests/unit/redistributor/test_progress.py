"""``credit.method=progress``: σ by hand and its properties, the prover's values against brute force
on a real tiny model, α = 0 as the entropy method, the settings and the transformers prover."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.common.config import ConfigError, load_config, resolve_credit
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.entropy import score_trace
from rredcot.redistributor.mc import HFContinuationSampler
from rredcot.redistributor.methods import ProgressSettings
from rredcot.redistributor.progress import progress_sigma
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.worker import build_scorer, scorer_sampler
from tests.engine_fixtures import hf_greedy
from tests.unit.redistributor.cases import make_group

W = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 2.0])  # entropy weights of 6 tokens
EXITS = np.array([0, 2, 5])  # two segments; token 5 (the answer) lies outside both
TRACE = "<think>\nFirst, 12*7 = 70 + 14.\nSo it is 84.\nWait, yes.\n</think>\n\nAnswer: 84"


def test_progress_sigma_by_hand() -> None:
    """Factors 1 + α·sgn(A)·p_k on the segments, 1 outside, clipped at 0; σ = w·factor / Σ."""
    p = np.array([0.5, -0.25])
    sigma, why = progress_sigma(W, EXITS, p, 1.5, 2.0)  # factors 2, 0.5, 1: w·f = 2 4 .5 1.5 .5 2
    np.testing.assert_allclose(sigma, np.array([2, 4, 0.5, 1.5, 0.5, 2]) / 10.5, rtol=1e-6)
    assert why == ""
    sigma, _ = progress_sigma(W, EXITS, p, -0.3, 2.0)  # A < 0: blame; factors 0, 1.5, 1
    np.testing.assert_allclose(sigma, np.array([0, 0, 1.5, 4.5, 1.5, 2]) / 9.5, rtol=1e-6)
    sigma, _ = progress_sigma(W, EXITS, p, 1.0, 8.0)  # factors 5, max(0, −1) = 0, 1
    np.testing.assert_allclose(sigma, np.array([5, 10, 0, 0, 0, 2]) / 17, rtol=1e-6)
    # every weighted token's factor is 0: the entropy σ, named
    sigma, why = progress_sigma(np.array([0.0, 0.0, 1.0, 1.0]), np.array([0, 4]), np.array([-1.0]), 1.0, 1.0)
    assert sigma.tolist() == [0, 0, 0.5, 0.5] and why == "zero_mass"
    assert progress_sigma(np.zeros(0), np.array([0]), np.zeros(0), 1.0, 1.0)[0].size == 0


@settings(max_examples=300, deadline=None)
@given(
    w=st.lists(st.just(0.0) | st.floats(1e-3, 10.0), min_size=1, max_size=40).filter(lambda w: sum(w) > 0),
    data=st.data(),
    advantage=st.floats(-3, 3),
    alpha=st.floats(0, 5),
)
def test_progress_sigma_properties(w, data, advantage, alpha) -> None:
    """σ ≥ 0, Σσ = 1; α = 0 (or A = 0) gives the entropy σ bit for bit; tokens of one segment keep
    their entropy ratios; a segment of higher sgn(A)·progress never gets less σ per unit of w; with
    α ≤ 1 (|p| ≤ 1) nothing is clipped: σ·Σ(w·f) = w·(1 + α·sgn(A)·p)."""
    w = np.array(w)
    n = len(w)
    exits = np.array(sorted(set(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=6)))))
    p = np.array(data.draw(st.lists(st.floats(-1, 1), min_size=len(exits) - 1, max_size=len(exits) - 1)))
    sigma, why = progress_sigma(w, exits, p, advantage, alpha)
    assert np.all(sigma >= 0) and abs(float(sigma.sum(dtype=np.float64)) - 1) < 1e-5
    entropy_sigma = (w / w.sum()).astype(np.float32)
    np.testing.assert_array_equal(progress_sigma(w, exits, p, advantage, 0.0)[0], entropy_sigma)
    np.testing.assert_array_equal(progress_sigma(w, exits, p, 0.0, alpha)[0], entropy_sigma)
    if why:
        return
    per_w = np.full(n, np.nan)
    per_w[w > 0] = sigma[w > 0] / w[w > 0]
    gain = [float(np.sign(advantage)) * pk for pk in p]
    for k in range(len(p)):
        seg = per_w[exits[k] : exits[k + 1]]
        seg = seg[np.isfinite(seg)]
        np.testing.assert_allclose(seg, seg[:1].repeat(len(seg)), rtol=1e-5)
        for j in range(len(p)):
            a, b = per_w[exits[k] : exits[k + 1]], per_w[exits[j] : exits[j + 1]]
            a, b = a[np.isfinite(a)], b[np.isfinite(b)]
            if gain[k] > gain[j] and a.size and b.size:
                assert a[0] >= b[0] * (1 - 1e-5)
    if alpha <= 1:
        factor = np.ones(n)
        for k, g in enumerate(gain):
            factor[exits[k] : exits[k + 1]] = 1 + alpha * g
        z = w * factor
        np.testing.assert_allclose(sigma, z / z.sum(), rtol=1e-5, atol=1e-7)


def _config(*extra: str):
    segments = ["credit.segmentation.segments=4", "credit.segmentation.min_segment_tokens=1"]
    return load_config("tests", ["credit.method=progress", *segments, *extra])


def test_progress_is_the_greedy_provers_value_change(qwen_tok, qwen_model) -> None:
    """A deterministic (greedy) prover: each exit's value is the reward of its one continuation,
    computed here by hand within the budget left there; progress is their difference, and σ follows
    ``progress_sigma`` on the scorer's entropies."""
    group = make_group(qwen_tok, traces=[TRACE, "x"], rewards=(1.0, 0.0))
    comp = group.samples[0].completion_ids.tolist()
    own = ["credit.settings.progress.alpha=0.5", "credit.settings.progress.samples=2"]
    cfg = _config(f"generation.max_tokens={len(comp) + 3}", *own)
    eos = qwen_tok.eos_token_id
    reward = lambda ids, gold, opened=False: float(sum(ids) % 2 == 0)  # depends on every token
    credit = resolve_credit(cfg)
    method = credit.method
    assert credit.settings == ProgressSettings(alpha=0.5, samples=2)
    out = redistribute_group(
        group,
        cfg,
        Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string),
        credit,
        sampler=HFContinuationSampler(qwen_model, temperature=0.0, eos_token_id=eos),
        reward_fn=reward,
    )
    w = out.samples[0]
    prompt = group.prompt_ids.tolist()
    budget = cfg.generation.max_tokens
    conts = [hf_greedy(qwen_model, prompt + comp[:e], budget - e, eos) for e in w.exit_points.tolist()]
    expected = [reward(comp[:e] + c, "") for e, c in zip(w.exit_points.tolist(), conts)]
    assert len(w.exit_points) >= 3 and w.exit_values.tolist() == expected
    assert w.segment_rewards.tolist() == np.diff(expected).tolist() and np.any(w.segment_rewards != 0)
    assert w.exit_stderr.tolist() == [0.0] * len(expected) and w.values_version == -1
    h = score_trace(qwen_model, prompt, comp, 64).entropy.double().numpy()
    sigma, _ = progress_sigma(h, w.exit_points, np.diff(expected), w.advantage, 0.5)
    np.testing.assert_allclose(w.sigma, sigma, rtol=1e-5)
    assert w.credit_method == "progress" and method.return_equivalent and method.needs_sampler


def test_alpha_zero_is_the_entropy_method(qwen_tok, qwen_model) -> None:
    cfg = _config("credit.settings.progress.alpha=0")
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    group = make_group(qwen_tok)
    sampler = HFContinuationSampler(qwen_model, temperature=1.0, eos_token_id=qwen_tok.eos_token_id)
    ours = redistribute_group(group, cfg, scorer, sampler=sampler, reward_fn=lambda ids, g, opened=False: 1.0)
    entropy_cfg = dataclasses.replace(cfg, credit=dataclasses.replace(cfg.credit, method="entropy"))
    entropy = redistribute_group(group, entropy_cfg, scorer)
    for a, b in zip(ours.samples, entropy.samples):
        np.testing.assert_array_equal(a.sigma, b.sigma)
        assert len(a.exit_values) == len(a.exit_points) > 1


def test_settings_are_validated() -> None:
    assert resolve_credit(_config()).settings == ProgressSettings(1.0, "initial", 4)
    for key, bad in (("alpha", "-0.5"), ("samples", "0")):
        with pytest.raises(ConfigError, match=rf"credit.settings.progress.{key} = {bad} .*expected"):
            _config(f"credit.settings.progress.{key}={bad}")
    with pytest.raises(ConfigError, match="credit.settings.progress.beta"):
        _config("credit.settings.progress.beta=1")
    cfg = _config("credit.settings.progress.prover=policy", "credit.settings.progress.alpha=2.5")
    assert cfg.credit.settings["progress"]["alpha"] == 2.5


def test_transformers_prover(qwen_tok) -> None:
    """Without an engine: ``initial`` is the scorer's model while the scorer is the reference, a
    separate frozen copy of model.path when the scorer follows the policy, and a path loads that model."""
    cfg = _config()
    scorer = build_scorer(cfg)
    assert scorer_sampler(scorer, cfg, "red0", "initial").model is scorer.model
    cfg.credit.scorer.model = "policy"
    frozen = scorer_sampler(scorer, cfg, "red0", "initial")
    assert frozen.model is not scorer.model and frozen.version == 0
    for name, t in scorer.model.state_dict().items():
        assert torch.equal(frozen.model.state_dict()[name], t)
    other = scorer_sampler(scorer, cfg, "red0", "tiny-qwen3")
    assert not torch.equal(other.model.lm_head.weight, scorer.model.lm_head.weight)
    assert scorer_sampler(scorer, cfg, "red0").model is scorer.model
