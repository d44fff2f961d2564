"""The checkpoint layout on a hand-built tree: which checkpoints are complete, the newest, and what a
finished run drops; found without torch."""

from __future__ import annotations

import subprocess
import sys

from rredcot.learner.checkpoint_dirs import (
    PIPELINE_FILE,
    checkpoint_dir,
    complete_checkpoints,
    drop_training_state,
    latest_checkpoint,
)


def test_only_complete_checkpoints_count_newest_last_and_a_finished_run_keeps_its_model(tmp_path):
    for version, files in ((2, ["hf/model", "ds/state"]), (10, ["hf/model", "ds/state"]), (11, ["hf/model"])):
        folder = checkpoint_dir(tmp_path, version)
        for name in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"x" * version)
        if version != 11:  # no pipeline.json: still being written, never picked
            (folder / PIPELINE_FILE).write_text("{}")
    (tmp_path / "step-00000012.partial").mkdir()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000010"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000010"
    assert latest_checkpoint(tmp_path / "none") is None and complete_checkpoints(tmp_path / "none") == []
    assert (
        drop_training_state(tmp_path) == 2 + 2 + 2 + 10
    )  # the older one whole (pipeline.json "{}" too), the newest one's ds/
    assert sorted(p.name for p in (tmp_path / "step-00000010").iterdir()) == ["hf", PIPELINE_FILE]
    assert drop_training_state(tmp_path) == 0


def test_the_layout_imports_no_torch():
    """The report finds a run's final model with it: importing torch and DeepSpeed there cost 3.9 s."""
    code = "import sys, rredcot.learner.checkpoint_dirs; print(sorted({'torch', 'deepspeed'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
