"""Staleness-bounded prompt admission shared by all generators (AReaL's rule), kept in Redis.

A generator may admit prompt number ``n`` (0-based, counted once across all generators) only
while ``n < (learner_version + eta + 1) * prompts_per_step``, where ``learner_version`` is the
number of global batches the learner has consumed. That equals the policy version except after a
skipped step (all-zero advantages or a non-finite loss): the step still consumes its batch and
advances admission, or the generators would wait forever for a version that never comes. At most
``eta + 1`` steps of prompts are admitted and untrained; groups trained in admission order are at
most ``eta`` versions old, while a slow group overtaken by later ones (several generators or
redistributors) can be older: the learner measures it. ``eta = 0`` is synchronous on-policy
training. The admission count doubles as the global dataset position, so every admitted prompt is a
distinct problem and a resumed run continues where it stopped. An admitted prompt that will never
reach the learner *frees its slot* (it keeps its dataset position): one the generator rejects
(longer than the context, an invalid record) and one a redistributor or the learner dead-letters.
The slots in use are ``admitted − |ledger:rejected| − |ledger:dead|``; the ledger's outcomes are
sets of group ids, so a group rejected or dead-lettered twice frees one slot. The learner thus
still receives ``prompts_per_step`` groups per step, and a dead-lettered group cannot leave it
waiting forever. With a ``budget`` (the prompts a run needs: steps × prompts per step), admission
ends once that many usable prompts were admitted; a slot freed after that reopens it.

An admission also records the index in the admitting generator's in-flight set in the same script,
so no crash between the two can lose an admitted prompt.
"""

from __future__ import annotations

import redis

from rredcot.common.ledger import Ledger
from rredcot.common.streams import run_key

_ADMIT = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
local used = n - redis.call('SCARD', KEYS[3]) - redis.call('SCARD', KEYS[4])
local budget = tonumber(ARGV[3])
if budget >= 0 and used >= budget then
  return -2
end
if used < (v + tonumber(ARGV[1]) + 1) * tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], n + 1)
  redis.call('SADD', KEYS[5], n)
  return n
end
return -1
"""


class Admission:
    """The run's admission counter and published learner version."""

    def __init__(
        self, client: redis.Redis, run_id: str, prompts_per_step: int, eta: int, budget: int | None = None
    ) -> None:
        self.client, self.prompts_per_step, self.eta, self.budget = client, prompts_per_step, eta, budget
        self.admitted_key = run_key(client, run_id, "admitted")
        self.version_key = run_key(client, run_id, "learner_version")
        ledger = Ledger(client, run_id)
        self.freed_keys = [ledger.ids_key["rejected"], ledger.ids_key["dead"]]
        self.exhausted = False  # the run's budget of usable prompts is admitted
        self._admit = client.register_script(_ADMIT)

    def try_admit(self, holder: str) -> int | None:
        """The global index of a newly admitted prompt, added to the in-flight set ``holder`` in the
        same step; or ``None`` (staleness forbids one now, or the budget is spent: then
        ``exhausted`` is set until ``reopen``)."""
        budget = -1 if self.budget is None else self.budget
        n = int(
            self._admit(
                keys=[self.admitted_key, self.version_key, *self.freed_keys, holder],
                args=[self.eta, self.prompts_per_step, budget],
            )
        )
        self.exhausted = n == -2
        return None if n < 0 else n

    def reopen(self) -> None:
        """Try admission again although the budget was spent: a rejected or dead-lettered group
        (recorded in the ledger) may have freed a slot."""
        self.exhausted = False

    def freed(self) -> int:
        """Admitted prompts whose slot was freed: rejected or dead-lettered groups."""
        return sum(self.client.scard(k) for k in self.freed_keys)

    def all_consumed(self) -> bool:
        """Whether the learner has consumed the whole budget (no freed slot can matter any more)."""
        return self.budget is not None and self.learner_version() * self.prompts_per_step >= self.budget

    def admitted(self) -> int:
        return int(self.client.get(self.admitted_key) or 0)

    def learner_version(self) -> int:
        return int(self.client.get(self.version_key) or 0)

    def publish_version(self, version: int) -> None:
        """Called by the learner after each global batch, applied or skipped (monotone)."""
        self.client.set(self.version_key, version)

    def rebase(self, admitted: int, version: int) -> None:
        """Restore both counters on resume (from the checkpoint's pipeline state)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.admitted_key, admitted)
        pipe.set(self.version_key, version)
        pipe.execute()
