"""Staleness-bounded prompt admission shared by all generators (AReaL's rule), kept in Redis.

A generator may admit prompt number ``n`` (0-based, counted once across all generators) only
while ``n < (learner_version + eta + 1) * prompts_per_step``, where ``learner_version`` is the
number of global batches the learner has consumed. That equals the policy version except after a
skipped step (all-zero advantages or a non-finite loss): the step still consumes its batch and
advances admission, or the generators would wait forever for a version that never comes. No
sample is trained more than ``eta`` versions after the version that generated it; ``eta = 0`` is
synchronous on-policy training. The admission count doubles as the global dataset position, so every admitted prompt is
a distinct problem and a resumed run continues where it stopped.
"""

from __future__ import annotations

import redis

from rredcot.common.streams import key

_ADMIT = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
if n < (v + tonumber(ARGV[1]) + 1) * tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], n + 1)
  return n
end
return -1
"""


class Admission:
    """The run's admission counter and published learner version."""

    def __init__(self, client: redis.Redis, run_id: str, prompts_per_step: int, eta: int) -> None:
        self.client, self.prompts_per_step, self.eta = client, prompts_per_step, eta
        self.admitted_key = key(run_id, "admitted")
        self.version_key = key(run_id, "learner_version")
        self._admit = client.register_script(_ADMIT)

    def try_admit(self) -> int | None:
        """The global index of a newly admitted prompt, or ``None`` if staleness forbids one now."""
        n = int(self._admit(keys=[self.admitted_key, self.version_key], args=[self.eta, self.prompts_per_step]))
        return None if n < 0 else n

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
