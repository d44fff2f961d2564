"""The run's ledger: what became of every admitted prompt group, kept in Redis.

Admitted prompt ``n`` (the global admission index) is group ``group_id(run, n)``. Each group ends
in one outcome: ``trained`` (consumed by a learner step, recorded before its entry is
acknowledged), ``dead`` (dead-lettered, with the reason) or ``rejected`` (it made no group for the
learner: a prompt too long for the context, an invalid record, a group dynamic sampling dropped, a
retired problem; with the reason). Until then it is in flight: held by a
generator, or an entry of the ``rollouts`` or ``batches`` stream. So at any quiet moment

    admitted = trained + dead + rejected + in flight,

and an admitted group in none of them is *missing*: the report names it. Outcomes are sets of
group ids, so recording one twice (a replayed step, a re-sent group) counts it once; a group in
two outcomes is reported too. Each recorded group keeps its mean completion length, so the report
shows every outcome by length bucket: a drop that favours short answers is visible. A trained group
also keeps its version truth (``GroupVersions``): the policy versions of its oldest and newest
tokens, of the scorer that computed its σ and of the learner that trained it, and how many updates
its oldest token lagged. A dead letter
whose payload could not be read has no group id; it is kept under its stream entry id and counted
as ``dead_unattributed`` (each may explain one missing group).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sized
from dataclasses import asdict, astuple, dataclass, field
from typing import Any

import redis

from rredcot.common.codec import decode
from rredcot.common.records import RecordError, RolloutGroup, WeightedGroup
from rredcot.common.streams import BATCHES, PAYLOAD, ROLLOUTS, key, registered_keys, run_key

OUTCOMES = ("trained", "dead", "rejected")
LENGTH_BUCKETS = ((1024, "lt1k"), (4096, "lt4k"), (16384, "lt16k"))
UNATTRIBUTED = "entry:"  # prefix of a dead letter's key when its group id could not be read
_IDS = uuid.UUID("5d1f0c1e-9a41-4c53-9b8e-6a0f3f0a2b7d")  # the ids of every run so far


def group_id(run_id: str, index: int, sample: int | None = None) -> str:
    """Deterministic id of admitted prompt ``index`` (and of one of its samples)."""
    return uuid.uuid5(_IDS, f"{run_id}:{index}:{'' if sample is None else sample}").hex


def length_bucket(n_tokens: int) -> str:
    """The completion-length bucket of per-length metrics: lt1k, lt4k, lt16k or ge16k."""
    return next((name for limit, name in LENGTH_BUCKETS if n_tokens < limit), "ge16k")


def mean_length(completions: Iterable[Sized]) -> int:
    """A group's mean completion length in tokens (what the ledger buckets it by)."""
    lengths = [len(c) for c in completions]
    return sum(lengths) // max(1, len(lengths))


@dataclass(frozen=True)
class GroupVersions:
    """The policy versions behind a trained group: its tokens' oldest and newest, the scorer's that
    computed its σ, the learner's that trained it, and ``lag``: the updates its oldest token was
    behind the learner, along the run's history (``common.lineage``)."""

    oldest: int
    newest: int
    scorer: int
    learner: int
    lag: int

    def text(self) -> str:
        return " ".join(str(v) for v in astuple(self))

    @classmethod
    def parse(cls, text: str | bytes) -> GroupVersions:
        return cls(*(int(v) for v in (text.decode() if isinstance(text, bytes) else text).split()))


@dataclass
class Balance:
    """The ledger against the admission counter and what is in flight now."""

    admitted: int
    trained: int
    dead: int
    rejected: int
    in_flight: int
    dead_by_reason: dict[str, int] = field(default_factory=dict)
    rejected_by_reason: dict[str, int] = field(default_factory=dict)  # too_long, invalid, uniform, retired, ...
    dead_unattributed: int = 0
    missing: list[str] = field(default_factory=list)  # admitted, in no outcome and not in flight
    in_flight_ids: list[str] = field(default_factory=list)  # admitted, in no outcome, in flight now
    in_two_outcomes: list[str] = field(default_factory=list)
    by_length: dict[str, dict[str, int]] = field(default_factory=dict)  # outcome -> bucket -> groups
    trained_by_lag: dict[int, int] = field(default_factory=dict)  # lag of the oldest token -> trained groups

    @property
    def balanced(self) -> bool:
        return not self.missing and not self.in_two_outcomes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"balanced": self.balanced}

    def line(self) -> str:
        """One line for the log and the report."""
        text = (
            f"admitted {self.admitted} = trained {self.trained} + dead-lettered {self.dead} + rejected "
            f"{self.rejected} + in flight {self.in_flight}"
        )
        if self.missing:
            text += f"; MISSING {len(self.missing)}: {', '.join(self.missing[:10])}"
        if self.in_two_outcomes:
            text += f"; in two outcomes: {', '.join(self.in_two_outcomes[:10])}"
        return text + ("" if self.balanced else " (does not balance)")

    def untrained(self) -> str:
        """What a run that took all its steps left of its promise that every admitted group ends
        trained, dead-lettered or rejected once: groups still in flight at its end, missing ones, a
        group in two outcomes; "" when nothing."""
        why = []
        if self.in_flight:
            why.append(
                f"{self.in_flight} admitted group(s) never trained (in flight at the end: "
                f"{', '.join(self.in_flight_ids[:10])})"
            )
        if self.missing:
            why.append(f"{len(self.missing)} admitted group(s) missing ({', '.join(self.missing[:10])})")
        if self.in_two_outcomes:
            why.append(f"{len(self.in_two_outcomes)} group(s) in two outcomes ({', '.join(self.in_two_outcomes[:10])})")
        return "; ".join(why)


def inflight_key(client: redis.Redis, run_id: str, worker: str) -> str:
    """The set of admission indices generator ``worker`` holds (admitted, group not yet written)."""
    return run_key(client, run_id, f"inflight:{worker}")


def in_flight(client: redis.Redis, run_id: str) -> set[str]:
    """Group ids in flight now: held by a generator, or an entry of the rollouts or batches stream."""
    prefix = key(run_id, "inflight:")
    ids = {
        group_id(run_id, int(i))
        for k in registered_keys(client, run_id)
        if k.startswith(prefix)
        for i in client.smembers(k)
    }
    for name, kind in ((ROLLOUTS, RolloutGroup), (BATCHES, WeightedGroup)):
        for _, fields in client.xrange(key(run_id, name)):
            try:
                ids.add(decode(fields[PAYLOAD], kind).group_id)
            except (KeyError, RecordError):  # unreadable: it will be dead-lettered, under its entry id
                continue
    return ids


def balance_now(client: redis.Redis, run_id: str) -> Balance:
    """The run's ledger against its admission counter and what is in flight now."""
    return Ledger(client, run_id).balance(int(client.get(key(run_id, "admitted")) or 0), in_flight(client, run_id))


class Ledger:
    """Records outcomes (any tier) and balances them (the driver, at the end of a run)."""

    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.ids_key = {o: run_key(client, run_id, f"ledger:{o}") for o in OUTCOMES}
        self.length_key = run_key(client, run_id, "ledger:length")  # group id -> mean completion tokens
        self.reason_key = run_key(client, run_id, "ledger:reason")  # dead or rejected group id -> reason
        self.versions_key = run_key(client, run_id, "ledger:versions")  # trained group id -> GroupVersions

    def record(
        self, outcome: str, groups: dict[str, int], reason: str = "", versions: dict[str, GroupVersions] | None = None
    ) -> None:
        """``groups`` (group id -> mean completion tokens) ended in ``outcome`` (``reason``: why, for dead
        and rejected; ``versions``: a trained group's version truth, kept from its first training)."""
        if not groups:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.ids_key[outcome], *groups)
        pipe.hset(self.length_key, mapping=groups)
        if reason:
            pipe.hset(self.reason_key, mapping=dict.fromkeys(groups, reason))
        for g, v in (versions or {}).items():  # the first training holds; a re-sent copy or replay keeps it
            pipe.hsetnx(self.versions_key, g, v.text())
        pipe.execute()

    def versions(self) -> dict[str, GroupVersions]:
        """Each trained group's version truth (group id -> ``GroupVersions``)."""
        return {k.decode(): GroupVersions.parse(v) for k, v in self.client.hgetall(self.versions_key).items()}

    def record_unreadable(self, entry_id: bytes, reason: str) -> None:
        """A dead letter whose group id could not be read (malformed payload)."""
        self.record("dead", {UNATTRIBUTED + entry_id.decode(): 0}, reason)

    def balance(self, admitted: int, in_flight: set[str]) -> Balance:
        """The ledger against ``admitted`` prompts and the group ids ``in_flight`` now."""
        ids = {o: {m.decode() for m in self.client.smembers(k)} for o, k in self.ids_key.items()}
        unattributed = {i for i in ids["dead"] if i.startswith(UNATTRIBUTED)}
        ids["dead"] -= unattributed
        lengths = {k.decode(): int(v) for k, v in self.client.hgetall(self.length_key).items()}
        reason_of = {k.decode(): v.decode() for k, v in self.client.hgetall(self.reason_key).items()}
        reasons = {o: Counter(r for g, r in reason_of.items() if g in ids[o]) for o in ("dead", "rejected")}
        counts = Counter(i for o in OUTCOMES for i in ids[o])
        dispatched = [group_id(self.run_id, n) for n in range(admitted)]
        accounted = set(counts) | in_flight
        return Balance(
            admitted=admitted,
            trained=len(ids["trained"]),
            dead=len(ids["dead"]),
            rejected=len(ids["rejected"]),
            in_flight=len(in_flight - set(counts)),
            in_flight_ids=sorted(in_flight - set(counts)),
            dead_by_reason=dict(reasons["dead"]),
            rejected_by_reason=dict(reasons["rejected"]),
            dead_unattributed=len(unattributed),
            missing=[g for g in dispatched if g not in accounted],
            in_two_outcomes=sorted(g for g, c in counts.items() if c > 1),
            by_length={o: dict(Counter(length_bucket(lengths.get(g, 0)) for g in ids[o])) for o in OUTCOMES if ids[o]},
            trained_by_lag=dict(sorted(Counter(v.lag for v in self.versions().values()).items())),
        )
