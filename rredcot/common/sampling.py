"""Continuation sampling interface for Monte-Carlo credit (``credit.method=mc``).

A request asks for ``m`` continuations of one prefix (prompt ⊕ partial completion) within its own
token budget, drawn with its own seed: continuation j uses ``seed_of(sampler seed, request seed) + j``,
so MC is reproducible (same sample, same exit, same continuations), independent across exits,
samples and runs, and does not depend on which other requests share the batch. Token ids only: no
engine objects cross this interface. Implementations: ``actors.continuations.VLLMContinuations``
(a vLLM engine following the policy's published weights) and
``redistributor.mc.HFContinuationSampler`` (transformers; the reference and the fallback).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class RewardFn(Protocol):
    """Reward of a completion (token ids after the prompt) against the gold answer text; ``opened``:
    the prompt opened the thought (``tasks.prompts.opens_thought``), so the completion must close it."""

    def __call__(self, ids: list[int], gold: str, opened: bool = False) -> float: ...


SEED_BITS = 62  # seeds stay below 2**63 (torch, vLLM) with room for + j


def seed_of(*parts: object) -> int:
    """A ``SEED_BITS``-bit seed hashed from ``parts`` (stable across processes and Python runs)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)


@dataclass(frozen=True)
class ContinuationRequest:
    """``m`` continuations of ``prefix`` of at most ``max_tokens`` new tokens each (≥ 1)."""

    prefix: list[int]
    m: int
    max_tokens: int
    seed: int  # e.g. ``seed_of(sample id, exit point)``


@runtime_checkable
class ContinuationSampler(Protocol):
    """Samples continuations with some policy's weights, at ``generation`` temperature and top-p."""

    @property
    def version(self) -> int:
        """The policy version of the weights that sample."""
        ...

    @property
    def generated_tokens(self) -> int:
        """Continuation tokens generated so far (the cost of MC)."""
        ...

    def sample(self, requests: Sequence[ContinuationRequest]) -> list[list[list[int]]]:
        """For each request, its ``m`` continuations (ids after the prefix, ending at EOS, a stop
        string or the request's ``max_tokens``)."""
        ...

    def sync(self) -> bool:
        """Take the newest published policy weights, if the sampler follows them; True if applied."""
        ...
