"""The learner loop's decisions that its ranks share (real Redis; ranks as threads)."""

from __future__ import annotations

import threading

from rredcot.learner.trainer import published_version
from rredcot.transports.manifest import version_key


def test_every_rank_takes_the_published_version_rank_0_read(redis_client, run_id, thread_gather, on_ranks):
    """A resume renumbers the restored weights above the newest published version, 5; rank 0 then
    publishes them as 6, which a slower rank 1 would read and renumber its own to 7: the ranks would
    write one checkpoint into two directories. Every rank takes what rank 0 read."""
    redis_client.set(version_key(run_id), 5)
    gather_for, rank_0_read = thread_gather(2), threading.Event()

    def rank_0_publishes_next(data: bytes) -> list[bytes]:
        redis_client.set(version_key(run_id), 6)
        rank_0_read.set()
        return gather_for(0)(data)

    def read(rank: int) -> int:
        if rank == 0:
            return published_version(redis_client, run_id, 0, rank_0_publishes_next)
        assert rank_0_read.wait(10), "rank 0 did not share what it read"
        return published_version(redis_client, run_id, 1, gather_for(1))

    assert on_ranks(2, read) == [5, 5]
