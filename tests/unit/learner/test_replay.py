"""The learner's replay log on a real Redis server: recorded per step, read back after a step, cleared."""

from __future__ import annotations

from rredcot.common.streams import PAYLOAD, key, registered_keys
from rredcot.learner.replay import STEP, ReplayLog, steps_to_replay


def test_steps_after_a_checkpoint_come_back_in_order_and_a_clear_forgets_them(redis_client, run_id):
    log = ReplayLog(redis_client, run_id, rank=1)
    log.record(3, [(b"a", ["a1", "a2"]), (b"b", ["b2"])], [[b"1-0"], [b"1-1", b"1-2"]])  # b: one sample trained before
    log.record(4, [], [[b"2-0"], []])  # a step with nothing trained on this rank: its assignment only
    log.record(5, [(b"c", ["c1"])], [[b"3-0"], [b"3-1"]])
    log.record(6, [(b"d", ["d1"]), (b"e", ["e1"])], [[], [b"4-0", b"4-1"]])
    assert len(log) == 9 and key(run_id, "replay:1") in registered_keys(redis_client, run_id)
    assert log.after(0) == [
        (3, [(b"a", ["a1", "a2"]), (b"b", ["b2"])]),
        (4, []),
        (5, [(b"c", ["c1"])]),
        (6, [(b"d", ["d1"]), (b"e", ["e1"])]),
    ]
    assert log.after(5) == [(6, [(b"d", ["d1"]), (b"e", ["e1"])])]  # a crash between a checkpoint at 5 and its clear
    assert log.shares(4) == [[b"2-0"], []] and log.shares(6) == [[], [b"4-0", b"4-1"]]
    assert log.shares(7) == []  # not recorded
    assert ReplayLog(redis_client, run_id, rank=0).after(0) == []  # each rank has its own
    log.clear()
    assert len(log) == 0 and log.after(0) == [] and log.shares(3) == []


def test_every_rank_replays_the_same_steps_empty_where_it_recorded_nothing():
    """Rank 1 had an empty share at step 4 and died before recording step 6; rank 0 recorded 6: both
    replay steps 3..6 (the last any rank recorded), rank 1 empty at 4 and 6."""
    rank1 = {3: ["a"], 5: ["b", "c"]}
    assert steps_to_replay(rank1, after=2, last=6) == [["a"], [], ["b", "c"], []]
    assert steps_to_replay(rank1, after=5, last=5) == []  # nothing after the checkpoint
    assert steps_to_replay({}, after=2, last=2) == []


def test_a_log_written_before_sample_ids_were_recorded_replays_whole_groups(redis_client, run_id):
    """A run resumed across the upgrade: its log entries hold a step and a payload only."""
    log = ReplayLog(redis_client, run_id, rank=0)
    redis_client.xadd(log.stream, {STEP: 2, PAYLOAD: b"g"})
    log.record(3, [(b"h", ["h1"])], [[b"5-0"]])
    assert log.after(0) == [(2, [(b"g", None)]), (3, [(b"h", ["h1"])])]
    assert log.shares(2) == []  # nor its assignment: a rank that did not record step 2 replays it empty
