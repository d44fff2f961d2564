"""A data file that changes under a run (rredcot/actors/data_digest.py, issue 62): the rows the run's first
start read are recorded with its Redis keys, and a later start that reads other rows is refused."""

from __future__ import annotations

import json
import os
import re

import pytest

from rredcot.actors.data_digest import checked_split
from rredcot.common.config import DataConfig, TaskConfig
from rredcot.launch.run_dir import clear_run_keys
from rredcot.tasks.data import DatasetError, train_and_held_out
from rredcot.tasks.task import build_task

ROWS = [{"problem": f"{i}+1?", "solution": rf"\boxed{{{i + 1}}}"} for i in range(6)]


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_data_file_that_changed_since_the_run_started_is_refused_on_a_restart(tmp_path, redis_client, run_id):
    """Issue 62: a restarted generator (or a resumed run) of a data.path whose rows changed trained on
    the new rows under the old problem ids, silently; now it is one line naming data.path, the
    recorded and the current digest and the fix."""
    f = tmp_path / "d.jsonl"
    _write(f, ROWS)
    task, cfg = build_task(TaskConfig("math")), DataConfig(source="jsonl", path=str(f), eval_size=2)
    first = checked_split(redis_client, run_id, task, cfg, 0)
    assert first == train_and_held_out(task, cfg, 0)  # the split every stage uses
    assert checked_split(redis_client, run_id, task, cfg, 0) == first  # the same rows: a restart goes on
    os.utime(f, (0, 0))  # a copy restored from a backup: another mtime, the same rows
    checked_split(redis_client, run_id, task, cfg, 0)
    _write(f, [ROWS[0], {"problem": "9+9?", "solution": r"\boxed{18}"}, *ROWS[2:]])  # row 2 rewritten in place
    with pytest.raises(DatasetError) as e:
        checked_split(redis_client, run_id, task, cfg, 0)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"data.path {f} changed since run {run_id!r} started")
    recorded, found = re.findall(r"6 rows, sha256 [0-9a-f]{16}", message)
    assert recorded != found and "restore the file" in message and "run.resume=never" in message
    _write(f, [*ROWS, {"problem": "new?", "solution": r"\boxed{0}"}])  # a row appended
    with pytest.raises(DatasetError, match="now gives 7 rows"):
        checked_split(redis_client, run_id, task, cfg, 0)
    clear_run_keys(redis_client, run_id)  # what run.resume=never does: the new run records the new rows
    checked_split(redis_client, run_id, task, cfg, 0)


def test_a_task_that_generates_its_problems_records_nothing(redis_client, run_id):
    task = build_task(TaskConfig("arith", {"size": 20}))
    checked_split(redis_client, run_id, task, DataConfig(eval_size=4), 0)
    checked_split(redis_client, run_id, task, DataConfig(eval_size=4), 1)  # other problems (another seed): no error
    assert not redis_client.keys(f"rredcot:{run_id}:*")
