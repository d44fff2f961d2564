"""MC continuations on the vLLM adapter: the ContinuationSampler protocol and verified rewards."""

from __future__ import annotations

from safetensors.torch import save

from rredcot.actors.continuations import VLLMContinuations
from rredcot.common.config import TaskConfig
from rredcot.common.sampling import ContinuationSampler
from rredcot.common.verifier import Verifier


def test_greedy_continuations_match_transformers(tied, helpers):
    engine, m0, *_ = tied
    engine.load_weights_bytes(save(helpers.weights(m0)), version=engine.version)  # whatever ran before
    sampler = VLLMContinuations(engine, temperature=0.0)
    assert isinstance(sampler, ContinuationSampler)
    prefixes = [[9707, 11, 1879], [785, 3974, 13876, 38835, 30]]
    out = sampler.sample(prefixes, m=2, max_tokens=6)
    assert len(out) == 2
    for prefix, conts in zip(prefixes, out):
        assert len(conts) == 2 and conts[0] == conts[1]
        assert conts[0] == helpers.hf_greedy(m0, prefix, len(conts[0])) and 0 < len(conts[0]) <= 6


def test_sampled_continuations_and_verified_rewards(tied, tokenizer):
    engine, *_ = tied
    sampler = VLLMContinuations(engine, temperature=1.0)
    prompt = tokenizer("What is 7 * 8?\n", add_special_tokens=False)["input_ids"]
    partial = tokenizer("7 * 8 = 56.\nAnswer: 56\n", add_special_tokens=False)["input_ids"]
    conts = sampler.sample([prompt + partial], m=4, max_tokens=5)[0]
    assert len(conts) == 4 and all(0 < len(c) <= 5 for c in conts)
    with Verifier(TaskConfig("math"), timeout_s=10) as verifier:
        rewards = sampler.rewards(
            [prompt + partial, prompt], [len(prompt)] * 2, ["56", "57"], m=3, max_tokens=1, verifier=verifier
        )
    assert rewards == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
