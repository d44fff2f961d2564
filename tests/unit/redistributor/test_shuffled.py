"""``shuffled``: RREDCoT's own segment masses, permuted per sample, against ``rredcot`` on the same
group; its settings (rredcot's block) and config checks; Σσ = 1 as a property."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.common.config import Config, ConfigError, CreditConfig, SegmentationConfig, load_config, resolve_credit
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.methods import RredcotSettings
from rredcot.redistributor.registry import CreditContext
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.shuffled import permuted
from rredcot.redistributor.sigma import segment_masses, token_sigma
from rredcot.redistributor.value_credit import credit_from_values
from tests.factories import rollout, rollout_group
from tests.unit.redistributor.cases import make_group


def test_a_samples_permutation_is_fixed_by_its_id() -> None:
    masses = np.array([0.0, 0.5, 2.0, 0.0, 1.5, 3.0])
    samples = [rollout("g", i) for i in range(20)]
    for i, s in enumerate(samples):
        s.id = f"sample-{i}"
    orders = [permuted(s, masses) for s in samples]
    assert all(sorted(o) == sorted(masses) for o in orders)  # the same masses
    assert len({tuple(o) for o in orders}) > 10  # in each sample's own order
    again = rollout("h", 3)
    again.id = "sample-0"
    assert np.array_equal(permuted(again, masses), orders[0])  # fixed by the id alone


def test_shuffled_spreads_rredcots_masses_in_the_samples_order(qwen_tok, qwen_model) -> None:
    """The same exits and segment rewards as ``rredcot`` (from ``credit.settings.rredcot``), and σ
    from those rewards' masses put in ``permuted``'s order: the multiset of segment masses is kept,
    their places are not."""
    group = make_group(qwen_tok)
    for i, s in enumerate(group.samples):
        s.id = f"sample-{i}"  # fixed ids: a fixed permutation
    block = {"uniform_mix": 0.2, "baseline": "none"}
    outs = {}
    for method in ("rredcot", "shuffled", "shuffled"):
        cfg = Config()
        segmentation = SegmentationConfig(segments=4, min_segment_tokens=1)
        cfg.credit = CreditConfig(method=method, segmentation=segmentation, settings={"rredcot": block})
        out = redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))
        assert method not in outs or all(np.array_equal(a.sigma, b.sigma) for a, b in zip(outs[method], out.samples))
        outs[method] = out.samples
    moved = 0
    for s, own, mixed in zip(group.samples, outs["rredcot"], outs["shuffled"], strict=True):
        assert mixed.credit_method == "shuffled"
        np.testing.assert_array_equal(own.exit_points, mixed.exit_points)
        np.testing.assert_array_equal(own.segment_rewards, mixed.segment_rewards)  # the rewards stay the sample's
        masses = segment_masses(own.segment_rewards.astype(np.float64), own.advantage, "relu")
        n = len(own.sigma)
        np.testing.assert_allclose(own.sigma, token_sigma(n, own.exit_points, masses, 0.2), atol=1e-6)
        np.testing.assert_allclose(mixed.sigma, token_sigma(n, own.exit_points, permuted(s, masses), 0.2), atol=1e-6)
        moved += not np.allclose(own.sigma, mixed.sigma)
    assert moved  # some sample's blame or credit went elsewhere


def above_floor(sigma: np.ndarray, exits: np.ndarray, lam: float) -> list[float]:
    """Each segment's σ less its floor λ·|seg|/|o|, sorted."""
    c = np.concatenate([[0.0], np.cumsum(sigma, dtype=np.float64)])
    return sorted(c[exits[1:]] - c[exits[:-1]] - lam * np.diff(exits) / len(sigma))


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    sign=st.sampled_from(["relu", "abs", "softmax"]),
    lam=st.floats(0, 1),
    baseline=st.sampled_from(["none", "group"]),
)
def test_sigma_sums_to_one_and_keeps_the_segment_masses(data, sign, lam, baseline) -> None:
    """For any exit values: Σσ = 1, σ ≥ 0, and each segment's σ above the floor λ·|seg|/|o| is one of
    ``rredcot``'s on the same values (the same multiset per sample)."""
    group = rollout_group(g=3, length=data.draw(st.integers(1, 40), label="length"))
    n = len(group.samples[0].completion_ids)
    found = []
    for _ in group.samples:
        exits = sorted(set(data.draw(st.lists(st.integers(0, n), min_size=1, max_size=8), label="exits")))
        values = data.draw(st.lists(st.floats(-20, 20), min_size=len(exits), max_size=len(exits)), label="values")
        found.append((np.array(exits, np.int32), np.array(values), None))
    advantages = np.array(data.draw(st.lists(st.floats(-2, 2), min_size=3, max_size=3), label="advantages"))
    own = RredcotSettings(sign=sign, uniform_mix=lam, baseline=baseline)
    ctx = CreditContext(group, advantages, Config(), settings=own)
    for exits, plain, mixed in zip(
        (f[0] for f in found), credit_from_values(ctx, found), credit_from_values(ctx, found, permuted), strict=True
    ):
        assert mixed.sigma.shape == (n,) and np.all(mixed.sigma >= 0)
        assert abs(float(mixed.sigma.sum(dtype=np.float64)) - 1) < 1e-5

        np.testing.assert_allclose(
            above_floor(mixed.sigma, exits, lam), above_floor(plain.sigma, exits, lam), atol=1e-5
        )


def test_shuffled_takes_rredcots_settings_and_rules() -> None:
    """A user comparing ``rredcot`` and ``shuffled`` arms sets RREDCoT's keys once: shuffled reads
    ``credit.settings.rredcot`` (an arm's ``rredcot@`` and ``shuffled@`` overrides alike) and has no
    block of its own."""
    spec = resolve_credit(load_config("tests", ["credit.method=shuffled", "credit.settings.rredcot.uniform_mix=0.7"]))
    assert spec.settings_key == "credit.settings.rredcot" and spec.settings.uniform_mix == 0.7
    assert spec.method.needs_scorer and spec.method.return_equivalent
    with pytest.raises(ConfigError, match="credit.settings.shuffled is not allowed: credit method 'shuffled' takes"):
        load_config("tests", ["credit.method=grpo", "credit.settings.shuffled.uniform_mix=0.7"])
    with pytest.raises(ConfigError, match="credit.settings.rredcot.value_space = 'log' is not allowed"):
        load_config("tests", ["credit.method=shuffled", "credit.settings.rredcot.answer_part=terminal"])


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["credit.segmentation.segments=1"], "credit.segmentation.segments = 1 is not allowed; expected >= 2"),
        (["credit.segmentation.min_segment_tokens=13"], "credit.segmentation.min_segment_tokens = 13 is not allowed"),
    ],
)
def test_a_segmentation_of_at_most_one_segment_is_refused(overrides, fragment) -> None:
    """One segment leaves nothing to permute: K = 1, or a minimum length that two segments of a
    ``generation.max_tokens`` completion (24 here) cannot both hold; allowed when no step enforces
    them (no merging, no homogenising: every keyword piece is a segment)."""
    with pytest.raises(ConfigError, match=fragment):
        load_config("tests", ["credit.method=shuffled", *overrides])
    load_config("tests", ["credit.method=rredcot", *overrides])
    off = ["credit.segmentation.merge=false", "credit.segmentation.homogenise=false"]
    load_config("tests", ["credit.method=shuffled", *overrides, *off])
    load_config("tests", ["credit.method=shuffled", "credit.segmentation.min_segment_tokens=12"])
