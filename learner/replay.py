"""The learner's replay log: what it trained since its newest checkpoint, kept until the next one.

A learner acknowledges (and deletes) its ``batches`` entries right after each step, so a crash
would lose every group trained after the newest checkpoint: the restored weights never saw them.
Before it acknowledges a step's entries each rank appends their payloads, tagged with the step,
to its own stream ``rredcot:<run>:replay:<rank>``; a checkpoint empties it. A resumed (or
restarted) learner first retrains, step by step, the entries tagged after its checkpoint's step:
every group reaches the restored weights exactly once, and nothing is asked of the generators.
Entries tagged at or before the checkpoint's step (a crash between the checkpoint and the
emptying) are skipped. With several ranks, every rank replays every step up to the last one any
rank recorded, empty where it recorded nothing (an empty share, or a death before it recorded).
"""

from __future__ import annotations

from itertools import groupby
from typing import TypeVar

import redis

from rredcot.common.streams import PAYLOAD, run_key

STEP = b"step"
T = TypeVar("T")


class ReplayLog:
    """One learner rank's log of trained ``batches`` payloads since its newest checkpoint."""

    def __init__(self, client: redis.Redis, run_id: str, rank: int) -> None:
        self.client = client
        self.stream = run_key(client, run_id, f"replay:{rank}")

    def record(self, step: int, payloads: list[bytes]) -> None:
        """Append the payloads trained at ``step`` (before their ``batches`` entries are acknowledged)."""
        if not payloads:
            return
        pipe = self.client.pipeline(transaction=False)
        for payload in payloads:
            pipe.xadd(self.stream, {STEP: step, PAYLOAD: payload})
        pipe.execute()

    def clear(self) -> None:
        """A checkpoint now holds everything recorded: forget it."""
        self.client.delete(self.stream)

    def after(self, step: int) -> list[tuple[int, list[bytes]]]:
        """(step, payloads) of every step recorded after ``step``, oldest first."""
        entries = [(int(f[STEP]), f[PAYLOAD]) for _, f in self.client.xrange(self.stream)]
        return [
            (s, [payload for _, payload in group])
            for s, group in groupby((e for e in entries if e[0] > step), key=lambda e: e[0])
        ]

    def __len__(self) -> int:
        return int(self.client.xlen(self.stream))


def steps_to_replay(recorded: dict[int, list[T]], after: int, last: int) -> list[list[T]]:
    """Each step from ``after + 1`` to ``last`` (the last any rank recorded), with what this rank
    recorded for it, or nothing: every rank replays the same steps, so their collectives stay in step."""
    return [recorded.get(step, []) for step in range(after + 1, last + 1)]
