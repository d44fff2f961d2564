"""Each rank's share of a global batch (real Redis): once per step, taken over, balanced by tokens."""

from __future__ import annotations

import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from rredcot.common.codec import decode, encode
from rredcot.common.ledger import Ledger
from rredcot.common.records import WeightedGroup
from rredcot.common.streams import Consumer, dead_letters, key
from rredcot.learner.batches import BatchReader, assign
from tests.factories import weighted_group

GROUP = "learner"


def _stream(run_id: str) -> str:
    return key(run_id, "batches")


VOCAB = 151_936  # the factories' token ids are below 151,000


def _reader(client, run_id: str, rank: int = 0, world: int = 1, per_step: int = 2, idle_ms: int = 30_000):
    consumer = Consumer(client, _stream(run_id), GROUP, f"learner{rank}", key(run_id, "dead"), idle_ms)
    ledger, trained = Ledger(client, run_id), key(run_id, "trained_ids")
    return BatchReader(client, consumer, ledger, trained, rank, world, per_step, VOCAB)


def _put(client, run_id: str, group) -> bytes:
    return client.xadd(_stream(run_id), {b"d": encode(group)})


def _never() -> bool:
    return False


def test_assign_longest_first_to_the_least_loaded_rank():
    # 10 → r0, 8 → r1, 5 → r1 (8 < 10), 3 → r0 (10 < 13), 3 → r0 (13 = 13: the lower rank)
    assert assign([10, 8, 5, 3, 3], 2) == [0, 1, 1, 0, 0]
    assert assign([], 3) == [] and assign([4, 4], 1) == [0, 0]


@given(st.lists(st.integers(1, 25_000), max_size=40), st.integers(1, 8))
def test_assign_loads_differ_by_at_most_one_group(tokens, world):
    owner = assign(tokens, world)
    loads = [sum(t for t, r in zip(tokens, owner, strict=True) if r == rank) for rank in range(world)]
    assert sum(loads) == sum(tokens) and max(loads) - min(loads) <= max(tokens, default=0)


def test_waiting_longer_than_the_reclaim_idle_time_reads_no_entry_twice(redis_client, run_id):
    """The reader holds one entry and waits 2.5 s for the second with claim_idle_ms = 1000: XAUTOCLAIM
    would hand it the held entry again (and another rank could take it) unless it is renewed. (The
    renewal every idle/4 leaves 750 ms for a stall of the reader's thread; at 200 ms the test failed
    on a machine at load 7, where the thread was not scheduled for longer than 150 ms.)"""
    reader = _reader(redis_client, run_id, per_step=2, idle_ms=1000)
    thief = Consumer(redis_client, _stream(run_id), GROUP, "learner1", key(run_id, "dead"), 1000)
    first = _put(redis_client, run_id, weighted_group(seed=1))
    stolen = []

    def late_second_and_a_thief() -> None:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            stolen.extend(thief._reclaim(10))
            time.sleep(0.1)
        _put(redis_client, run_id, weighted_group(seed=2))

    other = threading.Thread(target=late_second_and_a_thief)
    other.start()
    own = reader.read(_never)
    other.join()
    ids = [e.id for e, _ in own]
    assert len(ids) == 2 and len(set(ids)) == 2 and first in ids
    assert stolen == []
    batch = reader.balance(own, None)
    assert len(batch.samples) == 8 and len({s.id for s in batch.samples}) == 8 and batch.duplicates == 0


def test_a_group_with_a_token_outside_the_vocabulary_is_dead_lettered_and_the_step_goes_on(redis_client, run_id):
    """Such an id would fail the embedding lookup (a device-side assert on CUDA) on every restart: the
    group is dead-lettered under its id, which frees its admission slot, and the step reads on."""
    bad, good, other = (weighted_group(seed=s) for s in (7, 8, 9))
    bad.samples[1].rollout.completion_ids[5] = VOCAB  # one past the last token
    for g in (bad, good, other):
        _put(redis_client, run_id, g)
    own = _reader(redis_client, run_id).read(_never)
    assert [g.group_id for _, g in own] == [good.group_id, other.group_id]
    (letter,) = dead_letters(redis_client, key(run_id, "dead"))
    reason = f"samples[1].completion_ids holds token id {VOCAB}, outside the learner's vocabulary"
    assert reason in letter[b"reason"].decode()
    assert redis_client.sismember(Ledger(redis_client, run_id).ids_key["dead"], bad.group_id)


def test_a_group_sent_twice_or_already_trained_is_trained_once_and_the_step_still_takes_its_count(redis_client, run_id):
    """A redistributor killed after sending a group sends it again when it restarts: the copy is
    acknowledged, not trained, and not counted, so the step still trains ``per_step`` new groups
    (a fault test once ended with 7 of 8 groups trained and one left in flight)."""
    group, done, other, third = (weighted_group(seed=s) for s in (3, 4, 5, 6))
    reader = _reader(redis_client, run_id, per_step=3)
    for g in (group, group, done, other, third):
        _put(redis_client, run_id, g)
    trained = key(run_id, "trained_ids")
    redis_client.sadd(trained, group.samples[0].rollout.id)  # one sample trained in an earlier step
    redis_client.sadd(trained, *[s.rollout.id for s in done.samples])  # the whole group trained
    own = reader.read(_never)
    assert len(own) == 5  # read on past the copy and the trained group
    batch = reader.balance(own, None)
    assert len(batch.entries) == 5  # all are acknowledged after the step
    assert batch.shares == [[e.id for e, _ in own if e.id != own[1][0].id]]  # first copies only: not the re-sent one
    assert batch.groups.keys() == {group.group_id, done.group_id, other.group_id, third.group_id}
    assert len(batch.samples) == 3 + 4 + 4 and len({s.id for s in batch.samples}) == 11
    assert batch.duplicates == 4 + 1 + 4
    # the replay log's record: the groups trained, each with the samples it trained of them
    assert [(decode(p, WeightedGroup).group_id, ids) for p, ids in batch.trained] == [
        (group.group_id, [s.rollout.id for s in group.samples[1:]]),
        (other.group_id, [s.rollout.id for s in other.samples]),
        (third.group_id, [s.rollout.id for s in third.samples]),
    ]


def test_two_ranks_share_a_batch_by_tokens_and_take_over_their_entries(redis_client, run_id, thread_gather, on_ranks):
    """Rank 0 reads the three long groups, rank 1 the three short ones (740 vs 60 tokens per sample);
    after the balance each trains half the tokens, every group exactly once, and owns (in Redis)
    the entries it trains."""
    lengths = [400, 300, 40, 30, 20, 10]
    groups = [weighted_group(g=2, length=n, seed=10 + i) for i, n in enumerate(lengths)]
    readers = [_reader(redis_client, run_id, rank, 2, per_step=6) for rank in range(2)]
    for g in groups:
        _put(redis_client, run_id, g)
    own0, own1 = readers[0].read(_never), readers[1].read(_never)
    assert [g.group_id for _, g in own0] == [g.group_id for g in groups[:3]]
    gather_for, owns = thread_gather(2), (own0, own1)
    batches = on_ranks(2, lambda rank: readers[rank].balance(owns[rank], gather_for(rank)))
    tokens = [sum(len(s.completion_ids) for s in b.samples) for b in batches]
    assert tokens == [2 * 400, 2 * (300 + 40 + 30 + 20 + 10)]  # groups of 2 samples; unbalanced: 1400 vs 200
    ids = [s.id for b in batches for s in b.samples]
    assert len(ids) == len(set(ids)) == 12
    for rank, b in enumerate(batches):
        pending = redis_client.xpending_range(_stream(run_id), GROUP, "-", "+", 100, consumername=f"learner{rank}")
        assert {p["message_id"] for p in pending} == {e.id for e in b.entries}
        # the step's assignment, the same on every rank (the replay log's: a rank that dies before recording
        # its share is replayed from it): each rank's share by entry id
        assert b.shares == [[e.id for e in batches[0].entries], [e.id for e in batches[1].entries]]


def test_a_group_two_ranks_read_one_copy_each_counts_once_and_the_step_still_takes_its_count(
    redis_client, run_id, thread_gather, on_ranks
):
    """Rank 0 reads g1, g2 and rank 1 reads g1's re-sent copy and g3: three distinct groups for a step
    of four. The ranks find that out together and rank 0 reads g4, so the step trains four groups,
    each once; rank 1 acknowledges the copy it read."""
    g1, g2, g3, g4 = (weighted_group(g=2, seed=s) for s in (21, 22, 23, 24))
    readers = [_reader(redis_client, run_id, rank, 2, per_step=4) for rank in range(2)]
    for g in (g1, g2):
        _put(redis_client, run_id, g)
    own0 = readers[0].read(_never)
    for g in (g1, g3, g4):
        _put(redis_client, run_id, g)
    own1 = readers[1].read(_never)
    assert [g.group_id for _, g in own1] == [g1.group_id, g3.group_id]
    gather_for, owns = thread_gather(2), [own0, own1]

    def step(rank: int):
        own = readers[rank].top_up(owns[rank], gather_for(rank), _never)
        return readers[rank].balance(own, gather_for(rank))

    batches = on_ranks(2, step)
    trained = [s.id for b in batches for s in b.samples]
    assert sorted(trained) == sorted(s.rollout.id for g in (g1, g2, g3, g4) for s in g.samples)  # 8, each once
    assert sum(len(b.entries) for b in batches) == 5  # every entry read is acknowledged, the copy too


def test_a_stop_while_one_rank_reads_what_is_missing_stops_every_rank(redis_client, run_id, thread_gather, on_ranks):
    """Rank 1's only group is a copy of rank 0's, so rank 0 reads on for the missing one; nothing
    comes, a stop is requested, and both ranks leave the step together (neither waits in a gather)."""
    g1 = weighted_group(g=2, seed=31)
    readers = [_reader(redis_client, run_id, rank, 2, per_step=2) for rank in range(2)]
    _put(redis_client, run_id, g1)
    own0 = readers[0].read(_never)
    _put(redis_client, run_id, g1)  # the copy: rank 1 holds nothing new, and nothing else comes
    own1 = readers[1].read(_never)
    stop_after = time.monotonic() + 0.5
    gather_for, owns = thread_gather(2), [own0, own1]
    stopped = lambda: time.monotonic() > stop_after  # noqa: E731
    assert on_ranks(2, lambda rank: readers[rank].top_up(owns[rank], gather_for(rank), stopped)) == [None, None]
