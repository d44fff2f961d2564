"""Continuation sampling interface for Monte-Carlo credit (``credit.method=mc``).

The generator tier implements ``ContinuationSampler`` on its vLLM engine; the redistributor ships
a transformers ``generate`` implementation for CPU tests. Token ids only: no engine objects cross it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

# Reward of a completion (token ids after the prompt) against the gold answer text.
RewardFn = Callable[[list[int], str], float]


@runtime_checkable
class ContinuationSampler(Protocol):
    def sample(self, prefixes: list[list[int]], m: int, max_tokens: int) -> list[list[list[int]]]:
        """For each prefix (prompt ⊕ partial completion ids), ``m`` sampled continuations of at most
        ``max_tokens`` new tokens each (ids after the prefix, ending at EOS or the limit)."""
        ...
