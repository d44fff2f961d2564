"""The study reads the rollout groups a run saved (its traces/rollouts folder), or says where they come from."""

from __future__ import annotations

import numpy as np
import pytest

from rredcot.common.codec import encode
from rredcot.common.errors import UserError
from rredcot.launch.cli import main
from rredcot.launch.study.traces import load_traces
from tests.factories import rollout_group


def test_saved_rollout_groups_load_in_name_order(tmp_path) -> None:
    groups = [rollout_group(seed=s) for s in range(3)]
    (tmp_path / "rollouts").mkdir()
    for name, g in zip(["b", "a", "c"], groups):
        (tmp_path / "rollouts" / f"red0-{name}.msgpack").write_bytes(encode(g))
    (tmp_path / "red0-a.msgpack").write_bytes(b"a weighted group: not read")
    loaded = load_traces(tmp_path)  # a run's traces/ folder: its rollouts/ subfolder
    assert [g.group_id for g in loaded] == [groups[1].group_id, groups[0].group_id, groups[2].group_id]
    assert np.array_equal(loaded[0].samples[1].completion_ids, groups[1].samples[1].completion_ids)
    assert [g.group_id for g in load_traces(tmp_path / "rollouts")] == [g.group_id for g in loaded]


def test_no_saved_groups_says_where_they_come_from(tmp_path) -> None:
    with pytest.raises(UserError, match=f"no saved rollout groups.*{tmp_path}.*credit.save_traces.*--problems"):
        load_traces(tmp_path)


def test_study_arguments_are_checked_before_anything_starts(capsys) -> None:
    assert main(["study", "credit", "tests", "--mc-samples", "1"]) == 2
    assert "--mc-samples must be >= 2 (got 1)" in capsys.readouterr().err
