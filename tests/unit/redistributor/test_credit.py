"""Credit methods through the registry on real tiny models and the real Qwen3 tokenizer."""

from __future__ import annotations

import math
import weakref
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rredcot.common.config import (
    Config,
    ConfigError,
    CreditConfig,
    ScorerConfig,
    SegmentationConfig,
    load_config,
    resolve_credit,
)
from rredcot.common.records import RecordError
from rredcot.learner.loss import sample_coefficients
from rredcot.learner.packing import collate, samples_from_group
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.credit import (
    budget_batches,
    group_advantages,
    redistribute_group,
    top_entropy_sigma,
)
from rredcot.redistributor.entropy import score_trace
from rredcot.redistributor.registry import CREDIT_METHODS
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.values import forward_overhead_cells
from tests.factories import rollout, rollout_group
from tests.unit.redistributor.cases import make_group
from tests.unit.redistributor.test_sigma import reference_masses, reference_sigma


def test_group_advantages_by_hand() -> None:
    np.testing.assert_allclose(group_advantages([1, 0, 0, 1], True), [1, -1, -1, 1], atol=1e-5)
    np.testing.assert_allclose(group_advantages([1, 0, 0, 1], False), [0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(group_advantages([1, 1, 1], True), [0, 0, 0])


def test_budget_batches_by_hand() -> None:
    # ascending length; a batch grows while rows x its longest row stays within the budget
    assert budget_batches([50, 10, 30, 20], 60) == [[1, 3], [2], [0]]  # 2x20 <= 60, 3x30 > 60, 2x50 > 60
    assert budget_batches([50, 10, 30, 20], 1000) == [[1, 3, 2, 0]]
    assert budget_batches([500], 10) == [[0]]  # a row longer than the budget still goes alone
    assert budget_batches([], 10) == []


@pytest.mark.parametrize(("method", "agg"), [("bnpo", "token"), ("drgrpo", "sample")])
def test_bnpo_and_drgrpo_weigh_tokens_as_their_papers_define(method, agg) -> None:
    """Through the learner's aggregation: BNPO weighs every token of the batch 1/N_tokens, Dr. GRPO
    every token 1/(N_samples · max_tokens), whatever the completion lengths."""
    overrides = [f"credit.method={method}", f"learner.loss_agg={agg}", "credit.advantage_std_norm=false"]
    cfg = load_config("tests", overrides)
    lengths = [[5, 9, 14, 20], [3, 7]]
    groups = [rollout_group(g=len(ls), seed=i) for i, ls in enumerate(lengths)]
    for group, ls in zip(groups, lengths):
        group.samples = [rollout(group.group_id, j, n, seed=j, reward=float(j % 2)) for j, n in enumerate(ls)]
    samples = [t for group in groups for t in samples_from_group(redistribute_group(group, cfg))]
    mb = collate(samples)
    n_tokens, n_samples = sum(map(sum, lengths)), len(samples)
    coef = sample_coefficients(mb, agg, n_tokens if agg == "token" else n_samples)
    per_token = (coef[mb.sample_of_token] * mb.sigma).double()
    expected = 1 / n_tokens if method == "bnpo" else 1 / (n_samples * cfg.generation.max_tokens)
    torch.testing.assert_close(per_token, torch.full_like(per_token, expected), rtol=1e-6, atol=0)
    adv = [s.advantage for s in samples[:4]]
    assert adv == pytest.approx([-0.5, 0.5, -0.5, 0.5])  # R - mean(R), not divided by the std


@pytest.mark.parametrize("method", ["rredcot", "entropy"])
def test_scorer_batching_does_not_change_credit(qwen_tok, qwen_model, method) -> None:
    group = make_group(qwen_tok)
    outs = []
    for budget in (64, 8192):  # one sample per batch (chunked forwards) vs the whole group at once
        cfg = Config()
        cfg.credit = CreditConfig(
            method=method,
            segmentation=SegmentationConfig(segments=3),
            scorer=ScorerConfig(token_budget=budget),
            settings={"rredcot": {"uniform_mix": 0.2}},
        )
        outs.append(redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)))
    for a, b in zip(*(o.samples for o in outs)):
        np.testing.assert_allclose(a.sigma, b.sigma, atol=1e-6)
        np.testing.assert_allclose(a.exit_values, b.exit_values, atol=1e-4)
        assert a.exit_points.tolist() == b.exit_points.tolist()


def test_uniform_methods_by_hand(qwen_tok) -> None:
    cfg = Config()
    group = make_group(qwen_tok)
    lens = [len(s.completion_ids) for s in group.samples]
    for method, expect in [
        ("grpo", [1 / n for n in lens]),
        ("bnpo", [1 / n for n in lens]),  # the batch token mean is the learner's loss_agg=token
        ("drgrpo", [1 / cfg.generation.max_tokens] * 4),
    ]:
        cfg.credit.method = method
        out = redistribute_group(group, cfg)
        for w, n, e in zip(out.samples, lens, expect):
            np.testing.assert_allclose(w.sigma, np.full(n, e, np.float32))
            assert w.credit_method == method
        out.validate()
    assert not CREDIT_METHODS.get("drgrpo").return_equivalent and CREDIT_METHODS.get("bnpo").return_equivalent


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    method=st.sampled_from(["rredcot", "entropy", "top_entropy", "grpo"]),
    sign=st.sampled_from(["relu", "abs", "softmax"]),
    lam=st.floats(0, 1),
    space=st.sampled_from(["log", "prob", "mean_token_prob"]),
    answer_part=st.sampled_from(["uniform", "terminal"]),
    k=st.integers(1, 6),
    group_refs=st.booleans(),
)
def test_return_equivalent_methods_sum_to_one(
    qwen_tok, qwen_model, method, sign, lam, space, answer_part, k, group_refs
) -> None:
    """Σσ = 1 and σ ≥ 0 for every return-equivalent method; grpo is 1/|o|; rredcot's σ is the formula
    (tokens outside the span 1/|o|, λ/|o| + (1 − λ)(S/|o|)·m_k/(|seg_k|·Σm) inside) applied to the
    segment rewards it recorded, so a dropped factor fails here although the sum is renormalised."""
    cfg = Config()
    rredcot = {
        "sign": sign,
        "uniform_mix": lam,
        "value_space": "prob" if answer_part == "terminal" and space == "log" else space,  # the config's rule
        "answer_part": answer_part,
        "group_refs": group_refs,
    }
    cfg.credit = CreditConfig(method=method, segmentation=SegmentationConfig(segments=k), settings={"rredcot": rredcot})
    out = redistribute_group(make_group(qwen_tok), cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))
    for w in out.samples:
        assert np.all(w.sigma >= 0) and abs(float(w.sigma.sum(dtype=np.float64)) - 1) < 1e-5
        n = len(w.sigma)
        if method == "grpo":
            np.testing.assert_allclose(w.sigma, 1 / n, rtol=1e-6)
        if method != "rredcot":
            continue
        exits = w.exit_points.tolist()
        assert len(exits) - 1 <= k + (answer_part == "terminal")
        # tokens outside the span keep 1/|o|; a segment's tokens share one σ
        np.testing.assert_allclose(w.sigma[[*range(exits[0]), *range(exits[-1], n)]], 1 / n, rtol=1e-5)
        for lo, hi in zip(exits[:-1], exits[1:]):
            np.testing.assert_allclose(w.sigma[lo:hi], w.sigma[lo], rtol=1e-6)
        own = resolve_credit(cfg).settings
        if own.value_space != "prob":  # prob rewards (differences of v̂ ≈ e^-167) are 0 in float32
            # σ from the recorded rewards through the formula written out in test_sigma (float64)
            rewards = w.segment_rewards.astype(np.float64).tolist()
            masses = reference_masses(rewards, w.advantage, sign, own.softmax_temperature)
            np.testing.assert_allclose(w.sigma, reference_sigma(n, exits, masses, lam), rtol=1e-5, atol=1e-9)


def test_a_batch_kv_cache_is_released_before_the_next_batch(qwen_tok, qwen_model) -> None:
    """The previous batch's KV cache (``TraceScores.cache``) stayed referenced while the next batch
    ran its forward: twice the peak KV memory (~19 GB each at the 25k config). Counted at each new
    trace cache's first forward (a branch's cache starts over a prefix, never empty)."""
    forward_overhead_cells(qwen_model)  # measured once per model on a trace of its own: not counted
    caches: list[weakref.ref] = []
    live: list[int] = []

    def count(module, args, kwargs) -> None:
        cache = kwargs["past_key_values"]
        if cache.get_seq_length() == 0:
            caches.append(weakref.ref(cache))
            live.append(sum(c() is not None for c in caches))

    cfg = Config()
    # one sample per batch
    cfg.credit = CreditConfig(segmentation=SegmentationConfig(segments=2), scorer=ScorerConfig(token_budget=64))
    hook = qwen_model.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    try:
        out = redistribute_group(make_group(qwen_tok), cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))
    finally:
        hook.remove()
    assert len(live) == 4 and live == [1, 1, 1, 1]
    assert all(w.exit_values.size for w in out.samples)  # the branches did read each batch's cache


def test_a_failed_allocation_in_the_entropy_pass_halves_the_token_budget(qwen_tok, qwen_model) -> None:
    """An out-of-memory error in the scorer's trace forward lost the whole group (a dead letter); the
    batch is redone with half the token budget, as the branches do, and the credit is unchanged."""
    cfg = Config()
    cfg.credit = CreditConfig(method="entropy", scorer=ScorerConfig(token_budget=4096))
    group = make_group(qwen_tok)
    expected = redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))

    def refuse_large(module, args, kwargs) -> None:  # the allocator refusing forwards of more than 40 tokens
        if kwargs["input_ids"].numel() > 40:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 19.00 GiB")

    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    hook = qwen_model.get_decoder().register_forward_pre_hook(refuse_large, with_kwargs=True)
    try:
        out = redistribute_group(group, cfg, scorer)
    finally:
        hook.remove()
    assert scorer.tokens.oom_retries == 7  # 4096 → 32: one row per forward of at most 32 tokens
    for a, b in zip(out.samples, expected.samples):
        np.testing.assert_allclose(a.sigma, b.sigma, atol=1e-6)


def test_token_ids_outside_the_scorers_vocabulary_are_the_records_fault(qwen_tok, qwen_model) -> None:
    """On CUDA an out-of-range embedding index is a device-side assert that breaks the process: the
    group is refused before any forward, as a ``RecordError`` (a dead letter)."""
    group = make_group(qwen_tok)
    group.samples[2].completion_ids[3] = qwen_model.config.vocab_size
    forwards = []
    hook = qwen_model.get_decoder().register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(RecordError, match=r"samples\[2\].completion_ids holds token id 151669, outside"):
            redistribute_group(group, Config(), Scorer(qwen_model, qwen_tok, ScorerConfig().exit_string))
    finally:
        hook.remove()
    assert not forwards


def test_degenerate_groups(qwen_tok, qwen_model) -> None:
    cfg = Config()
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    # no reference pair: no values, zero rewards, uniform σ
    out = redistribute_group(make_group(qwen_tok, refs=False), cfg, scorer)
    for w in out.samples:
        assert w.exit_values.size == 0 and not w.segment_rewards.any()
        np.testing.assert_allclose(w.sigma, 1 / len(w.sigma))
    # one-token and truncated (no closing tag, no answer) completions
    odd = make_group(
        qwen_tok,
        traces=["Yes", "<think>\nSo 12*7 is", "<think></think>84", "x"],
        rewards=(1.0, 0.0, 1.0, 0.0),
        finish="length",
    )
    out = redistribute_group(odd, cfg, scorer)
    one, trunc, empty_think = out.samples[0], out.samples[1], out.samples[2]
    assert one.exit_points.tolist() == [0, 1] and one.sigma.tolist() == [1.0]
    assert trunc.exit_points[-1] == len(trunc.sigma)  # thinking runs to the end
    np.testing.assert_allclose(empty_think.sigma, 1 / len(empty_think.sigma))  # no segment: uniform
    out.validate()
    # all rewards equal: A = 0, σ uniform
    before = (scorer.tokens.trace, scorer.tokens.branch)
    flat = redistribute_group(make_group(qwen_tok, rewards=(1.0, 1.0, 1.0, 1.0)), cfg, scorer)
    assert all(np.allclose(w.sigma, 1 / len(w.sigma)) and w.advantage == 0 for w in flat.samples)
    # all advantages 0: σ cannot change the loss, so the scorer did no work for this group
    assert (scorer.tokens.trace, scorer.tokens.branch) == before
    assert all(len(w.exit_points) == 0 for w in flat.samples)


def test_empty_completion_rejected_by_nothing(qwen_tok, qwen_model) -> None:
    """An empty completion (L = 0) gets an empty σ and no exit values, for every method."""
    cfg = Config()
    group = make_group(qwen_tok, traces=["", "84"], rewards=(0.0, 1.0))
    for method in ["grpo", "rredcot", "entropy", "top_entropy"]:
        cfg.credit.method = method
        w = redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)).samples[0]
        assert w.sigma.size == 0
        if method == "rredcot":
            assert w.exit_points.tolist() == [0] and w.segment_rewards.size == 0


def test_top_entropy_by_hand() -> None:
    """⌈f·L⌉ tokens of highest entropy share σ; NaN/inf count as 0; ties go to the earlier token;
    f is the decimal it prints as (0.07 of 100 is 7 tokens, though 0.07·100 > 7 in floating point)."""
    h = np.array([0.5, 2.0, 1.0, 2.0, 0.1, np.nan, np.inf], dtype=np.float32)
    third = np.float32(1 / 3)
    assert top_entropy_sigma(h, 0.4).tolist() == [0, third, third, third, 0, 0, 0]  # ⌈2.8⌉ = 3
    assert top_entropy_sigma(h, 0.25).tolist() == [0, 0.5, 0, 0.5, 0, 0, 0]  # ⌈1.75⌉ = 2: the tied pair
    assert top_entropy_sigma(h, 0.1).tolist() == [0, 1, 0, 0, 0, 0, 0]  # ⌈0.7⌉ = 1: the earlier of the tie
    assert np.count_nonzero(top_entropy_sigma(np.arange(100.0), 0.07)) == 7 and 0.07 * 100 > 7
    assert top_entropy_sigma(np.zeros(0), 0.2).size == 0


@settings(max_examples=200, deadline=None)
@given(
    h=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.5, float("nan")]) | st.floats(0, 10), min_size=1, max_size=60),
    fraction=st.floats(1e-6, 1.0),
)
def test_top_entropy_property(h, fraction) -> None:
    """Σσ = 1; exactly the smallest k with k/L ≥ f tokens hold it, equally; none left out has a higher
    entropy than one chosen, nor an equal one earlier."""
    sigma = top_entropy_sigma(np.array(h), fraction)
    n = len(h)
    k = next(k for k in range(1, n + 1) if Fraction(k, n) >= Fraction(repr(fraction)))
    chosen = np.flatnonzero(sigma)
    assert abs(float(sigma.sum(dtype=np.float64)) - 1) < 1e-6 and len(chosen) == k
    assert np.all(sigma[chosen] == sigma[chosen[0]])
    e = np.nan_to_num(np.array(h))
    for j in set(range(n)) - set(chosen.tolist()):
        assert all(e[j] < e[i] or (e[j] == e[i] and j > i) for i in chosen)


def test_top_entropy_through_the_registry(qwen_tok, qwen_model) -> None:
    """On the scorer's entropies (``score_trace``), with ``credit.settings.top_entropy.fraction``; the
    config refuses a fraction outside (0, 1]."""
    cfg = load_config("tests", ["credit.method=top_entropy", "credit.settings.top_entropy.fraction=0.3"])
    credit = resolve_credit(cfg)
    method = credit.method
    group = make_group(qwen_tok)
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    out = redistribute_group(group, cfg, scorer, credit)
    for w, s in zip(out.samples, group.samples):
        h = score_trace(qwen_model, group.prompt_ids.tolist(), s.completion_ids.tolist(), 64).entropy
        np.testing.assert_array_equal(w.sigma, top_entropy_sigma(h.double().numpy(), 0.3))
        assert np.count_nonzero(w.sigma) == math.ceil(0.3 * len(w.sigma) - 1e-9) and w.credit_method == "top_entropy"
    assert method.return_equivalent and method.needs_scorer
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match=r"top_entropy.fraction = .* expected a number in \(0.0, 1.0\]"):
            load_config("tests", ["credit.method=top_entropy", f"credit.settings.top_entropy.fraction={bad}"])


def test_scorer_weight_update(qwen_tok, qwen_model) -> None:
    other = build_tiny_model("qwen3", seed=9)
    scorer = Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, ScorerConfig().exit_string)
    before = score_trace(scorer.model, [1, 2], [3, 4], 8).logprob
    scorer.load_weights(other.state_dict(), version=5)
    after = score_trace(scorer.model, [1, 2], [3, 4], 8).logprob
    assert scorer.version == 5 and not np.allclose(before, after)
    np.testing.assert_allclose(after, score_trace(other, [1, 2], [3, 4], 8).logprob)


def test_a_group_takes_the_method_resolved_by_its_caller(monkeypatch) -> None:
    """The worker resolves ``credit.method`` once and hands it to every group: no group resolves it
    again (and one given the spec of another method runs that one, with its settings)."""
    from rredcot.redistributor import credit

    cfg = load_config("tests", ["credit.method=grpo"])
    spec = resolve_credit(load_config("tests", ["credit.method=tests.extensions.last_token"]))
    monkeypatch.setattr(credit, "resolve_credit", lambda cfg: pytest.fail("resolved again"))
    out = redistribute_group(rollout_group(g=2, length=4), cfg, credit=spec)
    assert [w.credit_method for w in out.samples] == ["last_token"] * 2
    assert out.samples[0].sigma.tolist() == [0, 0, 0, 1]
