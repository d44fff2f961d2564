"""Per-token log-probabilities of completions under a causal LM: the learner's model wrapper."""

from __future__ import annotations

import math
import types

import torch
import torch.nn.functional as F

from rredcot.learner.attention import use_varlen_attention
from rredcot.learner.packing import MicroBatch


class TokenLogProbs(torch.nn.Module):
    """Wraps a causal LM (``.lm``) so that its forward returns log π(target) per completion token.

    The decoder runs once; the LM head runs only at the T positions that predict completion
    tokens. With ``chunk > 0`` and grad enabled, the head runs in checkpointed chunks of ``chunk``
    tokens, so at most [chunk, V] logits are alive at once (forward and backward). The head's
    matmul runs in float32 whatever the model's dtype (bf16 logits round a logit of 30 by up to
    0.06, so ratios near 1 would carry that noise); its transient float32 copy of the weight and
    the [chunk, V] logits are what ``chunk`` bounds. Logits are divided by the sampling
    ``temperature`` so that log-probs match the generator's processed behaviour log-probs.
    Wrapping the whole computation in one module lets DeepSpeed see every micro-batch as one
    engine forward. ``lm`` is switched to the varlen attention, which gives the same results as
    sdpa for every layout and never attends across the samples of a packed row.

    Under ZeRO-3 every call of the head module gathers its weight (a collective), so all ranks
    must call it equally often: ``n_chunks`` makes a forward run exactly that many head calls
    (empty ones included), whatever its token count.
    """

    def __init__(self, lm: torch.nn.Module, chunk: int = 0, temperature: float = 1.0) -> None:
        super().__init__()
        self.lm = use_varlen_attention(lm)
        head = lm.get_output_embeddings()
        head.forward = types.MethodType(_float32_linear, head)  # still called as a module: ZeRO-3 hooks run
        self.chunk = chunk
        self.inv_temperature = 1.0 / temperature if temperature > 0 else 1.0

    def head_calls(self, n_tokens: int) -> int:
        """Head calls of a forward over ``n_tokens`` completion tokens (without ``n_chunks``)."""
        return max(1, math.ceil(n_tokens / self.chunk)) if self.chunk > 0 else 1

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_index: torch.Tensor,
        targets: torch.Tensor,
        sample_bounds: tuple[int, ...] | None = None,
        n_chunks: int | None = None,
    ) -> torch.Tensor:
        hidden = self.lm.get_decoder()(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            use_cache=False,
            sample_bounds=sample_bounds,
        ).last_hidden_state
        h = hidden.reshape(-1, hidden.shape[-1])[token_index]
        n = n_chunks or self.head_calls(len(h))
        if n == 1:
            return self._head(h, targets)
        parts = []
        for args in zip(h.tensor_split(n), targets.tensor_split(n), strict=True):
            if torch.is_grad_enabled():
                parts.append(torch.utils.checkpoint.checkpoint(self._head, *args, use_reentrant=False))
            else:
                parts.append(self._head(*args))
        return torch.cat(parts)

    def _head(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm.get_output_embeddings()(h) * self.inv_temperature
        return logits.gather(-1, targets[:, None]).squeeze(-1) - logits.logsumexp(-1)


def _float32_linear(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``Linear.forward`` computed in float32 (the head's logits); gradients flow back in the weight's dtype."""
    bias = None if self.bias is None else self.bias.float()
    return F.linear(x.float(), self.weight.float(), bias)


def model_inputs(mb: MicroBatch) -> dict[str, torch.Tensor | tuple[int, ...] | None]:
    """Keyword arguments of ``TokenLogProbs.forward`` for ``mb``."""
    return {
        "input_ids": mb.input_ids,
        "position_ids": mb.position_ids,
        "attention_mask": mb.attention_mask,
        "token_index": mb.token_index,
        "targets": mb.targets,
        "sample_bounds": mb.sample_bounds,
    }


def token_logprobs(model: torch.nn.Module, mb: MicroBatch, chunk: int = 0, temperature: float = 1.0) -> torch.Tensor:
    """log π(target) for every completion token of ``mb`` under the causal LM ``model`` (float32 [T])."""
    return TokenLogProbs(model, chunk, temperature)(**model_inputs(mb))
