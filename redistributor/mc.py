"""Monte-Carlo exit-point values: mean verifier reward of M sampled continuations per exit point,
plus a transformers ``generate`` continuation sampler for CPU tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rredcot.common.sampling import ContinuationSampler, RewardFn


def mc_values(
    sampler: ContinuationSampler,
    reward_fn: RewardFn,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    exit_points: Sequence[int],
    m: int,
    max_tokens: int,
    answer: str,
) -> tuple[np.ndarray, int]:
    """v̂(s_t) = mean_j R(o[:e_t] ⊕ c_j) over M continuations c_j of x ⊕ o[:e_t] (prob space).

    Returns the values and the number of tokens generated.
    """
    prefixes = [[*prompt_ids, *completion_ids[: int(e)]] for e in exit_points]
    conts = sampler.sample(prefixes, m, max_tokens)
    values = [
        float(np.mean([reward_fn([*completion_ids[: int(e)], *c], answer) for c in cs]))
        for e, cs in zip(exit_points, conts)
    ]
    return np.array(values, dtype=np.float64), sum(len(c) for cs in conts for c in cs)


class HFContinuationSampler:
    """``ContinuationSampler`` on transformers ``generate`` (one prefix at a time, M sequences each;
    greedy when ``temperature`` is 0)."""

    def __init__(self, model: Any, temperature: float = 1.0, eos_token_id: int | None = None, seed: int = 0):
        self.model, self.eos, self.seed = model, eos_token_id, seed
        self.greedy = temperature <= 0
        self.sampling = (
            {"do_sample": False} if self.greedy else {"do_sample": True, "temperature": temperature, "top_k": 0}
        )

    @torch.no_grad()
    def sample(self, prefixes: list[list[int]], m: int, max_tokens: int) -> list[list[list[int]]]:
        torch.manual_seed(self.seed)
        out = []
        for prefix in prefixes:
            ids = torch.tensor([prefix], device=self.model.device)
            gen = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                **self.sampling,
                max_new_tokens=max_tokens,
                min_new_tokens=0,
                num_return_sequences=1 if self.greedy else m,
                eos_token_id=self.eos,
                pad_token_id=self.eos if self.eos is not None else 0,
            )[:, len(prefix) :].tolist()
            conts = [_until_eos(c, self.eos) for c in gen]
            out.append(conts * m if self.greedy else conts)  # greedy: M identical continuations
        return out


def _until_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos is not None and eos in ids else ids
