"""The learner's replay log: what it trained since its newest checkpoint, kept until the next one.

A learner acknowledges (and deletes) its ``batches`` entries right after each step, so a crash
would lose every group trained after the newest checkpoint: the restored weights never saw them.
Before it acknowledges a step's entries each rank appends the payload of each group it trained,
with the ids of the samples it trained of it and tagged with the step, to its own stream
``rredcot:<run>:replay:<rank>``; a checkpoint empties it. What a step only acknowledged (a second
copy of a group, a sample trained in an earlier step) is not recorded. A resumed (or restarted)
learner first retrains, step by step, the samples recorded after its checkpoint's step: every
group reaches the restored weights exactly once, and nothing is asked of the generators.
Entries tagged at or before the checkpoint's step (a crash between the checkpoint and the
emptying) are skipped. With several ranks, every rank replays every step up to the last one any
rank recorded, empty where it recorded nothing (an empty share). Each rank also records the step's
assignment (every rank's entry ids, the same on all): a rank that died after the step's all-reduce
but before its record leaves its share unrecorded while the others recorded theirs, and its
successor retrains that share from the entries the assignment names, still in the ``batches``
stream (nobody acknowledged them), so the replayed step trains the whole global batch.
"""

from __future__ import annotations

from itertools import groupby
from typing import TypeVar

import msgpack
import redis

from rredcot.common.streams import PAYLOAD, run_key

STEP = b"step"
IDS = b"ids"
SHARES = b"shares"  # a step's assignment: the entry ids of each rank's share, in rank order
T = TypeVar("T")
Trained = tuple[bytes, list[str] | None]  # a group's payload and the ids of its samples a step trained (None: all)


class ReplayLog:
    """One learner rank's log of what it trained since its newest checkpoint."""

    def __init__(self, client: redis.Redis, run_id: str, rank: int) -> None:
        self.client = client
        self.stream = run_key(client, run_id, f"replay:{rank}")

    def record(self, step: int, trained: list[Trained], shares: list[list[bytes]]) -> None:
        """Append what was trained at ``step`` and the step's assignment (before its ``batches`` entries
        are acknowledged)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.stream, {STEP: step, SHARES: msgpack.packb(shares)})
        for payload, ids in trained:
            pipe.xadd(self.stream, {STEP: step, PAYLOAD: payload, IDS: msgpack.packb(ids)})
        pipe.execute()

    def clear(self) -> None:
        """A checkpoint now holds everything recorded: forget it."""
        self.client.delete(self.stream)

    def after(self, step: int) -> list[tuple[int, list[Trained]]]:
        """(step, what it trained) of every step recorded after ``step``, oldest first (a step with an
        empty share: an empty list)."""
        entries = [(int(f[STEP]), f) for _, f in self.client.xrange(self.stream)]
        return [
            (s, [(f[PAYLOAD], _ids(f)) for _, f in group if PAYLOAD in f])
            for s, group in groupby((e for e in entries if e[0] > step), key=lambda e: e[0])
        ]

    def shares(self, step: int) -> list[list[bytes]]:
        """The assignment recorded for ``step`` (every rank's entry ids); empty if none was."""
        for _, f in self.client.xrange(self.stream):
            if int(f[STEP]) == step and SHARES in f:
                return msgpack.unpackb(f[SHARES])
        return []

    def __len__(self) -> int:
        return int(self.client.xlen(self.stream))


def steps_to_replay(recorded: dict[int, list[T]], after: int, last: int) -> list[list[T]]:
    """Each step from ``after + 1`` to ``last`` (the last any rank recorded), with what this rank
    recorded for it, or nothing: every rank replays the same steps, so their collectives stay in step."""
    return [recorded.get(step, []) for step in range(after + 1, last + 1)]


def _ids(fields: dict[bytes, bytes]) -> list[str] | None:
    """The trained sample ids of a log entry; None (all of the group's) in a log written before
    they were recorded."""
    return msgpack.unpackb(fields[IDS]) if IDS in fields else None
