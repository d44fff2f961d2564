"""The learner's log-prob wrapper: a float32 LM head, and head calls agreed across ranks."""

from __future__ import annotations

import torch

from rredcot.learner.logprobs import TokenLogProbs, model_inputs
from rredcot.learner.packing import collate


def test_head_logits_are_float32_for_a_bf16_model(make_model, make_samples):
    """A bf16 model's log-probs come from float32 logits (bf16 ones are off by > 1e-3 here)."""
    model = make_model().to(torch.bfloat16)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40)  # logits of a trained model's size (tens)
    mb = collate(make_samples(3))
    wrapped = TokenLogProbs(model)
    with torch.no_grad():
        got = wrapped(**model_inputs(mb))
        hidden = model.get_decoder()(
            input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, sample_bounds=mb.sample_bounds
        ).last_hidden_state
        h = hidden.reshape(-1, hidden.shape[-1])[mb.token_index]
        weight = model.get_output_embeddings().weight
        exact = torch.log_softmax(h.float() @ weight.float().T, -1).gather(-1, mb.targets[:, None]).squeeze(-1)
        rounded = torch.log_softmax((h @ weight.T).float(), -1).gather(-1, mb.targets[:, None]).squeeze(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, exact, atol=1e-4, rtol=0)
    assert (rounded - exact).abs().max() > 1e-3


def test_n_chunks_sets_the_head_calls_and_keeps_the_values(make_model, make_samples):
    """A forward calls the head exactly ``n_chunks`` times (empty chunks too), with the same result."""
    mb = collate(make_samples(1, lengths=[3]))
    wrapped = TokenLogProbs(make_model(), chunk=4)
    calls = []
    wrapped.lm.get_output_embeddings().register_forward_hook(lambda *_: calls.append(1))
    plain = wrapped(**model_inputs(mb))
    assert len(calls) == wrapped.head_calls(3) == 1
    padded = wrapped(**model_inputs(mb), n_chunks=5)
    assert len(calls) == 1 + 5
    torch.testing.assert_close(padded, plain, atol=1e-6, rtol=0)
    assert wrapped.head_calls(9) == 3 and TokenLogProbs(make_model()).head_calls(10_000) == 1
