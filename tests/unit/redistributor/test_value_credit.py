"""The value-based credit methods (``value_credit``): RREDCoT's constructs against brute-force
recomputation, exit points, the answer part, reference pairs, and MC credit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rredcot.common.config import Config, ScorerConfig
from rredcot.models.tiny import build_tiny_model
from rredcot.redistributor.credit import (
    redistribute_group,
)
from rredcot.redistributor.mc import HFContinuationSampler
from rredcot.redistributor.methods import RredcotSettings
from rredcot.redistributor.scorer import Scorer
from rredcot.redistributor.sigma import prob_rewards, segment_masses, token_sigma
from rredcot.redistributor.value_credit import answer_line_start, reference_pairs, scored_exits
from tests.unit.redistributor.cases import TRACES, credit_config, make_group


class RecordingSampler(HFContinuationSampler):
    """The real transformers sampler, remembering every prefix it was asked to continue."""

    prefixes: list[list[int]]

    def sample(self, requests):
        self.prefixes = getattr(self, "prefixes", []) + [r.prefix for r in requests]
        return super().sample(requests)


LAMBDA = RredcotSettings().uniform_mix  # the default floor of uniform weight (λ), in every σ below
REFERENCE = ("12*7 = 70 + 14.\n70 + 14 = 84.\n", "Answer: ", "84")  # u, the template, the answer


def credit_with_reference(tok, model, cfg: Config):
    """The cases' group with ``REFERENCE`` as its dataset reference, its scorer, and its credit under ``cfg``."""
    group = make_group(tok)
    enc = lambda t: np.array(tok(t, add_special_tokens=False)["input_ids"], dtype=np.int32)  # noqa: E731
    group.ref_solution_ids, group.ref_answer_ids = [enc(REFERENCE[0])], [enc(REFERENCE[1] + REFERENCE[2])]
    scorer = Scorer(model, tok, cfg.credit.scorer.exit_string)
    return group, scorer, redistribute_group(group, cfg, scorer)


def brute_log_value(
    model, tok, prefix: list[int], construct: str, exit_string: str, at: float = 0.0, window: int = 0
) -> float:
    """log v̂ after ``prefix`` (prompt ⊕ o[:e_t]) for ``REFERENCE``, written out from text: every
    branch tokenised part by part and forwarded whole, without the trace's cache, the anchors or the
    tail builder; log Σ_i share_i · p(scored tokens of branch i). ``window`` W > 0 (``suffix``): only
    the W line starts whose token offset ÷ |u| lies nearest ``at``, the earlier on a tie."""
    u, template, answer = REFERENCE
    lines = u.splitlines(keepends=True)
    starts = list(range(len(lines) + 1))
    if window:
        size = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        starts = sorted(sorted(starts, key=lambda j: (abs(size("".join(lines[:j])) / size(u) - at), j))[:window])

    def exit_after(text_ends_line: bool) -> str:
        return exit_string.lstrip("\n") if text_ends_line else exit_string

    after = tok.decode(prefix[-1:]).endswith("\n")
    if construct == "suffix":
        rests = ["".join(lines[j:]) for j in starts]
        branches = [[(r, True), (exit_after(r.endswith("\n") if r else after), False)] for r in rests]
    else:
        branches = [[(exit_after(after), False), (u if construct == "solution" else "", True)]]
    terms = []
    for parts in branches:
        ids, scored = list(prefix), []
        for text, is_scored in [*parts, (template, False), (answer, True)]:
            part = tok(text, add_special_tokens=False)["input_ids"] if text else []
            scored += [len(ids) + k for k in range(len(part))] if is_scored else []
            ids += part
        with torch.no_grad():  # each scored token's row alone: log-softmax is row by row
            rows = torch.tensor([p - 1 for p in scored])
            logp = model(torch.tensor([ids]), logits_to_keep=rows).logits[0].double().log_softmax(-1)
        terms.append(math.log(1 / len(branches)) + sum(float(logp[i, ids[p]]) for i, p in enumerate(scored)))
    return float(torch.logsumexp(torch.tensor(terms), 0))


@pytest.mark.parametrize(("construct", "window"), [("solution", 0), ("answer", 0), ("suffix", 0), ("suffix", 2)])
def test_each_construct_matches_a_brute_force_recomputation(qwen_tok, qwen_model, construct, window) -> None:
    """Exit values from the worker path (trace KV, anchors, tails, log-sum-exp) equal the values
    written out from text for every construct (``suffix`` also with a window of 2 of its 3 starts);
    σ follows from them."""
    cfg = Config()
    cfg.credit = credit_config(
        segmentation={"segments": 3, "min_segment_tokens": 1},
        value_space="log",
        reference=construct,
        baseline="none",
        suffix_window=window,
    )
    group, scorer, out = credit_with_reference(qwen_tok, qwen_model, cfg)
    prompt = group.prompt_ids.tolist()
    for w, s in zip(out.samples, group.samples, strict=True):
        comp = s.completion_ids.tolist()
        exit_string, length = cfg.credit.scorer.exit_string, scorer.content_end(comp)
        brute = [
            brute_log_value(qwen_model, qwen_tok, prompt + comp[:e], construct, exit_string, e / length, window)
            for e in w.exit_points
        ]
        np.testing.assert_allclose(w.exit_values, brute, atol=1e-4, rtol=0)
        np.testing.assert_allclose(w.segment_rewards, np.diff(w.exit_values), atol=1e-4)
        masses = segment_masses(w.segment_rewards.astype(np.float64), w.advantage, "relu")
        np.testing.assert_allclose(w.sigma, token_sigma(len(comp), w.exit_points, masses, LAMBDA), atol=1e-6)
        assert 1 <= len(w.exit_points) - 1 <= 3 and set(w.timings) == {"entropy", "segment", "values", "sigma"}
    assert scorer.tokens.total > 0
    out.validate()


def test_the_group_baseline_takes_the_other_traces_curves_away(qwen_tok, qwen_model) -> None:
    """``baseline=group``: the same exit values, and segment rewards from v − b with b the other
    traces' curves averaged at the same relative position (recomputed here by hand)."""
    group = make_group(qwen_tok)
    outs = {}
    for baseline in ("none", "group"):
        cfg = Config()
        cfg.credit = credit_config(
            segmentation={"segments": 3, "min_segment_tokens": 1}, reference="suffix", baseline=baseline
        )
        outs[baseline] = redistribute_group(
            group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
        ).samples
    values = [w.exit_values.astype(np.float64) for w in outs["none"]]
    for i, (plain, based) in enumerate(zip(outs["none"], outs["group"], strict=True)):
        np.testing.assert_array_equal(plain.exit_values, based.exit_values)
        at = np.linspace(0, 1, len(values[i]))
        others = [np.interp(at, np.linspace(0, 1, len(v)), v) for j, v in enumerate(values) if j != i]
        np.testing.assert_allclose(based.segment_rewards, np.diff(values[i] - np.mean(others, axis=0)), atol=1e-5)
        masses = segment_masses(based.segment_rewards.astype(np.float64), based.advantage, "relu")
        np.testing.assert_allclose(
            based.sigma, token_sigma(len(based.sigma), based.exit_points, masses, LAMBDA), atol=1e-6
        )


def _answer_tokens(tok, text: str) -> int:
    return len(tok(text[text.index("</think>") :], add_special_tokens=False)["input_ids"])


def test_default_credit_gives_answer_tokens_their_uniform_share(qwen_tok, qwen_model) -> None:
    """Issue 13.1: with the defaults (λ = 0, answer_part=uniform) the tokens after the thinking span
    (``</think>``, the answer) got σ = 0 whenever a segment had mass; they keep 1/|o| now."""
    cfg = Config()
    group = make_group(qwen_tok)
    out = redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))
    for w, text in zip(out.samples[:3], TRACES[:3]):
        n, answer = len(w.sigma), _answer_tokens(qwen_tok, text)
        assert w.exit_points[-1] == n - answer  # the span ends at </think>
        np.testing.assert_allclose(w.sigma[n - answer :], 1 / n, rtol=1e-5)
        np.testing.assert_allclose(w.sigma[w.exit_points[0] : w.exit_points[-1]].sum(), (n - answer - 1) / n, rtol=1e-5)
        assert w.segment_rewards.any()  # the thinking share was redistributed, not left uniform


def test_terminal_answer_part_takes_the_outcome_never_a_scored_end_state(qwen_tok, qwen_model) -> None:
    """Issue 13.2: ``answer_part=terminal`` ends the answer part at the outcome R: its reward is
    R − v̂(s_K) and no branch runs after the full completion (a state the policy never visits)."""
    cfg = Config()
    cfg.credit = credit_config(
        segmentation={"min_segment_tokens": 1, "segments": 3},
        answer_part="terminal",
        value_space="prob",
        reference="solution",
        baseline="none",
    )
    group, scorer, out = credit_with_reference(qwen_tok, qwen_model, cfg)
    prompt = group.prompt_ids.tolist()
    for w, s, text in zip(out.samples[:3], group.samples, TRACES[:3]):
        n = len(w.sigma)
        scored = w.exit_points[:-1].tolist()
        assert w.exit_points[-1] == n and scored[-1] == n - _answer_tokens(qwen_tok, text)
        comp = s.completion_ids.tolist()
        brute = [
            brute_log_value(qwen_model, qwen_tok, prompt + comp[:e], "solution", cfg.credit.scorer.exit_string)
            for e in scored
        ]
        np.testing.assert_allclose(w.exit_values[:-1], np.exp(brute), rtol=1e-4, atol=1e-12)
        assert w.exit_values[-1] == s.reward
        assert w.segment_rewards[-1] == pytest.approx(s.reward - w.exit_values[-2], rel=1e-5)
        # the rewards telescope: Σ r_k = R − v̂(s_0)
        assert w.segment_rewards.sum() == pytest.approx(s.reward - w.exit_values[0], rel=1e-5)
    correct = out.samples[0]
    answer = slice(correct.exit_points[-2], None)
    assert correct.sigma[answer].sum() > 0.5  # R − v̂(s_K) ≈ 1 dwarfs the thinking's value changes


def test_no_exit_point_after_the_end_of_sequence(qwen_tok, qwen_model) -> None:
    """A completion that ends with EOS: the last exit point is before it (the state after EOS is
    never scored); the EOS token keeps its uniform share."""
    cfg = Config()
    traces = [t + "<|im_end|>" for t in TRACES]
    out = redistribute_group(
        make_group(qwen_tok, traces), cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    )
    no_tags = out.samples[3]
    n = len(no_tags.sigma)
    assert no_tags.exit_points[-1] == n - 1 and no_tags.sigma[-1] == pytest.approx(1 / n, rel=1e-5)


def test_an_answer_part_of_end_tokens_only_is_no_segment_by_hand() -> None:
    """``answer_part=terminal`` without thinking tags: the span ends before the EOS (token 29 of 30),
    so the answer part [29, 30) held the EOS alone and got R − v̂(s_K): with log v̂ = [−20, −19, −18,
    −17.5] and R = 1 (prob space), σ[EOS] = 1.0. Its exit goes: the last segment [20, 30) ends at R."""
    assert scored_exits(np.array([0, 10, 20, 29]), 30, 29).tolist() == [0, 10, 20]
    assert scored_exits(np.array([0, 10, 20, 29]), 31, 29).tolist() == [0, 10, 20]  # two end tokens
    assert scored_exits(np.array([0, 10, 20]), 30, 29).tolist() == [0, 10, 20]  # an answer part of content
    assert scored_exits(np.array([0, 10, 30]), 30, 30).tolist() == [0, 10, 30]  # truncated: no answer part
    assert scored_exits(np.array([29]), 30, 29).tolist() == [29]  # no segment to fold into
    # the values then: log v̂(s_0..s_2) and log R = 0 at L = 30
    r = prob_rewards(np.array([-20.0, -19.0, -18.0, 0.0]))
    sigma = token_sigma(30, np.array([0, 10, 20, 30]), segment_masses(r, 1.0, "relu"), 0.0)
    total = 1 - np.exp(-20)  # Σ r_k telescopes to R − v̂(s_0)
    np.testing.assert_allclose(sigma[20:], (1 - np.exp(-18)) / total / 10, rtol=1e-6)  # ≈ 0.1, EOS too
    np.testing.assert_allclose(sigma[:10], (np.exp(-19) - np.exp(-20)) / total / 10, rtol=1e-4)


@pytest.mark.parametrize("method", ["rredcot", "mc"])
def test_terminal_gives_a_final_eos_no_segment_of_its_own(qwen_tok, qwen_model, method) -> None:
    """``answer_part=terminal``, a completion without thinking tags ending in EOS ("12*7 is 84" is
    one keyword-free segment [0, 8)): the EOS was a segment [8, 9) of its own with reward
    R − v̂(s_1) ≈ 1 and took nearly all of σ. It is the single segment [0, 9) ending at R now: σ
    uniform, and no value scored (nor continuation sampled) before the EOS."""
    cfg = Config()
    cfg.generation.max_tokens = 64
    own = {"samples": 1} if method == "mc" else {"value_space": "prob"}
    cfg.credit = credit_config(method, answer_part="terminal", **own)
    group = make_group(qwen_tok, [TRACES[3] + "<|im_end|>", TRACES[2] + "<|im_end|>"], rewards=(1.0, 0.0))
    sampler = RecordingSampler(qwen_model, temperature=0)
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    out = redistribute_group(group, cfg, scorer, sampler=sampler, reward_fn=lambda ids, gold, opened=False: 0.0)
    w = out.samples[0]
    assert w.exit_points.tolist() == [0, 9] and w.exit_values[-1] == 1.0
    assert w.segment_rewards[0] == pytest.approx(1.0 - w.exit_values[0], rel=1e-5)
    np.testing.assert_allclose(w.sigma, 1 / 9, rtol=1e-6)
    if method == "mc":
        prompt, comp = group.prompt_ids.tolist(), group.samples[0].completion_ids.tolist()
        assert [len(p) - len(prompt) for p in sampler.prefixes if p == [*prompt, *comp][: len(p)]] == [0]


def test_softmax_sign_without_values_is_uniform_as_reported(qwen_tok, qwen_model) -> None:
    """No reference pair: every segment reward is 0 and the sample reports ``no_reference`` (one of a
    single segment ``one_segment``); softmax gave each segment 1/K, so σ ∝ 1/|seg_k| under a uniform
    label. Zero rewards give zero masses now."""
    cfg = Config()
    cfg.credit = credit_config(segmentation={"segments": 3, "min_segment_tokens": 1}, sign="softmax")
    out = redistribute_group(
        make_group(qwen_tok, refs=False), cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    )
    assert max(len(w.exit_points) for w in out.samples) > 2  # segments of unequal lengths to tell apart
    for w in out.samples:
        assert w.sigma_fallback == ("one_segment" if len(w.exit_points) == 2 else "no_reference")
        np.testing.assert_allclose(w.sigma, 1 / len(w.sigma), rtol=1e-6)


@pytest.mark.slow  # long references
def test_prob_space_sigma_survives_values_below_e_minus_745(qwen_tok, qwen_model) -> None:
    """Issue 13.8: a long reference puts log v̂ in the −1000s; prob space underflowed to v̂ = 0 and σ
    silently fell back to uniform. σ now equals what the exact prob-space differences give."""
    group = make_group(qwen_tok)
    group.ref_solution_ids = [np.tile(group.ref_solution_ids[0], 20)]  # ~120 tokens: log p ≈ −1000
    scorer = Scorer(qwen_model, qwen_tok, ScorerConfig().exit_string)
    outs = {}
    for space in ("log", "prob"):
        cfg = Config()
        cfg.credit = credit_config(
            segmentation={"segments": 3, "min_segment_tokens": 1},
            value_space=space,
            sign="abs",
            reference="solution",
            baseline="none",
        )
        outs[space] = redistribute_group(group, cfg, scorer).samples
    for w_log, w_prob in zip(outs["log"][:3], outs["prob"][:3]):
        assert w_log.exit_values.max() < -745 and not w_prob.exit_values.any()  # e^-1000 = 0 in float64
        masses = segment_masses(prob_rewards(w_log.exit_values), w_prob.advantage, "abs")
        expected = token_sigma(len(w_prob.sigma), w_prob.exit_points, masses, LAMBDA)
        np.testing.assert_allclose(w_prob.sigma, expected, rtol=1e-2, atol=1e-5)  # log values stored in float32
        assert w_prob.sigma_fallback == "" and np.ptp(w_prob.sigma) > 0


def test_uniform_fallbacks_are_named(qwen_tok, qwen_model) -> None:
    cfg = Config()
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    no_refs = redistribute_group(make_group(qwen_tok, refs=False), cfg, scorer).samples
    reasons = [w.sigma_fallback for w in no_refs]
    assert reasons == ["one_segment" if len(w.exit_points) == 2 else "no_reference" for w in no_refs]
    assert "no_reference" in reasons
    flat = redistribute_group(make_group(qwen_tok, rewards=(1.0,) * 4), cfg, scorer).samples
    assert {w.sigma_fallback for w in flat} == {"skipped"}
    odd = make_group(qwen_tok, ["<think></think>84", "x"], rewards=(1.0, 0.0))
    assert redistribute_group(odd, cfg, scorer).samples[0].sigma_fallback == "no_segment"


def test_mc_terminal_never_continues_a_finished_completion(qwen_tok, qwen_model) -> None:
    """Issue 13.2 for ``mc``: no continuation is sampled after the full completion; the answer
    part's end value is the sample's reward."""
    cfg = Config()
    cfg.credit = credit_config("mc", {"segments": 2}, samples=1, answer_part="terminal")
    group = make_group(qwen_tok, [t + "<|im_end|>" for t in TRACES[:2]], rewards=(1.0, 0.0))
    cfg.generation.max_tokens = max(len(s.completion_ids) for s in group.samples) + 3  # room at every exit
    sampler = RecordingSampler(qwen_model, temperature=0)
    out = redistribute_group(
        group,
        cfg,
        Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string),
        sampler=sampler,
        reward_fn=lambda ids, gold, opened=False: 0.5,
    )
    think_end = qwen_tok.convert_tokens_to_ids("</think>")
    assert len(sampler.prefixes) == sum(len(w.exit_points) - 1 for w in out.samples)  # no prefix for the end
    assert not any(think_end in p for p in sampler.prefixes)  # every prefix stops inside the thinking
    for w, s in zip(out.samples, group.samples):
        assert w.exit_values[-1] == s.reward and w.exit_points[-1] == len(w.sigma)
        assert all(v == 0.5 for v in w.exit_values[:-1])
        # one continuation per exit: no spread to measure (NaN); the outcome R is exact
        assert (
            np.isnan(w.exit_stderr[:-1]).all() and w.exit_stderr[-1] == 0 and len(w.exit_stderr) == len(w.exit_values)
        )
        assert w.values_version == 0


def test_group_references_never_include_a_samples_own_answer_nor_an_unclosed_trace(qwen_tok) -> None:
    """credit.settings.rredcot.group_refs: sample i's references are the dataset pair plus the answer parts of the
    *other* correct samples that stopped normally with their thinking closed."""
    traces = [*TRACES[:2], "<think>\nSo 12*7 = 84, Answer: 84", TRACES[3]]  # #2: thinking never closed
    group = make_group(qwen_tok, traces, rewards=(1.0, 1.0, 1.0, 1.0))
    group.samples[1].finish_reason = "length"  # truncated: its answer is no reference either
    scorer = Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, ScorerConfig().exit_string)
    refs = reference_pairs(group, scorer, RredcotSettings(group_refs=True, max_refs=8))
    enc = lambda t: qwen_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    dataset = (enc("12*7 = 84.\n"), enc("Answer: 84"))
    answer_0, whole_3 = enc("Answer: 84"), group.samples[3].completion_ids.tolist()
    assert [len(r) for r in refs] == [2, 3, 3, 2]
    assert all(r[0] == dataset for r in refs)
    assert refs[0][1:] == [(whole_3, [])] and refs[3][1:] == [(answer_0, [])]  # never its own
    assert refs[1][1:] == refs[2][1:] == [(answer_0, []), (whole_3, [])]
    assert reference_pairs(group, scorer, RredcotSettings(group_refs=False)) == [[dataset]] * 4


def test_no_group_reference_from_a_thought_the_prompt_opened_and_never_closed(qwen_tok) -> None:
    """A chat template that opens the thought in the prompt (DeepSeek-R1-Distill): its completions
    hold only ``</think>``. One that never closes it, though it stopped normally and was judged correct,
    is all thinking: it was a full-length (u, ∅) reference. Answers lose their trailing end tokens;
    an answer part of whitespace and EOS alone is none."""
    traces = [
        "So 12*7 = 84.\nAnswer: 84<|im_end|>",  # the thought never closed
        "12*7 = 84.\n</think>\n\nAnswer: 84<|im_end|>",
        "12*7 = 84.\n</think>\n\n<|im_end|>",  # nothing after the thinking
        "84 it is.\n</think>\n\n84<|im_end|><|endoftext|>",
    ]
    group = make_group(qwen_tok, traces, rewards=(1.0,) * 4)
    enc = lambda t: qwen_tok(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    group.prompt_ids = np.array(
        enc("<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n<think>\n"), np.int32
    )
    scorer = Scorer(build_tiny_model("qwen3", seed=3), qwen_tok, ScorerConfig().exit_string)
    refs = reference_pairs(group, scorer, RredcotSettings(group_refs=True, max_refs=8))
    answer_1, answer_3 = enc("Answer: 84"), enc("84")
    assert [r[1:] for r in refs] == [
        [(answer_1, []), (answer_3, [])],
        [(answer_3, [])],
        [(answer_1, []), (answer_3, [])],
        [(answer_1, [])],
    ]


def test_mc_credits_the_segment_that_makes_the_answer(qwen_tok, qwen_model) -> None:
    """Reward 1 iff the token of ' 84' appears: only exits after its segment have value 1."""
    target = qwen_tok(" 84", add_special_tokens=False)["input_ids"][0]
    cfg = Config()
    cfg.credit = credit_config("mc", {"segments": 4, "min_segment_tokens": 1}, samples=2)
    trace = "<think>\nFirst, 12*7 = 70 + 14.\nSo it is 84.\nWait, yes.\n</think>\n\nAnswer: 84"
    group = make_group(qwen_tok, traces=[trace, "x"], rewards=(1.0, 0.0))
    cfg.generation.max_tokens = len(group.samples[0].completion_ids) + 3  # every exit samples >= 3 tokens
    reward = lambda ids, gold, opened=False: float(target in ids)  # noqa: E731
    out = redistribute_group(
        group,
        cfg,
        Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string),
        sampler=HFContinuationSampler(qwen_model),
        reward_fn=reward,
    )
    w = out.samples[0]
    comp = group.samples[0].completion_ids.tolist()
    first = comp.index(target)
    k = int(np.searchsorted(w.exit_points, first, side="right")) - 1  # segment holding the token
    assert w.segment_rewards.tolist() == [1.0 if i == k else 0.0 for i in range(len(w.segment_rewards))]
    seg = slice(w.exit_points[k], w.exit_points[k + 1])
    span = w.exit_points[-1] - w.exit_points[0]  # the thinking span's share, span/|o|, all to segment k
    np.testing.assert_allclose(w.sigma[seg], span / len(comp) / (seg.stop - seg.start), rtol=1e-6)
    assert abs(w.sigma.sum() - 1) < 1e-6


@pytest.mark.parametrize("opened", [False, True])
def test_mc_rewards_know_whether_the_prompt_opened_the_thought(qwen_tok, qwen_model, opened) -> None:
    """DeepSeek-R1-Distill style: a prompt ending with <think> makes every continuation's reward
    require the closing tag (the generator's and the evaluation's verifier get the same flag)."""
    cfg = Config()
    cfg.credit = credit_config("mc", {"segments": 2, "min_segment_tokens": 1}, samples=1)
    group = make_group(qwen_tok, traces=["12*7 = 84.\nSo 84.\n</think>\nAnswer: 84", "x"], rewards=(1.0, 0.0))
    prompt = "<|im_start|>assistant\n" + ("<think>\n" if opened else "")
    group.prompt_ids = np.array(qwen_tok(prompt, add_special_tokens=False)["input_ids"], dtype=np.int32)
    cfg.generation.max_tokens = len(group.samples[0].completion_ids) + 2
    seen: list[bool] = []
    reward = lambda ids, gold, opened=False: seen.append(opened) or 0.0  # noqa: E731
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    redistribute_group(group, cfg, scorer, sampler=HFContinuationSampler(qwen_model), reward_fn=reward)
    assert seen and set(seen) == {opened}


def test_answer_line_start_by_hand() -> None:
    texts = ["2 + 3", " = 5.\n", "Answer", ":", " 5", "\n", "  Answer", ": 6"]
    assert answer_line_start(texts, "Answer: ") == 6  # the last line that starts with the template
    assert answer_line_start(texts[:6], "Answer: ") == 2
    assert answer_line_start(["The Answer: 5"], "Answer: ") == 1  # not at a line start: none
    assert answer_line_start(["Answer: 5"], "") == 1


def test_a_completion_without_thinking_ends_its_segments_where_its_answer_line_starts(qwen_tok, qwen_model) -> None:
    """Without thinking tags the working lines are the segments and the answer line is the answer
    part: no exit after it (no branch asks for the answer again), and it keeps 1/|o| per token."""
    text = "12*7 = 70 + 14.\n70 + 14 = 84.\nAnswer: 84<|im_end|>"
    group = make_group(qwen_tok, [text, text.replace("84", "83")], rewards=(1.0, 0.0))
    cfg = Config()
    cfg.credit = credit_config(segmentation={"segments": 4, "min_segment_tokens": 1}, reference="suffix")
    out = redistribute_group(group, cfg, Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string))
    answer_at = len(qwen_tok("12*7 = 70 + 14.\n70 + 14 = 84.\n", add_special_tokens=False)["input_ids"])
    for w in out.samples:
        n = len(w.sigma)
        assert w.exit_points[0] == 0 and w.exit_points[-1] == answer_at and len(w.exit_points) == 3  # two lines
        np.testing.assert_allclose(w.sigma[answer_at:], 1 / n, rtol=1e-5)


def test_a_group_whose_traces_cannot_split_scores_no_branch_and_gets_the_same_sigma(qwen_tok, qwen_model) -> None:
    """The CPU demo's traces (one line of working, then the answer line) have one segment each, and
    one segment takes the span's whole share whatever its value: no branch is scored for them, and σ
    is what scoring every branch gave (uniform). A group with one two-line trace scores branches."""
    cfg = Config()
    cfg.credit = credit_config(segmentation={"segments": 4, "min_segment_tokens": 1}, uniform_mix=0.0)
    one_line = ["12*7 = 84.\nAnswer: 84", "12*7 = 74.\nAnswer: 74", "12*7 = 84.\nAnswer: 84"]
    group = make_group(qwen_tok, one_line, rewards=(1.0, 0.0, 1.0))
    scorer = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    out = redistribute_group(group, cfg, scorer)
    assert scorer.tokens.branch == 0
    assert [w.sigma_fallback for w in out.samples] == ["one_segment"] * 3
    for w in out.samples:
        np.testing.assert_allclose(w.sigma, 1 / len(w.sigma), rtol=1e-6)
    split = make_group(qwen_tok, [*one_line[:2], "12*7 = 70 + 14.\nSo 84.\nAnswer: 84"], rewards=(1.0, 0.0, 1.0))
    scored = Scorer(qwen_model, qwen_tok, cfg.credit.scorer.exit_string)
    both = redistribute_group(split, cfg, scored)
    assert scored.tokens.branch > 0 and len(both.samples[2].exit_points) == 3
    for w in both.samples[:2]:  # the one-segment traces of a scored group: uniform as well
        assert w.sigma_fallback == "one_segment" and w.exit_values.size == 2
        np.testing.assert_allclose(w.sigma, 1 / len(w.sigma), rtol=1e-6)
