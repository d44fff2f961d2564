"""The suite's scheduler (tests/conftest.py): whole runs one at a time, everything else file by file."""

from __future__ import annotations

from dataclasses import dataclass

from tests.conftest import BESIDE_RUNS, TESTS, heavy_first, runs_in_turn


def test_whole_runs_go_in_turn_and_the_rest_file_by_file() -> None:
    assert runs_in_turn("tests/integration/test_pipeline.py::test_x[rredcot]")
    assert runs_in_turn("tests/fault/test_supervision.py::test_x")
    assert runs_in_turn("tests/cluster/test_netns_cluster.py::test_x")
    assert not runs_in_turn("tests/integration/test_streams.py::test_put_read_ack_deletes")
    assert not runs_in_turn("tests/unit/learner/test_engine.py::test_x")


def test_every_test_file_named_beside_the_runs_exists() -> None:
    """A renamed file would silently join the runs (slower, never wrong): the list names real files."""
    missing = [path for path in BESIDE_RUNS if not (TESTS.parent / path).is_file()]
    assert not missing, missing


@dataclass
class Collected:
    """What ``heavy_first`` reads of a collected test: its node id and whether it is marked slow."""

    nodeid: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return name if name == "slow" and self.slow else None


def test_units_go_heaviest_first_and_each_keeps_its_order() -> None:
    """The whole runs, then files by their slow tests, then by their tests: a file of one slow test no
    longer waits for the end, where one worker ran it while the other had nothing left."""
    items = [
        Collected("tests/unit/a/test_many_fast.py::test_1"),
        Collected("tests/unit/a/test_many_fast.py::test_2"),
        Collected("tests/unit/a/test_many_fast.py::test_3"),
        Collected("tests/fault/test_supervision.py::test_1", slow=True),
        Collected("tests/unit/models/test_one_slow.py::test_1", slow=True),
        Collected("tests/integration/test_streams.py::test_1", slow=True),
        Collected("tests/integration/test_streams.py::test_2", slow=True),
        Collected("tests/cluster/test_netns_cluster.py::test_1", slow=True),
        Collected("tests/unit/a/test_few_fast.py::test_1"),
        Collected("tests/cluster/test_netns_cluster.py::test_2", slow=True),
    ]
    order = [item.nodeid for item in heavy_first(items)]
    assert order == [
        "tests/fault/test_supervision.py::test_1",  # the whole runs' unit, in collection order
        "tests/cluster/test_netns_cluster.py::test_1",
        "tests/cluster/test_netns_cluster.py::test_2",
        "tests/integration/test_streams.py::test_1",  # two slow tests
        "tests/integration/test_streams.py::test_2",
        "tests/unit/models/test_one_slow.py::test_1",  # one
        "tests/unit/a/test_many_fast.py::test_1",  # none: three tests, then one
        "tests/unit/a/test_many_fast.py::test_2",
        "tests/unit/a/test_many_fast.py::test_3",
        "tests/unit/a/test_few_fast.py::test_1",
    ]
