"""The suite's scheduler (``tests/scheduling.py``, used by ``tests/conftest.py``): whole runs one at a
time, everything else file by file."""

from __future__ import annotations

from tests.scheduling import BESIDE_RUNS, TESTS, runs_in_turn


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
