"""Packing: budget planning, sample isolation, packed == padded (loss and gradients)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.learner.logprobs import token_logprobs
from rredcot.learner.loss import LossSettings, policy_loss, sample_coefficients
from rredcot.learner.packing import (
    BudgetError,
    TrainSample,
    collate,
    micro_batches,
    plan_micro_batches,
)


def test_plan_respects_budget_and_covers_every_sample(make_samples):
    samples = make_samples(30, lengths=[int(x) for x in np.random.default_rng(1).integers(1, 90, 30)])
    cells = {}
    for layout in ("packed", "padded"):
        bins = plan_micro_batches(samples, 100, layout)
        assert sorted(i for b in bins for i in b) == list(range(30))
        mbs = [collate([samples[i] for i in b], layout) for b in bins]
        assert all(mb.input_ids.numel() <= 100 for mb in mbs)  # tensor cells within the budget
        cells[layout] = sum(mb.input_ids.numel() for mb in mbs)
    assert cells["packed"] == sum(s.length for s in samples)  # packed rows carry no padding
    assert cells["packed"] < cells["padded"]
    padded = plan_micro_batches(samples, 100, "padded")
    assert [i for b in padded for i in b] == list(range(30))  # padded keeps the samples' order


def test_too_long_sample_names_the_budget(make_samples):
    samples = make_samples(2, lengths=[10, 60])
    with pytest.raises(BudgetError, match=r"learner\.micro_token_budget=50"):
        plan_micro_batches(samples, 50)


def test_packed_attention_never_crosses_samples(make_model, make_samples):
    """Each sample's log-probs in a packed row equal those of the sample alone."""
    model = make_model().eval()
    samples = make_samples(4, lengths=[3, 30, 7, 12])
    with torch.no_grad():
        packed = token_logprobs(model, collate(samples, "packed"))
        alone = torch.cat([token_logprobs(model, collate([s], "packed")) for s in samples])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)
    # the check can fail: the same row attended as ONE sequence (no sample bounds) differs
    mb = collate(samples, "packed")
    mb.sample_bounds = None
    with torch.no_grad():
        assert (token_logprobs(model, mb) - alone).abs().max() > 1e-3


@pytest.mark.parametrize("chunk", [0, 16])
def test_packed_equals_padded_loss_and_grads(make_model, make_samples, chunk):
    samples = make_samples(7, lengths=[2, 150, 5, 40, 1, 90, 11])
    settings = LossSettings()
    results = []
    for layout in ("packed", "padded"):
        model = make_model()
        total = torch.zeros(())
        for mb in micro_batches(samples, 200, layout):
            loss, _ = policy_loss(
                token_logprobs(model, mb, chunk), mb, 0, sample_coefficients(mb, "sample", len(samples)), settings
            )
            loss.backward()
            total += loss.detach()
        results.append((total, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp, gp), (lq, gq) = results
    torch.testing.assert_close(lp, lq, atol=1e-5, rtol=0)
    for name in gp:
        torch.testing.assert_close(gp[name], gq[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(("chunk", "temperature"), [(0, 1.0), (7, 0.6)])
def test_logprobs_match_full_forward_at_temperature(make_model, make_samples, chunk, temperature):
    """Head-only-at-targets (chunked) log-probs == log_softmax(full logits / T) of a plain forward."""
    model = make_model().eval()
    sample = make_samples(1, lengths=[20])[0]
    ids = torch.from_numpy(np.concatenate([sample.prompt_ids, sample.completion_ids])).long()[None]
    with torch.no_grad():
        full = torch.log_softmax(model(ids).logits[0, :-1] / temperature, -1)
        expected = full[len(sample.prompt_ids) - 1 :].gather(-1, ids[0, len(sample.prompt_ids) :, None])[:, 0]
        got = token_logprobs(model, collate([sample]), chunk, temperature)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _grouped(make_samples, sizes: list[int], prompt_len: int) -> list:
    """Samples in groups that share one prompt each (as a GRPO group does)."""
    import dataclasses

    rng = np.random.default_rng(7)
    samples = make_samples(sum(sizes), lengths=[int(x) for x in rng.integers(1, 30, sum(sizes))])
    out, i = [], 0
    for g, size in enumerate(sizes):
        prompt = rng.integers(1, 900, prompt_len + g).astype(np.int32)
        out += [dataclasses.replace(s, prompt_ids=prompt) for s in samples[i : i + size]]
        i += size
    return out


@pytest.mark.parametrize("budget", [400, 90])  # 90 forces a group to be split over several units
def test_shared_prompt_layout_equals_packed_and_computes_each_prompt_once(make_model, make_samples, budget):
    samples = _grouped(make_samples, [5, 1, 3], prompt_len=40)
    results = []
    for layout in ("packed", "shared"):
        model = make_model()
        total, tokens = torch.zeros(()), 0
        for mb in micro_batches(samples, budget, layout):
            loss, _ = policy_loss(
                token_logprobs(model, mb, 5), mb, 0, sample_coefficients(mb, "sample", len(samples)), LossSettings()
            )
            loss.backward()
            total += loss.detach()
            tokens += mb.n_tokens
        results.append((total, {n: p.grad.clone() for n, p in model.named_parameters()}, tokens))
    (lp, gp, tp), (ls, gs, ts) = results
    torch.testing.assert_close(lp, ls, atol=1e-5, rtol=0)
    for name in gp:
        torch.testing.assert_close(gp[name], gs[name], atol=1e-5, rtol=1e-4, msg=name)
    assert ts < tp  # prompts are forwarded once per unit, not once per sample
    if budget == 400:
        assert ts == sum(len(s.completion_ids) for s in samples) + 40 + 41 + 42


def test_shared_plan_keeps_units_within_budget(make_samples):
    samples = _grouped(make_samples, [6, 4], prompt_len=30)
    for row in plan_micro_batches(samples, 80, "shared"):
        mb = collate([samples[i] for i in row], "shared")
        assert mb.n_tokens <= 80 and mb.attention_mask.shape[-1] == mb.n_tokens
    covered = sorted(i for row in plan_micro_batches(samples, 80, "shared") for i in row)
    assert covered == list(range(len(samples)))


def test_shared_row_attends_per_unit_and_equals_the_whole_row_mask(make_model, make_samples):
    """The shared row's mask is block-diagonal over units: attention per unit (bounds) gives the same
    log-probs as sdpa over the whole row with its width² mask, and the bounds are the units' edges."""
    samples = _grouped(make_samples, [3, 2], prompt_len=12)
    mb = collate(samples, "shared")
    units = [12 + sum(len(s.completion_ids) for s in samples[:3]), 13 + sum(len(s.completion_ids) for s in samples[3:])]
    assert mb.sample_bounds == (0, units[0], units[0] + units[1])
    mask = mb.attention_mask[0, 0]
    assert not mask[units[0] :, : units[0]].any() and not mask[: units[0], units[0] :].any()
    model = make_model()
    per_unit = token_logprobs(model, mb)
    mb.sample_bounds = None  # the whole row at once, with the full mask
    torch.testing.assert_close(per_unit, token_logprobs(model, mb), atol=1e-5, rtol=0)


def _sample(i: int, prompt: np.ndarray, length: int, rng: np.random.Generator) -> TrainSample:
    sigma = rng.random(length).astype(np.float32) + 0.01
    return TrainSample(
        f"s{i:03d}",
        prompt,
        rng.integers(1, 500, length).astype(np.int32),
        rng.normal(-3, 1, length).astype(np.float32),
        sigma / sigma.sum(),
        rng.integers(0, 3, length).astype(np.int32),
        float(rng.normal()),
    )


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    prompts=st.integers(1, 3),
    slack=st.integers(0, 60),
    layout=st.sampled_from(["packed", "padded", "shared"]),
    seed=st.integers(0, 2**16),
)
def test_plans_and_rows_hold_for_any_batch(lengths, prompts, slack, layout, seed):
    """Any batch, any budget that fits its longest sample: the plan covers each sample once, is the
    same every time, and keeps every micro-batch within the budget; in the rows, each completion
    token's target sits right after the position that predicts it (packed, padded), positions restart
    at every sample, and the per-token σ, versions and advantages are the sample's own."""
    rng = np.random.default_rng(seed)
    shared = [rng.integers(1, 500, int(rng.integers(1, 8))).astype(np.int32) for _ in range(prompts)]
    samples = [_sample(i, shared[i % prompts], n, rng) for i, n in enumerate(lengths)]
    budget = max(s.length for s in samples) + slack
    plan = plan_micro_batches(samples, budget, layout)
    assert plan == plan_micro_batches(samples, budget, layout)
    assert sorted(i for row in plan for i in row) == list(range(len(samples)))
    for row in plan:
        members = [samples[i] for i in row]
        mb = collate(members, layout)
        assert (mb.n_tokens if layout == "shared" else mb.input_ids.numel()) <= budget
        per_sample = [np.flatnonzero(mb.sample_of_token.numpy() == j) for j in range(len(members))]
        for s, tokens in zip(members, per_sample, strict=True):
            assert mb.targets[tokens].tolist() == s.completion_ids.tolist()
            np.testing.assert_array_equal(mb.sigma[tokens].numpy(), s.sigma)
            assert mb.versions[tokens].tolist() == s.versions.tolist()
            assert set(mb.advantages[tokens].tolist()) == {np.float32(s.advantage)}
        if layout != "shared":
            assert torch.equal(mb.input_ids.view(-1)[mb.token_index + 1], mb.targets)
        if layout == "packed":
            starts = mb.sample_bounds[:-1]
            assert all(mb.position_ids[0, b] == 0 for b in starts) and len(starts) == len(members)
