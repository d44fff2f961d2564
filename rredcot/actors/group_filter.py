"""Dynamic sampling (DAPO's): a group whose samples all earned the same reward has no advantage, so
nothing to learn from; the generator drops it before the redistributor and the learner pay for it,
and admits another prompt in its place (its slot is freed as for a rejected prompt).

When the policy gets every problem right (or wrong), every group would be dropped and the run would
never step: after as many uniform groups in a row as the pool has problems still drawn (retired
problems are not: ``rredcot/actors/retirement.py``), one is passed on (the learner skips it as it skips any
zero-advantage group) and the count starts again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)


def uniform(rewards: Sequence[float]) -> bool:
    """Whether every sample of a group earned the same reward (so every advantage is 0)."""
    return max(rewards) - min(rewards) <= 1e-9


class UniformGroups:
    """Decides, group by group, which uniform groups to drop (``generation.drop_uniform_groups``)."""

    def __init__(self, enabled: bool, pool: int, name: str) -> None:
        """``pool``: the problems still drawn (the generator lowers it as problems retire)."""
        self.enabled, self.pool, self.name = enabled, pool, name
        self.in_a_row = 0  # uniform groups dropped since the last group passed on
        self._warned = False

    def drop(self, rewards: Sequence[float]) -> bool:
        """Whether to drop the group with these rewards."""
        if not self.enabled or not uniform(rewards):
            self.in_a_row = 0
            return False
        if self.in_a_row < self.pool:
            self.in_a_row += 1
            return True
        if not self._warned:
            self._warned = True
            log.warning(
                "%s: the last %d groups all had uniform rewards (the pool has %d problems): passing one on "
                "after every %d dropped, so the run still steps (the learner skips them)",
                self.name,
                self.pool,
                self.pool,
                self.pool,
            )
        self.in_a_row = 0
        return False
