"""Stream semantics on a real Redis-protocol server (the embedded Valkey)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rredcot.common.codec import decode, encode
from rredcot.common.records import RecordError, RolloutGroup
from rredcot.common.streams import (
    DEAD,
    ROLLOUTS,
    Backpressure,
    Consumer,
    Producer,
    connect,
    dead_letters,
    key,
    parse_autoclaim,
)
from rredcot.launch.services import EmbeddedRedis
from tests.factories import rollout_group


def _streams(client, run_id, maxlen=100, claim_idle_ms=30_000, name="c1"):
    prod = Producer(client, key(run_id, ROLLOUTS), maxlen=maxlen, block_timeout_s=5)
    cons = Consumer(client, key(run_id, ROLLOUTS), "redistributors", name, key(run_id, DEAD), claim_idle_ms)
    return prod, cons


def test_put_read_ack_deletes(redis_client, run_id):
    prod, cons = _streams(redis_client, run_id)
    groups = [rollout_group(seed=i) for i in range(5)]
    for g in groups:
        prod.put(encode(g))
    entries = cons.read(count=10, block_ms=100)
    assert [decode(e.payload, RolloutGroup).group_id for e in entries] == [g.group_id for g in groups]
    cons.ack([e.id for e in entries])
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 0  # acked entries are deleted
    assert redis_client.xpending(key(run_id, ROLLOUTS), "redistributors")["pending"] == 0


def test_backpressure_blocks_instead_of_dropping(redis_client, run_id):
    prod, cons = _streams(redis_client, run_id, maxlen=3)
    for i in range(3):
        prod.put(b"x%d" % i)
    prod.block_timeout_s = 0.3
    t0 = time.monotonic()
    with pytest.raises(Backpressure, match="stayed full"):
        prod.put(b"x3")
    assert time.monotonic() - t0 >= 0.3
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 3  # nothing trimmed, nothing added

    # A consumer frees room while the producer waits: the put then succeeds.
    prod.block_timeout_s = 10

    def drain():
        time.sleep(0.3)
        entries = cons.read(count=1, block_ms=100)
        cons.ack([e.id for e in entries])

    t = threading.Thread(target=drain)
    t.start()
    prod.put(b"x3")
    t.join()
    payloads = [e.payload for e in cons.read(count=10, block_ms=100)]
    assert payloads == [b"x1", b"x2", b"x3"]
    assert prod.blocked_s > 0.2


def test_dead_letter_keeps_payload_and_reason(redis_client, run_id):
    prod, cons = _streams(redis_client, run_id)
    good = rollout_group()
    prod.put(b"not msgpack at all")
    prod.put(encode(good))
    decoded = []
    for entry in cons.read(count=10, block_ms=100):
        try:
            decoded.append(decode(entry.payload, RolloutGroup))
            cons.ack([entry.id])
        except RecordError as e:
            cons.dead_letter(entry, str(e))
    assert [g.group_id for g in decoded] == [good.group_id]
    dead = list(dead_letters(redis_client, key(run_id, DEAD)))
    assert len(dead) == 1
    assert b"not a valid msgpack" in dead[0][b"reason"] and dead[0][b"d"] == b"not msgpack at all"
    assert redis_client.xlen(key(run_id, ROLLOUTS)) == 0


_CRASHING_CONSUMER = textwrap.dedent("""
    import sys, time
    from rredcot.common.streams import Consumer, connect
    url, stream, dead = sys.argv[1:4]
    c = Consumer(connect(url), stream, "redistributors", "doomed", dead)
    got = c.read(count=5, block_ms=2000)
    print(len(got), flush=True)
    time.sleep(60)  # holds the entries un-acked until SIGKILL
""")


def test_killed_consumer_entries_are_reclaimed(redis_server, redis_client, run_id):
    stream = key(run_id, ROLLOUTS)
    prod, _ = _streams(redis_client, run_id)
    groups = [rollout_group(seed=i) for i in range(8)]
    for g in groups:
        prod.put(encode(g))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_CONSUMER, redis_server.url, stream, key(run_id, DEAD)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "5"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    survivor = Consumer(redis_client, stream, "redistributors", "survivor", key(run_id, DEAD), claim_idle_ms=200)
    seen, deadline = [], time.monotonic() + 10
    while len(seen) < 8 and time.monotonic() < deadline:
        entries = survivor.read(count=10, block_ms=100)
        seen += [decode(e.payload, RolloutGroup).group_id for e in entries]
        survivor.ack([e.id for e in entries])
    assert sorted(seen) == sorted(g.group_id for g in groups)  # produced = acked, none lost
    assert survivor.reclaimed == 5
    assert redis_client.xlen(stream) == 0


def test_restart_with_aof_keeps_unread_and_pending(tmp_path):
    server = EmbeddedRedis(tmp_path / "r").start()
    try:
        client = connect(server.url, retries=40)
        run_id = "restart"
        prod, cons = _streams(client, run_id)
        groups = [rollout_group(seed=i) for i in range(4)]
        for g in groups:
            prod.put(encode(g))
        first = cons.read(count=1, block_ms=100)  # one delivered, not acked
        time.sleep(1.2)  # appendfsync everysec
        server.stop()
        server.start()
        # same client object: redis-py reconnects with backoff
        pending = cons.pending_mine()
        rest = cons.read(count=10, block_ms=100)
        assert [e.id for e in pending] == [e.id for e in first]
        got = [decode(e.payload, RolloutGroup).group_id for e in pending + rest]
        assert got == [g.group_id for g in groups]
    finally:
        server.stop()


def test_reconnect_waits_for_server_to_come_back(tmp_path):
    server = EmbeddedRedis(tmp_path / "r").start()
    try:
        client = connect(server.url, retries=60, cap_s=0.5)
        client.set("k", "v")
        server.stop()
        restarter = threading.Timer(1.0, server.start)
        restarter.start()
        assert client.get("k") == b"v"  # blocks in backoff until the server is back (AOF kept k)
        restarter.join()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("reply", "gone"),
    [
        ([b"0-0", [[b"1-0", [b"d", b"x"]], [b"2-0", None]]], [b"2-0"]),  # Redis 6.2: deleted entries have nil fields
        ([b"0-0", [[b"1-0", [b"d", b"x"]]], [b"2-0"]], [b"2-0"]),  # Redis 7+ / Valkey: deleted ids listed apart
        ([b"0-0", [(b"1-0", {b"d": b"x"})], []], []),  # client-parsed dict fields, nothing deleted
    ],
)
def test_autoclaim_reply_shapes(reply, gone):
    """The live entry, and the deleted-while-pending ids the consumer acks (``reclaim``: nil-field entries
    + the deleted list), exactly: a subset test passed when 2-0 was dropped."""
    cursor, entries, deleted = parse_autoclaim(reply)
    assert cursor == b"0-0"
    live = [e for e in entries if e.payload is not None]
    assert [(e.id, e.payload) for e in live] == [(b"1-0", b"x")]
    assert [e.id for e in entries if e.payload is None] + deleted == gone
