"""The compared arms' slip measures, from hand-built evaluations whose counts give known rates."""

import math

from rredcot.launch.study.step_slips import arm_slips, halving_step, rate, slips_table, weak_kind


def _eval(step: int, product: list[int], sums_in_wrong: list[int]) -> dict:
    return {
        "step": step,
        "steps": {"all": {"*": product, "+": [0, 50]}, "in_wrong": {"*": product, "+": sums_in_wrong}},
    }


def test_rates_pool_kinds_and_a_kind_never_seen_is_nan():
    assert rate({"*": [3, 10], "+": [1, 30]}, ["*"]) == 0.3
    assert rate({"*": [3, 10], "+": [1, 30]}, ["*", "+"]) == 0.1
    assert math.isnan(rate({"*": [3, 10]}, ["-"]))


def test_the_weak_kind_its_halving_and_the_collateral_by_hand():
    # grpo: products 0.30 -> 0.20 -> 0.16 (never halved); oracle: 0.30 -> 0.14 at step 20
    grpo = [[_eval(0, [3, 10], [2, 20]), _eval(20, [2, 10], [4, 20]), _eval(40, [16, 100], [6, 20])]]
    oracle = [[_eval(0, [3, 10], [2, 20]), _eval(20, [14, 100], [0, 20]), _eval(40, [1, 10], [1, 20])]]
    assert weak_kind([grpo[0][0], oracle[0][0]]) == "*"
    assert halving_step(grpo[0], "*") is None and halving_step(oracle[0], "*") == 20
    s = arm_slips({"grpo": grpo, "oracle": oracle})
    assert s["weak_kind"] == "*" and s["other_kinds"] == ["+"]
    g, o = s["arms"]["grpo"], s["arms"]["oracle"]
    assert g["steps"] == [0, 20, 40] and [round(x, 3) for x in g["weak_slip_rate"]] == [0.3, 0.2, 0.16]
    assert o["halving_step"] == [20] and g["halving_step"] == [None]
    assert (g["collateral_right_start"], g["collateral_right_end"]) == (0.9, 0.7)
    assert (o["collateral_right_start"], o["collateral_right_end"]) == (0.9, 0.95)
    table = "\n".join(slips_table(s))
    assert "| oracle | 0: 0.300, 20: 0.140, 40: 0.100 | 20 | 0.900 → 0.950 |" in table
    assert "| grpo | 0: 0.300, 20: 0.200, 40: 0.160 | never |" in table


def test_runs_without_step_counts_give_no_slip_measures():
    assert arm_slips({"grpo": [[{"step": 0, "steps": None}]]}) is None
    assert arm_slips({"grpo": [[{"step": 0}]]}) is None
