"""Retiring solved problems (``generation.retire_solved``): a problem whose group came back with every
sample correct N times in a row is not generated again in this run. Its later admissions are
rejected before the engine sees them (ledger ``rejected``, reason ``retired``), and another prompt
is admitted in their place, as for a group that dynamic sampling drops.

Dynamic sampling drops a solved group after paying for it; on a pool the run goes through many
times, that is most of the generator's time once the policy has mastered the easy problems.
Retiring them moves that time to problems that still teach something (as offline and online
difficulty filtering do in Skywork-OR1 and POLARIS). A group that is not all correct ends the
problem's streak. The streaks and the retired set live in Redis: every generator sees them at
once, and a resumed run keeps them. At least ``floor`` problems stay active (one step's prompts),
so a policy that solves everything still has prompts to draw; dynamic sampling's own guard
(``group_filter.UniformGroups``) then passes a group on now and then.
"""

from __future__ import annotations

import redis

from rredcot.common.streams import run_key

# KEYS: streaks (hash), retired (set); ARGV: problem id, streak that retires, most problems retired
_SOLVED = """
local streak = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if streak >= tonumber(ARGV[2]) and redis.call('SCARD', KEYS[2]) < tonumber(ARGV[3]) then
  return redis.call('SADD', KEYS[2], ARGV[1])
end
return 0
"""


def solved(verdicts: list[str]) -> bool:
    """Whether a group solved its problem: every sample's verdict is ``correct``."""
    return bool(verdicts) and all(v == "correct" for v in verdicts)


class Retirement:
    """The run's solved streaks and retired problems; ``after`` 0 switches retirement off."""

    def __init__(self, client: redis.Redis, run_id: str, after: int, pool: int, floor: int) -> None:
        """``after``: all-correct groups in a row that retire a problem; ``pool``: distinct problems;
        ``floor``: problems that always stay active."""
        self.client, self.after, self.most = client, after, max(0, pool - floor)
        if after:
            self.streaks = run_key(client, run_id, "retire:streaks")
            self.retired_key = run_key(client, run_id, "retire:retired")
            self._solved = client.register_script(_SOLVED)

    def is_retired(self, problem_id: str) -> bool:
        """Whether ``problem_id`` is retired (never, with retirement off)."""
        return bool(self.after) and bool(self.client.sismember(self.retired_key, problem_id))

    def observe(self, problem_id: str, all_correct: bool) -> bool:
        """Count a finished group of ``problem_id`` (``all_correct``: ``solved`` of its verdicts);
        True if it retired the problem just now."""
        if not self.after:
            return False
        if not all_correct:
            self.client.hdel(self.streaks, problem_id)
            return False
        return bool(self._solved(keys=[self.streaks, self.retired_key], args=[problem_id, self.after, self.most]))

    def retired(self) -> int:
        """How many problems are retired now."""
        return int(self.client.scard(self.retired_key)) if self.after else 0
