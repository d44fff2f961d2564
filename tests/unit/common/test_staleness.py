"""Staleness-bounded admission on a real Redis server: hand sequences, and a simulation of
generators, lost groups and a learner checked step by step against the rule."""

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rredcot.common.ledger import Ledger, group_id
from rredcot.common.staleness import Admission
from rredcot.common.streams import key


def _holder(adm: Admission) -> str:
    """The in-flight set the tests' admissions go to (one per run)."""
    return adm.admitted_key + ":held"


def _drain(adm: Admission) -> list[int]:
    got = []
    while (i := adm.try_admit(_holder(adm))) is not None:
        got.append(i)
    return got


def test_eta_bounds_admission_per_learner_step(redis_client, run_id):
    adm = Admission(redis_client, run_id, prompts_per_step=3, eta=1)
    assert _drain(adm) == list(range(6))  # (0 + 1 + 1) * 3
    adm.publish_version(1)
    assert _drain(adm) == [6, 7, 8]
    assert not adm.exhausted


def test_an_admitted_index_is_in_the_holders_set_in_the_same_step(redis_client, run_id):
    """No crash between admission and the in-flight record can lose a prompt: the script does both."""
    adm = Admission(redis_client, run_id, prompts_per_step=2, eta=0)
    assert _drain(adm) == [0, 1] and redis_client.smembers(_holder(adm)) == {b"0", b"1"}
    other = key(run_id, "other")
    assert adm.try_admit(other) is None and not redis_client.exists(other)  # refused: nothing recorded


def test_eta_zero_is_one_step_at_a_time_shared_by_generators(redis_client, run_id):
    a = Admission(redis_client, run_id, 2, 0)
    b = Admission(redis_client, run_id, 2, 0)
    order = [a.try_admit(_holder(a)), b.try_admit(_holder(b)), a.try_admit(_holder(a)), b.try_admit(_holder(b))]
    assert order == [0, 1, None, None]
    a.publish_version(1)
    assert _drain(b) == [2, 3]


def test_rejected_prompt_frees_its_slot_but_keeps_its_position(redis_client, run_id):
    adm = Admission(redis_client, run_id, 2, 0, budget=4)
    assert _drain(adm) == [0, 1]
    Ledger(redis_client, run_id).record("rejected", {group_id(run_id, 1): 0}, "too_long")  # prompt 1 was unusable
    assert _drain(adm) == [2]  # a replacement, at the next dataset position
    adm.publish_version(1)
    assert _drain(adm) == [3, 4]
    assert adm.exhausted and adm.admitted() == 5 and adm.freed() == 1  # 4 usable prompts


def test_a_dead_lettered_group_frees_its_slot_once_even_on_a_synchronous_run(redis_client, run_id):
    """η = 0: the learner's first step waits for both groups; one is dead-lettered downstream. Its
    slot must reopen (else the learner waits forever and admission never moves), and a second
    dead letter of the same group (a re-sent copy) must not free a second one."""
    adm = Admission(redis_client, run_id, 2, 0, budget=2)
    assert _drain(adm) == [0, 1] and adm.exhausted
    ledger = Ledger(redis_client, run_id)
    for _ in range(2):
        ledger.record("dead", {group_id(run_id, 0): 7}, "RecordError")
    adm.reopen()
    assert _drain(adm) == [2] and adm.exhausted and adm.freed() == 1
    assert not adm.all_consumed()
    adm.publish_version(1)
    assert adm.all_consumed()


def test_budget_ends_admission(redis_client, run_id):
    adm = Admission(redis_client, run_id, 4, 10, budget=3)
    assert _drain(adm) == [0, 1, 2] and adm.exhausted
    assert redis_client.get(key(run_id, "admitted")) == b"3"


def test_rebase_restores_counters(redis_client, run_id):
    adm = Admission(redis_client, run_id, 2, 0)
    adm.rebase(admitted=10, version=5)
    assert adm.admitted() == 10 and adm.learner_version() == 5
    assert _drain(adm) == [10, 11]


ACTIONS = st.lists(st.tuples(st.sampled_from(["admit", "deliver", "lose", "learn"]), st.integers(0, 7)), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pps=st.integers(1, 3), eta=st.integers(0, 2), steps=st.integers(1, 4), gens=st.integers(1, 3), actions=ACTIONS)
def test_admission_follows_the_rule_under_any_interleaving(redis_client, pps, eta, steps, gens, actions):
    """Generators admit, groups reach the learner in admission order or are lost (dead-lettered),
    the learner consumes ``pps`` groups per step. Each admission is exactly what the rule allows
    (used = admitted − freed < (v + η + 1)·pps, and used < budget), indices are contiguous, each
    lands in its generator's in-flight set, and every consumed group is at most η steps older than
    the learner that trains it."""
    run_id = f"t{uuid.uuid4().hex[:10]}"
    budget = steps * pps
    adms = [Admission(redis_client, run_id, pps, eta, budget) for _ in range(gens)]
    ledger = Ledger(redis_client, run_id)
    admitted_at: list[int] = []  # learner version at each admission, by index
    in_flight: list[int] = []
    queue: list[int] = []
    freed: set[int] = set()
    version = 0
    for action, arg in actions:
        if action == "admit":
            adm = adms[arg % gens]
            used = len(admitted_at) - len(freed)
            expected = len(admitted_at) if used < min(budget, (version + eta + 1) * pps) else None
            assert adm.try_admit(_holder(adm) + str(arg % gens)) == expected
            assert adm.exhausted == (used >= budget)
            if expected is not None:
                admitted_at.append(version)
                in_flight.append(expected)
                assert redis_client.sismember(_holder(adm) + str(arg % gens), expected)
        elif action == "deliver" and in_flight:
            queue.append(in_flight.pop(0))  # in admission order
        elif action == "lose" and in_flight:
            lost = in_flight.pop(arg % len(in_flight))
            ledger.record("dead", {group_id(run_id, lost): 10}, "RecordError")
            freed.add(lost)
        elif action == "learn" and len(queue) >= pps:
            batch, queue[:] = queue[:pps], queue[pps:]
            assert all(version - admitted_at[i] <= eta for i in batch)
            version += 1
            adms[0].publish_version(version)
        assert adms[0].admitted() == len(admitted_at) and adms[0].freed() == len(freed)


def test_groups_that_reach_the_learner_out_of_order_can_be_staler_than_eta(redis_client, run_id):
    """η bounds admission, not training: with several generators (or redistributors) a slow group can
    be overtaken. η = 1, one prompt per step: prompt 0 runs long while 1, 2 and 3 are admitted and
    trained, so it is trained at version 3, three steps after it was admitted. The learner measures
    this (``staleness_max``) and its importance weights correct for it (docs/generation.md)."""
    slow, fast = Admission(redis_client, run_id, 1, 1), Admission(redis_client, run_id, 1, 1)
    assert slow.try_admit(_holder(slow)) == 0  # at version 0: the long one
    for version, index in enumerate([1, 2, 3]):
        assert fast.try_admit(_holder(fast)) == index
        fast.publish_version(version + 1)  # the learner trains the fast group
    assert fast.learner_version() - 0 == 3 > slow.eta  # prompt 0 arrives now
