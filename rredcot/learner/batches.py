"""Each learner rank's share of a global batch, read from the ``batches`` stream.

A step takes ``generation.prompts_per_step`` groups. Every rank first reads its count of entries
(consumer group ``learner``; ``read``), then the ranks swap what they read (entry ids, group ids
and token counts only; ``balance``) and assign the groups to ranks by tokens, longest first, each
to the least-loaded rank, so the slowest rank no longer sets the step at 25k tokens. A rank
fetches the entries assigned to it that another rank read and takes them over (``Consumer.hold``),
so a crashed rank's entries are reclaimed from it, not from the reader.

Never twice in one step: an entry read again (XAUTOCLAIM also reclaims the reader's own idle
entries while it waits longer than ``redis.claim_idle_ms``; held entries are renewed meanwhile),
the same group in two entries (a redistributor that re-sent it after a crash), or a sample already
trained in an earlier step (a Redis set of rollout ids, written after the step). A rank reads on
past such copies until it holds its count of new groups, and the ranks then swap the ids of the
new groups they hold (``top_up``): copies of one group that two ranks read, one each, count once,
and the ranks read the groups still missing, so that every step trains its full count. A
restarted rank first takes the entries still pending under its name (what its dead predecessor
held).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import redis

from rredcot.common.codec import decode
from rredcot.common.ledger import Ledger, mean_length
from rredcot.common.records import RecordError, WeightedGroup, check_vocabulary
from rredcot.common.streams import Consumer, Entry
from rredcot.learner.packing import TrainSample, samples_from_group
from rredcot.learner.replay import Trained

# all-gather of one bytes object per rank (rank order); None for a single rank
Gather = Callable[[bytes], list[bytes]]


@dataclass
class Batch:
    """What this rank trains in one step, and the entries to acknowledge after it."""

    entries: list[Entry] = field(default_factory=list)  # this rank's, acknowledged after the step
    samples: list[TrainSample] = field(default_factory=list)
    groups: dict[str, int] = field(default_factory=dict)  # group id -> mean length, of what this rank consumed
    spans: dict[str, tuple[list[int], int]] = field(default_factory=dict)  # group id -> ``version_span``
    duplicates: int = 0  # samples dropped as already trained or seen twice
    trained: list[Trained] = field(default_factory=list)  # the groups ``samples`` come from (the replay log's)
    shares: list[list[bytes]] = field(default_factory=list)  # every rank's first copies (entry ids), rank order


def group_length(group: WeightedGroup) -> int:
    """The group's mean completion length, as the ledger records it."""
    return mean_length(s.rollout.completion_ids for s in group.samples)


def version_span(group: WeightedGroup) -> tuple[list[int], int]:
    """The policy versions the group's tokens came from (distinct, ascending) and the scorer's behind its σ."""
    versions = {int(v) for s in group.samples for v in s.rollout.version_runs[:, 1]}
    return sorted(versions), group.scorer_version


def assign(tokens: list[int], world: int) -> list[int]:
    """The rank of each group: longest first, each to the rank with the fewest tokens so far
    (ties: the lower rank); deterministic, so every rank computes the same assignment."""
    load = [0] * world
    owner = [0] * len(tokens)
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += tokens[i]
    return owner


class BatchReader:
    """One rank's reader of the ``batches`` stream (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        consumer: Consumer,
        ledger: Ledger,
        trained_key: str,
        rank: int,
        world: int,
        per_step: int,
        vocab: int,
    ) -> None:
        self.client, self.consumer, self.ledger, self.trained_key = client, consumer, ledger, trained_key
        self.rank, self.world, self.per_step, self.vocab = rank, world, per_step, vocab
        self.need = per_step // world + (rank < per_step % world)
        self._backlog: deque[Entry] | None = None  # entries pending under this rank's name at its start
        self._got: dict[bytes, tuple[Entry, WeightedGroup]] = {}  # this step's entries so far
        self._new: set[str] = set()  # this step's group ids that count toward its groups

    def _next_entries(self, count: int, block_ms: int) -> list[Entry]:
        """What a restarted rank held when it died first (pending under its name), then the stream's."""
        if self._backlog is None:
            self._backlog = deque(self.consumer.pending_mine())
        if self._backlog:
            return [self._backlog.popleft() for _ in range(min(count, len(self._backlog)))]
        return self.consumer.read(count=count, block_ms=block_ms)

    def read(self, stop_requested: Callable[[], bool]) -> list[tuple[Entry, WeightedGroup]] | None:
        """A step's entries until they hold this rank's ``need`` groups that are new (None once a stop
        is requested), each entry once. A second copy of a group, or a group trained in an earlier
        step, is kept (it is acknowledged after the step) but does not count: else the step would
        train fewer groups and the run would end with admitted groups untrained. Malformed entries go
        to the dead-letter stream."""
        self._got, self._new = {}, set()
        return self._read_until(stop_requested, self.need)

    def top_up(
        self, own: list[tuple[Entry, WeightedGroup]], gather: Gather, stop_requested: Callable[[], bool]
    ) -> list[tuple[Entry, WeightedGroup]] | None:
        """``own`` and what this rank reads more until the ranks together hold ``per_step`` distinct
        new groups: a group that two ranks read, one copy each, counts once. Every rank calls it
        after ``read`` (one all-gather of group ids per round, usually one round); None on every
        rank once any rank saw a stop request while reading more."""
        while self.world > 1:
            stopped = own is None
            rounds = [msgpack.unpackb(b) for b in gather(msgpack.packb([stopped, sorted(self._new)]))]
            if any(stop for stop, _ in rounds):
                return None
            short = self.per_step - len({gid for _, gids in rounds for gid in gids})
            if short <= 0:
                break
            mine = short // self.world + (self.rank < short % self.world)  # the same split on every rank
            if mine:
                own = self._read_until(stop_requested, len(self._new) + mine)
        return own

    def _read_until(self, stop_requested: Callable[[], bool], target: int) -> list[tuple[Entry, WeightedGroup]] | None:
        """Read on until this step holds ``target`` new groups (``read``'s rules)."""
        got, new = self._got, self._new
        renew_s = self.consumer.claim_idle_ms / 4000  # held entries are renewed 4x within the idle time
        block_ms = max(1, min(200, int(renew_s * 1000)))
        last_hold = time.perf_counter()
        while len(new) < target:
            if stop_requested():
                return None
            entries = self._next_entries(target - len(new), block_ms)
            # an own entry reclaimed back is taken once
            read = [(e, g) for e in entries if e.id not in got and (g := self._decode(e)) is not None]
            for (entry, group), trained in zip(read, self._trained_before([g for _, g in read]), strict=True):
                got[entry.id] = (entry, group)
                if not trained:
                    new.add(group.group_id)
            if got and time.perf_counter() - last_hold > renew_s:
                self.consumer.hold(list(got))
                last_hold = time.perf_counter()
        return list(got.values())

    def balance(self, own: list[tuple[Entry, WeightedGroup]], gather: Gather | None) -> Batch:
        """This rank's share of the global batch made of every rank's ``own`` (``gather``: the ranks'
        all-gather; None for one rank)."""
        mine = [(e.id, g.group_id, sum(len(s.rollout.completion_ids) for s in g.samples)) for e, g in own]
        per_rank = [mine] if gather is None else [msgpack.unpackb(b) for b in gather(msgpack.packb(mine))]
        everything = [tuple(x) for rank_list in per_rank for x in rank_list]
        first: dict[str, int] = {}
        unique = [i for i, (_, gid, _) in enumerate(everything) if first.setdefault(gid, i) == i]
        owner = dict(zip(unique, assign([everything[i][2] for i in unique], self.world), strict=True))
        first_copies = {everything[i][0] for i in unique}  # entry ids
        held = {e.id: (e, g) for e, g in own}
        taken = [everything[i][0] for i in unique if owner[i] == self.rank and everything[i][0] not in held]
        self.consumer.hold(taken)
        held |= {e.id: (e, None if e.payload is None else self._decode(e)) for e in self.consumer.fetch(taken)}
        batch, seen = Batch(shares=[[] for _ in range(self.world)]), set()
        for i, rank in owner.items():
            batch.shares[rank].append(everything[i][0])
        for i, (entry_id, _, _) in enumerate(everything):
            if i in owner:  # a group's first copy: its owner trains it
                if owner[i] != self.rank:
                    continue
            elif entry_id not in held or entry_id in first_copies:  # a second copy: its reader acknowledges it
                continue
            entry, group = held[entry_id]
            batch.entries.append(entry)
            if group is None:  # deleted from the stream meanwhile
                continue
            batch.groups[group.group_id] = group_length(group)
            batch.spans[group.group_id] = version_span(group)
            samples = samples_from_group(group)
            if i not in owner:
                batch.duplicates += len(samples)
                continue
            new = [s for s in samples if s.id not in seen]
            batch.duplicates += len(samples) - len(new)
            batch.samples += new
            batch.trained.append((entry.payload, [s.id for s in new]))
            seen.update(s.id for s in new)
        return self._fresh(batch)

    def _trained_before(self, groups: list[WeightedGroup]) -> list[bool]:
        """For each group, whether every one of its samples was trained in an earlier step (one
        round trip for all of them)."""
        ids = [[s.rollout.id for s in g.samples] for g in groups]
        pipe = self.client.pipeline(transaction=False)
        for group_ids in filter(None, ids):
            pipe.smismember(self.trained_key, group_ids)
        answers = iter(pipe.execute())
        return [bool(group_ids) and all(next(answers)) for group_ids in ids]

    def _decode(self, entry: Entry) -> WeightedGroup | None:
        """The entry's group; None when it is malformed or holds a token id outside the model's
        vocabulary (dead-lettered: an embedding lookup would fail on every restart)."""
        group = None
        try:
            if entry.payload is None:
                raise RecordError("entry has no payload")
            group = decode(entry.payload, WeightedGroup)
            check_vocabulary(group.token_arrays(), self.vocab, "the learner's")
            return group
        except RecordError as e:
            if group is None:
                self.ledger.record_unreadable(entry.id, "learner_RecordError")
            else:
                self.ledger.record("dead", {group.group_id: group_length(group)}, "learner_RecordError")
            self.consumer.dead_letter(entry, f"learner: {e}")
            return None

    def _fresh(self, batch: Batch) -> Batch:
        """``batch`` without the samples whose rollout id was trained in an earlier step, and without
        the groups left with none in its record of what it trains."""
        if batch.samples:
            seen = self.client.smismember(self.trained_key, [s.id for s in batch.samples])
            batch.duplicates += sum(map(bool, seen))
            batch.samples = [s for s, dup in zip(batch.samples, seen, strict=True) if not dup]
        kept = {s.id for s in batch.samples}
        batch.trained = [(payload, fresh) for payload, ids in batch.trained if (fresh := [i for i in ids if i in kept])]
        return batch
