"""The run's ledger (real Redis): outcomes balance against admissions, the missing are named."""

from __future__ import annotations

from rredcot.common.ledger import GroupVersions, Ledger, group_id, length_bucket, mean_length


def test_outcomes_balance_and_the_missing_are_named(redis_client, run_id):
    ledger = Ledger(redis_client, run_id)
    g = [group_id(run_id, n) for n in range(8)]
    ledger.record("trained", {g[0]: 40, g[1]: 2000})
    ledger.record("trained", {g[0]: 40})  # a replayed step: counted once
    ledger.record("dead", {g[2]: 30_000}, reason="RecordError")
    ledger.record("rejected", {g[3]: 0}, reason="too_long")
    ledger.record_unreadable(b"1-0", "no_payload")
    balance = ledger.balance(admitted=8, in_flight={g[4], g[5]})
    assert (balance.trained, balance.dead, balance.rejected, balance.in_flight) == (2, 1, 1, 2)
    assert balance.dead_by_reason == {"RecordError": 1} and balance.dead_unattributed == 1
    assert balance.rejected_by_reason == {"too_long": 1}
    assert balance.missing == [g[6], g[7]] and not balance.balanced
    assert balance.by_length == {"trained": {"lt1k": 1, "lt4k": 1}, "dead": {"ge16k": 1}, "rejected": {"lt1k": 1}}
    assert "MISSING 2" in balance.line()
    ledger.record("trained", {g[6]: 10, g[7]: 10})
    assert ledger.balance(admitted=8, in_flight={g[4], g[5]}).balanced


def test_a_group_in_two_outcomes_does_not_balance(redis_client, run_id):
    ledger = Ledger(redis_client, run_id)
    g = group_id(run_id, 0)
    ledger.record("trained", {g: 5})
    ledger.record("dead", {g: 5}, reason="x")
    balance = ledger.balance(admitted=1, in_flight=set())
    assert balance.in_two_outcomes == [g] and not balance.balanced and balance.missing == []


def test_trained_groups_keep_their_version_truth(redis_client, run_id):
    ledger = Ledger(redis_client, run_id)
    g = [group_id(run_id, n) for n in range(3)]
    mixed = GroupVersions(oldest=3, newest=5, scorer=4, learner=6, lag=3)  # an update landed mid-group
    ledger.record("trained", {g[0]: 40, g[1]: 40}, versions={g[0]: mixed, g[1]: GroupVersions(5, 5, 0, 6, 1)})
    ledger.record("trained", {g[1]: 40}, versions={g[1]: GroupVersions(5, 5, 0, 7, 2)})  # a re-sent copy
    ledger.record("trained", {g[2]: 40}, versions={g[2]: GroupVersions(6, 6, 6, 6, 0)})
    assert ledger.versions()[g[0]] == mixed and GroupVersions.parse(mixed.text()) == mixed
    assert ledger.versions()[g[1]].learner == 6  # the first training holds
    assert ledger.balance(admitted=3, in_flight=set()).trained_by_lag == {0: 1, 1: 1, 3: 1}


def test_ids_and_buckets():
    assert group_id("r", 3) == group_id("r", 3) != group_id("r", 4) != group_id("r", 3, 0)
    assert [length_bucket(n) for n in (0, 1023, 1024, 4096, 16383, 25000)] == [
        "lt1k", "lt1k", "lt4k", "lt16k", "lt16k", "ge16k",
    ]  # fmt: skip
    assert mean_length([[1, 2], [3, 4, 5, 6]]) == 3 and mean_length([]) == 0
