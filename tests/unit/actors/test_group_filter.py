from hypothesis import given
from hypothesis import strategies as st

from rredcot.actors.group_filter import UniformGroups, uniform


def test_a_group_is_uniform_when_every_reward_is_the_same():
    assert uniform([1.0, 1.0, 1.0]) and uniform([0.0, 0.0]) and not uniform([0.0, 1.0, 0.0])


def test_uniform_groups_are_dropped_mixed_ones_kept_and_off_means_off():
    f = UniformGroups(enabled=True, pool=10, name="gen0")
    assert f.drop([1.0, 1.0]) and f.drop([0.0, 0.0]) and not f.drop([0.0, 1.0])
    assert f.in_a_row == 0  # a mixed group resets the count
    assert not UniformGroups(enabled=False, pool=10, name="gen0").drop([1.0, 1.0])


@given(st.integers(1, 20), st.integers(1, 200))
def test_of_any_run_of_uniform_groups_one_in_pool_plus_one_is_passed_on(pool, groups):
    """A policy that solves everything never stalls the run: after ``pool`` drops in a row one passes."""
    f = UniformGroups(enabled=True, pool=pool, name="gen0")
    passed = [i for i in range(groups) if not f.drop([1.0, 1.0])]
    assert passed == list(range(pool, groups, pool + 1))
