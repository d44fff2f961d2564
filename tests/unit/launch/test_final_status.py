"""A run that took all its steps is ``finished`` only if its ledger closes: every admitted group
trained, dead-lettered or rejected once (real Redis ledger)."""

from __future__ import annotations

from rredcot.common.ledger import Ledger, group_id
from rredcot.launch.driver import UNTRAINED, final_status


def test_a_run_whose_ledger_leaves_a_group_untrained_is_not_finished(redis_client, run_id):
    """The resumed run of issue 62: 4 of 4 steps, `admitted 8 = trained 7 + … + in flight 1`, and
    `balanced: true`, was reported `finished`. The group in flight is named, and the status says it."""
    ledger = Ledger(redis_client, run_id)
    g = [group_id(run_id, n) for n in range(8)]
    ledger.record("trained", dict.fromkeys(g[:7], 20))
    balance = ledger.balance(admitted=8, in_flight={g[7]})
    assert balance.balanced and balance.in_flight == 1 and balance.in_flight_ids == [g[7]]  # it adds up ...
    status = final_status("finished", balance)  # ... but the run did not train every group it admitted
    assert (
        status.startswith(UNTRAINED) and f"1 admitted group(s) never trained (in flight at the end: {g[7]})" in status
    )
    assert "\n" not in status
    # an interrupted or failed run keeps its own status: its groups in flight are what a resume trains
    assert final_status("interrupted (SIGTERM)", balance) == "interrupted (SIGTERM)"
    assert final_status("failed: gen0: boom", balance) == "failed: gen0: boom"
    ledger.record("trained", {g[7]: 20})
    assert final_status("finished", ledger.balance(admitted=8, in_flight=set())) == "finished"
    assert final_status("finished", None) == "finished"  # no ledger (Redis gone): nothing to go by


def test_missing_groups_or_one_in_two_outcomes_are_not_finished_either(redis_client, run_id):
    ledger = Ledger(redis_client, run_id)
    g = [group_id(run_id, n) for n in range(3)]
    ledger.record("trained", {g[0]: 5, g[1]: 5})
    ledger.record("dead", {g[1]: 5}, reason="x")
    status = final_status("finished", ledger.balance(admitted=3, in_flight=set()))
    assert f"1 admitted group(s) missing ({g[2]})" in status and f"1 group(s) in two outcomes ({g[1]})" in status
