"""Staleness-bounded prompt admission shared by all generators (AReaL's rule), kept in Redis.

A generator may admit prompt number ``n`` (0-based, counted once across all generators) only
while ``n < (learner_version + eta + 1) * prompts_per_step``, where ``learner_version`` is the
number of global batches the learner has consumed. That equals the policy version except after a
skipped step (all-zero advantages or a non-finite loss): the step still consumes its batch and
advances admission, or the generators would wait forever for a version that never comes. No
sample is trained more than ``eta`` versions after the version that generated it; ``eta = 0`` is
synchronous on-policy training. The admission count doubles as the global dataset position, so every admitted prompt is
a distinct problem and a resumed run continues where it stopped. A prompt a generator cannot use
(longer than the context) is *rejected*: it keeps its dataset position but frees its admission
slot, so the learner still receives ``prompts_per_step`` groups per step. With a ``budget`` (the
prompts a run needs: steps × prompts per step), admission ends once that many usable prompts
were admitted.
"""

from __future__ import annotations

import redis

from rredcot.common.streams import run_key

_ADMIT = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
local used = n - tonumber(redis.call('GET', KEYS[3]) or '0')
local budget = tonumber(ARGV[3])
if budget >= 0 and used >= budget then
  return -2
end
if used < (v + tonumber(ARGV[1]) + 1) * tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], n + 1)
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
        self.rejected_key = run_key(client, run_id, "rejected_prompts")
        self.exhausted = False  # the run's budget of usable prompts is admitted
        self._admit = client.register_script(_ADMIT)

    def try_admit(self) -> int | None:
        """The global index of a newly admitted prompt, or ``None`` (staleness forbids one now, or
        the budget is spent: then ``exhausted`` is set)."""
        budget = -1 if self.budget is None else self.budget
        n = int(
            self._admit(
                keys=[self.admitted_key, self.version_key, self.rejected_key],
                args=[self.eta, self.prompts_per_step, budget],
            )
        )
        self.exhausted = n == -2
        return None if n < 0 else n

    def reject(self) -> None:
        """Give back the slot of an admitted prompt that produced no group (its position stays used):
        the budget has room again, so admission is tried again."""
        self.client.incr(self.rejected_key)
        self.exhausted = False

    def rejected(self) -> int:
        return int(self.client.get(self.rejected_key) or 0)

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
