"""MC values and the transformers continuation sampler on a real tiny model: brute force, budgets,
seeds, top-p and the standard error."""

from __future__ import annotations

import math

import pytest
import torch

from rredcot.common.sampling import ContinuationRequest, ContinuationSampler
from rredcot.redistributor.mc import HFContinuationSampler, categorical, exit_budgets, mc_values, top_p_filter
from tests.engine_fixtures import hf_greedy

PROMPT = [5, 17, 42]
COMPLETION = [9, 101, 7, 250, 33, 64, 12, 8]  # L = 8 = max_tokens: a truncated completion
EXITS = [0, 2, 5, 8]
MAX_TOKENS = 8


def parity(ids: list[int], gold: str, opened: bool = False) -> float:
    """A reward that depends on every token: 1 when the token ids sum to an even number."""
    return float(sum(ids) % 2 == 0 and gold == "g")


class Recording(HFContinuationSampler):
    """The real transformers sampler, remembering every request it was given and its continuations."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[ContinuationRequest] = []
        self.outputs: list[list[list[int]]] = []

    def sample(self, requests):
        out = super().sample(requests)
        self.requests += requests
        self.outputs += out
        return out


def test_exit_budgets_by_hand() -> None:
    assert exit_budgets(5, [0, 3, 8, 10], 10).tolist() == [10, 7, 2, 0]
    # a context of 14 leaves 14 - 5 - e_t after the prompt and o[:e_t]: tighter than max_tokens here
    assert exit_budgets(5, [0, 3, 8, 10], 10, max_len=14).tolist() == [9, 6, 1, 0]
    assert exit_budgets(5, [12], 10).tolist() == [0]  # never negative


def test_mc_equals_brute_force_for_a_greedy_policy(make_lm) -> None:
    """Greedy continuations are deterministic, so every exit's value is the reward of its one
    continuation, computed here by hand within the budget left there (none at the last exit)."""
    model = make_lm("qwen3", 21)
    first = hf_greedy(model, PROMPT + COMPLETION[:2], 6, None)
    eos = first[3]  # make a token the policy emits the end of sequence: that continuation stops there
    sampler = HFContinuationSampler(model, temperature=0.0, eos_token_id=eos)
    est = mc_values(sampler, parity, PROMPT, COMPLETION, EXITS, 3, MAX_TOKENS, "g", sample_id="s")
    conts = [hf_greedy(model, PROMPT + COMPLETION[:e], MAX_TOKENS - e, eos) for e in EXITS]
    assert conts[1][-1] == eos and len(conts[1]) == first.index(eos) + 1 < 6 and conts[3] == []
    expected = [parity(COMPLETION[:e] + c, "g") for e, c in zip(EXITS, conts)]
    assert est.values.tolist() == expected and 0 < sum(expected) < len(expected)
    assert est.rewards.tolist() == [[v] * 3 for v in expected] and est.stderr.tolist() == [0.0] * 4
    assert est.tokens == 3 * sum(len(c) for c in conts) == sampler.generated_tokens


def test_each_exit_gets_the_budget_left_there_and_none_is_sampled_without_one(make_lm) -> None:
    sampler = Recording(make_lm("qwen3", 22), temperature=1.0)
    est = mc_values(sampler, parity, PROMPT, COMPLETION, EXITS, 2, MAX_TOKENS, "g", sample_id="s")
    assert [(len(r.prefix), r.max_tokens) for r in sampler.requests] == [(3, 8), (5, 6), (8, 3)]  # not e = 8
    assert est.budgets.tolist() == [8, 6, 3, 0]
    assert est.values[3] == parity(COMPLETION, "g") and est.stderr[3] == 0.0  # o as it stands
    # no EOS: every continuation runs to its budget exactly
    assert est.tokens == 2 * (8 + 6 + 3) == sampler.generated_tokens


def test_seeds_make_mc_reproducible(make_lm) -> None:
    """Fresh samplers draw the same continuations for the same sample and exits, whatever else is
    in the batch; another sample id or run seed draws others; exits and the M continuations of an
    exit have seeds of their own."""
    model = make_lm("qwen3", 23)

    def draw(seed: int = 7, sample_id: str = "s") -> Recording:
        sampler = Recording(model, temperature=1.0, seed=seed)
        mc_values(sampler, parity, PROMPT, COMPLETION, EXITS, 4, MAX_TOKENS, "g", sample_id=sample_id)
        return sampler

    first = draw()
    assert draw().outputs == first.outputs
    assert draw(sample_id="t").outputs != first.outputs and draw(seed=8).outputs != first.outputs
    assert len({r.seed for r in first.requests}) == 3
    assert all(len({tuple(c) for c in conts}) == 4 for conts in first.outputs)
    alone = HFContinuationSampler(model, temperature=1.0, seed=7).sample([first.requests[1]])[0]
    assert alone == first.outputs[1]


def test_top_p_reaches_the_sampler(make_lm) -> None:
    """A nucleus of (almost) zero mass keeps only the most likely token: sampling is greedy."""
    model = make_lm("qwen3", 24)
    req = ContinuationRequest(PROMPT, 3, 6, seed=1)
    greedy = hf_greedy(model, PROMPT, 6, None)
    assert HFContinuationSampler(model, temperature=1.0, top_p=1e-6).sample([req])[0] == [greedy] * 3
    assert HFContinuationSampler(model, temperature=1.0).sample([req])[0] != [greedy] * 3


def test_categorical_draws_each_token_at_its_probability_and_never_a_zero_one() -> None:
    """20,000 draws per row: each token's frequency within 4 standard errors of its probability
    (unnormalised rows too), the zero-mass tokens (a nucleus' cut) never; a generator's seed decides."""
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3, 0.0], [0.0, 2.0, 0.0, 0.0, 2.0]])
    n = 20_000
    gens = [torch.Generator().manual_seed(j) for j in range(2)]
    draws = torch.stack([categorical(probs, gens) for _ in range(n)])  # [n, rows]
    for row in range(2):
        p = probs[row] / probs[row].sum()
        freq = torch.bincount(draws[:, row], minlength=5).double() / n
        assert torch.all((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt()), (row, freq, p)
        assert freq[p == 0].sum() == 0
    again = [torch.Generator().manual_seed(j) for j in range(2)]
    assert torch.equal(torch.stack([categorical(probs, again) for _ in range(n)]), draws)


def test_top_p_filter_by_hand() -> None:
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.25, 0.25, 0.5]])
    kept = top_p_filter(probs, 0.6).tolist()  # row 0: 0.5, then 0.3 (0.5 < 0.6 before it); row 1: 0.5, then one 0.25
    assert kept[0] == pytest.approx([0.0, 0.5, 0.3]) and kept[1] == pytest.approx([0.25, 0.0, 0.5])
    assert top_p_filter(probs, 0.5).tolist()[0] == pytest.approx([0.0, 0.5, 0.0])


class Scripted:
    """A toy policy whose continuations are given: exit t gets ``script[t]``."""

    version, generated_tokens = 0, 0

    def __init__(self, script: list[list[list[int]]]) -> None:
        self.script = script

    def sample(self, requests):
        return self.script[: len(requests)]

    def sync(self) -> bool:
        return False


def test_standard_error_by_hand() -> None:
    """Rewards 1, 0, 1, 1 at one exit: mean 0.75, sample std 0.5, standard error 0.5/√4 = 0.25; one
    continuation per exit has no spread to measure (NaN), except where v̂ is exact."""
    toy = Scripted([[[2], [1], [4], [6]]])
    assert isinstance(toy, ContinuationSampler)
    est = mc_values(toy, parity, [1], [], [0], 4, 5, "g")
    assert est.values.tolist() == [0.75] and est.stderr.tolist() == [0.25]
    one = mc_values(Scripted([[[2]]]), parity, [1], [3, 3], [0, 2], 1, 2, "g")
    assert math.isnan(one.stderr[0]) and one.stderr[1] == 0.0 and one.values.tolist() == [1.0, 1.0]


def test_the_prompts_opened_thought_reaches_every_reward() -> None:
    seen: list[bool] = []
    reward = lambda ids, gold, opened=False: seen.append(opened) or 0.0  # noqa: E731
    mc_values(Scripted([[[2], [1]]]), reward, [1], [3, 3], [0, 2], 2, 2, "g", opened=True)
    assert seen == [True, True, True]  # two continuations at exit 0; exit 2 has no budget: its reward as is
