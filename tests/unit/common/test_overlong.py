"""Overlong handling (DAPO): the penalty's ramp by hand, and a truncated sample kept in the baseline
but out of the gradient."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rredcot.common.config import ConfigError, load_config
from rredcot.common.overlong import overlong_penalty, overlong_window, penalize
from rredcot.redistributor.credit import group_advantages, redistribute_group
from tests.factories import rollout_group


def test_the_penalty_ramps_over_the_last_window_of_the_budget():
    # max_tokens 100, window 20: nothing up to 80, then -1/20 a token, -1 at 100 and beyond
    assert [overlong_penalty(n, 100, 20) for n in (10, 80, 81, 90, 99, 100, 130)] == [
        0.0,
        0.0,
        -0.05,
        -0.5,
        pytest.approx(-0.95),
        -1.0,
        -1.0,
    ]


def test_the_window_defaults_to_a_quarter_of_the_budget_and_must_fit_in_it():
    assert overlong_window(load_config("tests", ["generation.max_tokens=64"])) == 16
    assert overlong_window(load_config("tests", ["generation.max_tokens=64", "generation.overlong_window=8"])) == 8
    with pytest.raises(ConfigError, match="generation.overlong_window = 64 is not allowed; expected < generation.max"):
        load_config("tests", ["generation.max_tokens=64", "generation.overlong_window=64"])
    with pytest.raises(ConfigError, match="generation.overlong = 'drop' is not allowed"):
        load_config("tests", ["generation.overlong=drop"])


def test_penalize_adds_the_penalty_to_each_reward():
    group = rollout_group(g=3, length=30)  # rewards 0, 1, 0
    group.samples[1].completion_ids = group.samples[1].completion_ids[:10]
    assert penalize(group.samples, max_tokens=32, window=8) == [pytest.approx(-0.75), 0.0, pytest.approx(-0.75)]
    assert [s.reward for s in group.samples] == [pytest.approx(-0.75), 1.0, pytest.approx(-0.75)]


def test_a_filtered_truncated_sample_counts_in_the_baseline_but_gets_no_advantage():
    group = rollout_group(g=4, length=16)  # rewards 0, 1, 0, 1
    group.samples = [
        dataclasses.replace(s, finish_reason="length") if i == 3 else s for i, s in enumerate(group.samples)
    ]
    baseline = group_advantages([0.0, 1.0, 0.0, 1.0], std_norm=True)
    plain = [s.advantage for s in redistribute_group(group, load_config("tests", ["credit.method=grpo"])).samples]
    cfg = load_config("tests", ["credit.method=grpo", "generation.overlong=filter"])
    filtered = [s.advantage for s in redistribute_group(group, cfg).samples]
    np.testing.assert_allclose(plain, baseline)
    np.testing.assert_allclose(filtered, [*baseline[:3], 0.0])  # the others' advantages are unchanged
