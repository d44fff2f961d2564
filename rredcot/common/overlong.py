"""Completions cut at ``generation.max_tokens`` (DAPO's overlong handling, ``generation.overlong``).

A truncated completion has no final answer, so its reward says "wrong" about reasoning that may have
been on its way: a noisy signal that grows with the length budget. ``penalty`` ramps the reward down
over the last ``overlong_window`` tokens of the budget instead (0 up to ``max_tokens − window``, then
linearly to −1 at ``max_tokens``), added to the verifier's reward, so length is discouraged smoothly
rather than by a cliff. ``filter`` keeps a truncated sample in its group's baseline but gives it no
advantage: its tokens take no part in the policy gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from rredcot.common.config import Config
from rredcot.common.records import RolloutRecord


def overlong_window(cfg: Config) -> int:
    """Tokens before ``max_tokens`` over which the penalty ramps (0 in the config: a quarter of it)."""
    g = cfg.generation
    return g.overlong_window or max(1, g.max_tokens // 4)


def overlong_penalty(length: int, max_tokens: int, window: int) -> float:
    """DAPO's soft overlong punishment: 0 for ``length <= max_tokens − window``, then falling linearly
    to −1 at ``max_tokens`` (and −1 beyond)."""
    start = max_tokens - window
    return 0.0 if length <= start else max(-1.0, (start - length) / window)


def penalize(samples: Sequence[RolloutRecord], max_tokens: int, window: int) -> list[float]:
    """Add each sample's overlong penalty to its reward; returns the penalties (0 where none)."""
    penalties = [overlong_penalty(len(s.completion_ids), max_tokens, window) for s in samples]
    for s, p in zip(samples, penalties):
        s.reward += p
    return penalties
