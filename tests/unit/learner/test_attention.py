"""Varlen attention: a packed row equals transformers' own sdpa with its block-diagonal mask."""

from __future__ import annotations

import json

import torch

from rredcot.learner.attention import VARLEN_ATTENTION, use_varlen_attention, varlen_attention_forward
from rredcot.learner.packing import collate
from tests.learner_samples import random_samples, tiny_lm


def _hidden(model: torch.nn.Module, mb, **kwargs) -> torch.Tensor:
    return model.get_decoder()(
        input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **kwargs
    ).last_hidden_state


def check_packed_row_matches_sdpa(device: str) -> None:
    """Reference: the untouched sdpa model, which builds a block-diagonal mask from the restarting
    position ids; the varlen model runs one causal sdpa per sample (GQA: 4 heads, 2 kv heads). On
    CUDA (``tests/gpu/test_attention_cuda.py``) sdpa takes its flash kernel."""
    samples = random_samples(5, lengths=[1, 37, 4, 60, 9])
    mb = collate(samples, "packed").to(device)
    outputs, grads = [], []
    for varlen in (False, True):
        model = tiny_lm(heads=4, kv_heads=2).to(device)
        if varlen:
            use_varlen_attention(model)
        kwargs = {"sample_bounds": mb.sample_bounds} if varlen else {}
        hidden = _hidden(model, mb, **kwargs)
        hidden.pow(2).mean().backward()
        outputs.append(hidden.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=0)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_row_matches_sdpa_block_mask_forward_and_backward():
    check_packed_row_matches_sdpa("cpu")


def test_bounds_decide_what_each_token_sees(make_model, make_samples):
    """Tokens of the second sample change when the bounds merge it with the first (it can fail)."""
    model = use_varlen_attention(make_model()).eval()
    samples = make_samples(2, lengths=[8, 8])
    mb = collate(samples, "packed")
    first = len(samples[0].prompt_ids) + 8
    with torch.no_grad():
        split = _hidden(model, mb, sample_bounds=mb.sample_bounds)
        merged = _hidden(model, mb, sample_bounds=(0, mb.sample_bounds[-1]))
    torch.testing.assert_close(split[:, :first], merged[:, :first], atol=1e-6, rtol=0)
    assert (split[:, first:] - merged[:, first:]).abs().max() > 1e-3


def test_saved_model_does_not_name_the_learner_attention(make_model, tmp_path):
    """Checkpoints must load in transformers and vLLM, where the varlen name is not registered."""
    model = use_varlen_attention(make_model())
    assert model.config._attn_implementation == VARLEN_ATTENTION
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert VARLEN_ATTENTION not in json.dumps(config)
    assert config["model_type"] == "qwen3"  # the file is the model's real config


def test_samples_are_split_not_sliced():
    """Each sample's q/k/v is a split of the row (one gradient buffer in backward), never a slice:
    the backward of every slice allocates a zero gradient of the whole row, n of them per layer."""
    q, k, v = (torch.randn(1, 2, 30, 8, requires_grad=True) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal, module.training = True, True
    out, _ = varlen_attention_forward(module, q, k, v, None, sample_bounds=(0, 7, 19, 30))
    nodes, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node.name() not in nodes:
            nodes.add(node.name())
            stack.extend(next_fn for next_fn, _ in node.next_functions)
    assert any(name.startswith("SplitWithSizesBackward") for name in nodes), nodes
    assert not any(name.startswith("SliceBackward") for name in nodes), nodes
