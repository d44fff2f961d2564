"""The study's signed segment credit of a σ method, by hand; its MC at a terminal answer part; its
RREDCoT rows equal the configured runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rredcot.common.config import Config, ScorerConfig
from rredcot.common.sampling import ContinuationRequest, seed_of
from rredcot.launch.study.credit import MC, constructs, rredcot_variants, segment_credit, study_group
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.credit import redistribute_group
from rredcot.redistributor.methods import RredcotSettings
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.value_credit import outcome_mc_values
from tests.unit.redistributor.cases import TRACES, credit_config, make_group


def test_segment_credit_by_hand() -> None:
    """σ over 6 tokens, exits [0, 2, 5] (the answer token 5 outside every segment): the segments
    hold 0.1 + 0.2 and 0.3 + 0.1 + 0.1; A < 0 flips the sign."""
    sigma = np.array([0.1, 0.2, 0.3, 0.1, 0.1, 0.2], dtype=np.float32)
    np.testing.assert_allclose(segment_credit(sigma, np.array([0, 2, 5]), 1.5), [0.3, 0.5], rtol=1e-6)
    np.testing.assert_allclose(segment_credit(sigma, np.array([0, 2, 5]), -0.5), [-0.3, -0.5], rtol=1e-6)
    assert segment_credit(sigma, np.array([3]), 1.0).size == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 60), st.data())
def test_segment_credit_sums_the_segments(n, data) -> None:
    sigma = np.full(n, 1.0 / n)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=8))))
    exits = np.array(cuts)
    out = segment_credit(sigma, exits, 1.0)
    assert out.shape == (len(exits) - 1,)
    np.testing.assert_allclose(out.sum(), (exits[-1] - exits[0]) / n, atol=1e-9)


class Scripted:
    """A continuation sampler that records its requests and answers every one with M copies of [7]."""

    version = 0

    def __init__(self) -> None:
        self.requests: list[ContinuationRequest] = []
        self.generated_tokens = 0

    def sync(self) -> bool:
        return False

    def sample(self, requests: Sequence[ContinuationRequest]) -> list[list[list[int]]]:
        self.requests += requests
        self.generated_tokens += sum(r.m for r in requests)
        return [[[7]] * r.m for r in requests]


def test_terminal_mc_never_continues_a_finished_completion(qwen_tok) -> None:
    """``answer_part=terminal``: RREDCoT's last exit is the end L of a completion that ended in EOS.
    MC asks for M = 2 continuations at every exit before it, within max_tokens − e, and none at L
    (the old study asked at L, a prefix ending in EOS); every sampled continuation scores 0.5, and L
    takes the sample's outcome R (1 and 0 here) exactly: rewards [R, R], standard error 0. RREDCoT's
    rows (one per value construct) are in the run's prob space, and R ends their values too."""
    cfg = Config()
    cfg.generation.max_tokens = 64
    segmentation = {"segments": 2, "min_segment_tokens": 1}
    cfg.credit = credit_config(segmentation=segmentation, answer_part="terminal", value_space="prob")
    group = make_group(qwen_tok, [t + "<|im_end|>" for t in TRACES[:2]], rewards=(1.0, 0.0))
    scorer = Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, cfg.credit.scorer.exit_string)
    sampler = Scripted()
    traces = study_group(group, cfg, scorer, sampler, lambda ids, gold, opened=False: 0.5, 2)
    prompt = group.prompt_ids.tolist()
    assert len(traces) == 2
    for t in traces:
        s = group.samples[t.sample_index]
        full = [*prompt, *s.completion_ids.tolist()]
        mc_asked = [
            (len(r.prefix) - len(prompt), r.max_tokens)
            for r in sampler.requests
            if r.prefix == full[: len(r.prefix)] and r.seed == seed_of(s.id, len(r.prefix) - len(prompt))
        ]
        scored = t.exits[:-1].tolist()
        assert t.exits[-1] == t.length == len(full) - len(prompt)
        assert mc_asked == [(e, 64 - e) for e in scored]
        assert t.values[MC].tolist() == [0.5] * len(scored) + [s.reward]
        assert t.mc_rewards.tolist() == [[0.5, 0.5]] * len(scored) + [[s.reward] * 2]
        assert t.mc_stderr.tolist() == [0.0] * len(t.exits)
        assert t.cost[MC].tokens == 2 * len(scored)  # one token per continuation, none at L
        assert t.values.keys() - {MC} == {"rredcot:solution", "rredcot:answer", "rredcot:suffix", "rredcot:suffix:w2"}
        assert all(t.values[f"rredcot:{c}"][-1] == s.reward for c in ("solution", "answer", "suffix"))
    assert not any(r.prefix[-1] == qwen_tok.convert_tokens_to_ids("<|im_end|>") for r in sampler.requests)


def test_outcome_mc_values_take_the_end_once_whether_or_not_the_exits_hold_it(qwen_tok) -> None:
    """``answer_part=terminal``: exits without L (the ``mc`` method's) gain L valued R; exits already
    ending at L (the study's, or a truncated completion's) keep one L, which MC never continues."""
    cfg = Config()
    cfg.generation.max_tokens = 64
    s = make_group(qwen_tok, TRACES[:1], rewards=(1.0,)).samples[0]
    n = len(s.completion_ids)
    for exits in ([0, 3], [0, 3, n]):
        sampler = Scripted()
        got, est = outcome_mc_values(
            sampler,
            lambda ids, gold, opened=False: 0.5,
            [1, 2],
            s,
            np.array(exits, np.int32),
            2,
            cfg,
            "4",
            s.id,
            False,
            True,  # answer_part=terminal
        )
        assert got.tolist() == [0, 3, n] and est.values.tolist() == [0.5, 0.5, 1.0]
        assert [len(r.prefix) - 2 for r in sampler.requests] == [0, 3]  # nothing asked at L


def test_rredcot_variants_equal_the_configured_runs(qwen_tok) -> None:
    """A construct with the group baseline as the study and the slip benchmark take it (the baseline
    re-weighing the stored exit values of the plain run) equals a run configured that way."""
    group = make_group(qwen_tok)
    scorer = Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, ScorerConfig().exit_string)
    cfg = Config()
    cfg.credit = credit_config(segmentation={"segments": 3, "min_segment_tokens": 1})
    variants = rredcot_variants(group, cfg, scorer, windows=(1,))
    rows = {"solution", "answer", "suffix", "suffix:w1"}
    assert set(variants) == rows | {f"{r}+group" for r in rows}
    for name, (credits, cost) in variants.items():
        row, _, baseline = name.partition("+")
        construct, _, window = row.partition(":w")
        configured = Config()
        configured.credit = credit_config(
            segmentation={"segments": 3, "min_segment_tokens": 1},
            reference=construct,
            baseline=baseline or "none",
            suffix_window=int(window or 0),
        )
        expected = redistribute_group(group, configured, scorer).samples
        for got, want in zip(credits, expected, strict=True):
            # the re-weighed values were stored in float32 (values near −25: steps of 2e-6)
            np.testing.assert_allclose(got.sigma, want.sigma, atol=1e-5)
            np.testing.assert_allclose(got.segment_rewards, want.segment_rewards, atol=1e-4)
        assert cost.tokens > 0


def test_constructs_score_the_suffix_at_the_run_window_and_each_study_window() -> None:
    """Every construct at the run's window, the suffix at each asked window too, named ``suffix:wW``
    (``suffix`` is every start)."""
    every = RredcotSettings()
    assert constructs(every) == {
        "solution": {"reference": "solution"},
        "answer": {"reference": "answer"},
        "suffix": {"reference": "suffix", "suffix_window": 0},
    }
    windowed = dataclasses.replace(every, suffix_window=3)
    assert list(constructs(windowed, (0, 2))) == ["solution", "answer", "suffix", "suffix:w2", "suffix:w3"]
    assert constructs(windowed, (0, 2))["suffix:w3"] == {"reference": "suffix", "suffix_window": 3}
