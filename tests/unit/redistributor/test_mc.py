"""MC values and the transformers continuation sampler on a real tiny model."""

from __future__ import annotations

import numpy as np

from rredcot.common.sampling import ContinuationSampler
from rredcot.redistributor.mc import HFContinuationSampler, mc_values


def test_hf_sampler_shapes_eos_and_greedy(make_lm) -> None:
    model = make_lm("qwen3", 11)
    sampler = HFContinuationSampler(model, temperature=1.0, eos_token_id=None, seed=1)
    assert isinstance(sampler, ContinuationSampler)
    out = sampler.sample([[1, 2, 3], [4, 5]], m=3, max_tokens=6)
    assert [len(x) for x in out] == [3, 3] and all(len(c) == 6 for cs in out for c in cs)
    greedy = HFContinuationSampler(model, temperature=0.0)
    a, b = greedy.sample([[1, 2, 3]], 2, 5)[0]
    assert a == b  # greedy: both continuations identical
    eos = a[2]  # make the third greedy token the end of sequence: continuations stop there
    cut = HFContinuationSampler(model, temperature=0.0, eos_token_id=eos).sample([[1, 2, 3]], 1, 5)[0][0]
    assert cut[-1] == eos and len(cut) <= 3


def test_mc_values_are_mean_rewards(make_lm) -> None:
    """Reward = 1 iff the completion prefix part (o[:e_t]) contains token 7: values step 0 -> 1."""
    sampler = HFContinuationSampler(make_lm("qwen3", 12), temperature=1.0)
    comp = [9, 9, 7, 9, 9]
    values, generated = mc_values(
        sampler,
        lambda ids, gold: float(7 in ids[: len(comp)] and gold == "g"),
        [1, 2],
        comp,
        [0, 2, 3, 5],
        m=2,
        max_tokens=1,
        answer="g",
    )
    # exits 0 and 2 hold o[:e] without token 7, but the sampled continuation may create it at index e
    assert values[2] == 1.0 and values[3] == 1.0 and values[0] in (0.0, 0.5, 1.0)
    assert generated == 4 * 2 * 1 and values.dtype == np.float64
