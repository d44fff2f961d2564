"""Checkpoint layout, pruning, RNG restore and the HF directory (one rank, real DeepSpeed)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rredcot.common.config import LearnerConfig
from rredcot.learner.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rredcot.learner.checkpoint_dirs import PIPELINE_FILE, complete_checkpoints, drop_training_state, latest_checkpoint
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.weights import full_state
from tests.learner_samples import file_size_limit


def test_keep_last_n_restore_rng_and_hf_dir(make_model, make_samples, tmp_path):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", lr=1e-3, zero_stage=1, micro_token_budget=128))
    for step in range(3):
        engine.train_step(make_samples(4, seed=step))
        save_checkpoint(engine, tmp_path, pipeline={"next": step + 1}, keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000002", "step-00000003"]
    (tmp_path / "step-00000009").mkdir()  # incomplete (no pipeline.json): never picked
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-00000003"
    assert json.loads((latest / PIPELINE_FILE).read_text())["version"] == 3
    after_save = (torch.rand(3), np.random.rand(), random.random())  # first draws from the saved RNG states
    trained = full_state(engine.module)

    fresh = LearnerEngine(
        make_model(seed=5), LearnerConfig(dtype="float32", lr=1e-3, zero_stage=1, micro_token_budget=128)
    )
    assert load_checkpoint(fresh, latest) == {"next": 3}
    assert fresh.version == 3 and fresh.counters["steps"] == 3
    assert torch.equal(torch.rand(3), after_save[0])
    assert (np.random.rand(), random.random()) == after_save[1:]
    assert all(torch.equal(t, trained[n]) for n, t in full_state(fresh.module).items())
    hf = AutoModelForCausalLM.from_pretrained(latest / "hf")
    assert all(torch.equal(p.detach(), trained[n]) for n, p in hf.named_parameters())

    ds_bytes = sum(f.stat().st_size for f in (latest / "ds").rglob("*") if f.is_file())
    assert drop_training_state(tmp_path) > ds_bytes > 0  # the older checkpoint went too
    assert drop_training_state(tmp_path) == 0  # again: nothing left to drop
    assert complete_checkpoints(tmp_path) == [latest] and sorted(p.name for p in latest.iterdir()) == [
        "hf",
        PIPELINE_FILE,
    ]
    assert AutoModelForCausalLM.from_pretrained(latest / "hf") is not None
    with pytest.raises(FileNotFoundError, match="no DeepSpeed state"):
        load_checkpoint(fresh, latest)


def test_a_checkpoint_that_cannot_be_written_leaves_no_partial_and_keeps_the_last(make_model, make_samples, tmp_path):
    engine = LearnerEngine(make_model(), LearnerConfig(dtype="float32", lr=1e-3, zero_stage=1, micro_token_budget=128))
    good = save_checkpoint(engine, tmp_path)
    largest = max(f.stat().st_size for f in good.rglob("*") if f.is_file())
    engine.train_step(make_samples(4, seed=0))
    with file_size_limit(largest // 2), pytest.raises(CheckpointError) as e:
        save_checkpoint(engine, tmp_path)
    assert "step-00000001" in str(e.value) and "free disk space or set run.dir" in str(e.value)
    assert str(good) in str(e.value) and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]  # no .partial left behind
    assert save_checkpoint(engine, tmp_path).name == "step-00000001"  # with room again, it saves
