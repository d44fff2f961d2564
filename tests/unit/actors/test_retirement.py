"""Retiring solved problems (rredcot/actors/retirement.py) on a real Redis server: streaks, the floor, two
generators sharing the state."""

from __future__ import annotations

from rredcot.actors.retirement import Retirement, solved
from rredcot.common.streams import registered_keys

RIGHT, WRONG = ["correct"] * 3, ["correct", "wrong", "correct"]
SOLVED, MISSED = solved(RIGHT), solved(WRONG)


def test_a_group_is_solved_only_when_every_sample_is_correct() -> None:
    assert solved(RIGHT) and not solved(WRONG) and not solved(["no_answer"] * 3) and not solved([])


def test_a_problem_retires_after_its_streak_and_a_miss_starts_the_streak_again(redis_client, run_id) -> None:
    r = Retirement(redis_client, run_id, after=2, pool=10, floor=2)
    assert not r.observe("p", SOLVED) and not r.observe("p", MISSED)  # streak 1, then broken
    assert not r.observe("p", SOLVED) and not r.is_retired("p")  # streak 1 again
    assert r.observe("p", SOLVED) and r.is_retired("p") and not r.is_retired("q")  # streak 2: retired now
    assert not r.observe("p", SOLVED) and r.retired() == 1  # retired once


def test_the_floor_keeps_a_steps_worth_of_problems_active(redis_client, run_id) -> None:
    """Pool 5, floor 2: at most 3 problems retire, however often the others are solved."""
    r = Retirement(redis_client, run_id, after=1, pool=5, floor=2)
    newly = [r.observe(p, SOLVED) for p in "abcde" for _ in range(3)]
    assert sum(newly) == 3 and r.retired() == 3
    assert [r.is_retired(p) for p in "abcde"] == [True, True, True, False, False]


def test_two_generators_share_the_streaks_and_the_retired_set(redis_client, run_id) -> None:
    """What one generator saw counts for the other (and for a resumed run: the state is in Redis)."""
    g0, g1 = (Retirement(redis_client, run_id, after=2, pool=10, floor=1) for _ in range(2))
    assert not g0.observe("p", SOLVED) and g1.observe("p", SOLVED)
    assert g0.is_retired("p") and Retirement(redis_client, run_id, after=2, pool=10, floor=1).is_retired("p")
    assert set(registered_keys(redis_client, run_id)) >= {
        f"rredcot:{run_id}:retire:streaks",
        f"rredcot:{run_id}:retire:retired",
    }  # cleared with the run


def test_off_retires_nothing_and_writes_nothing(redis_client, run_id) -> None:
    r = Retirement(redis_client, run_id, after=0, pool=3, floor=1)
    assert not r.observe("p", SOLVED) and not r.is_retired("p") and r.retired() == 0
    assert redis_client.keys(f"rredcot:{run_id}:*") == []
