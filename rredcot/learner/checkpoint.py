"""Checkpoints that resume exactly: HF model dir + DeepSpeed state + pipeline state.

Layout of ``<root>/step-<version:08d>/``:

- ``hf/``: ``save_pretrained`` safetensors + config (+ tokenizer when given), loadable by
  transformers and vLLM;
- ``ds/``: DeepSpeed ``save_checkpoint`` (partitioned fp32 weights, optimizer state, engine
  counters) written by every rank;
- ``pipeline.json``: learner version and counters, the caller's pipeline state (stream positions,
  dataloader position, staleness counters, ...) and the RNG states of python, numpy and torch.

A checkpoint is written to ``step-<v>.partial`` and renamed into place once every rank is done,
so it exists only complete; ``resume=auto`` picks the newest. Only the newest ``keep`` are kept;
a finished run that will not resume (a comparison's) can keep just its model
(``checkpoint_dirs.drop_training_state``).
A write that fails (a full disk) removes its partial directory and raises ``CheckpointError``, on
every rank when it fails on one: a rank whose write failed still goes through every collective of
the save, and the ranks then agree on the outcome, so none is left waiting in a collective that the
others skipped. The trainer goes on after a periodic one and fails the run only when the final one
cannot be written.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rredcot.common.errors import UserError
from rredcot.learner.checkpoint_dirs import PIPELINE_FILE, checkpoint_dir, complete_checkpoints, latest_checkpoint
from rredcot.learner.engine import LearnerEngine
from rredcot.learner.weights import full_state, take_part


class CheckpointError(UserError):
    """A checkpoint could not be written (its partial directory is removed, older ones are kept)."""

    label = "checkpoint"


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))


def save_checkpoint(
    engine: LearnerEngine,
    root: str | Path,
    pipeline: dict[str, Any] | None = None,
    tokenizer: Any = None,
    keep: int = 2,
) -> Path:
    """Write a checkpoint of the engine's current version (a collective: every rank calls it).

    Every rank writes into ``step-<v>.partial``; rank 0 then renames it into place, so a crash
    mid-write leaves the previous checkpoints intact and none is ever half overwritten.
    """
    final = checkpoint_dir(root, engine.version)
    path = final.with_name(final.name + ".partial")
    if engine.rank == 0:
        shutil.rmtree(path, ignore_errors=True)  # left by a crash during an earlier write
    if engine.world > 1:
        dist.barrier()
    error: OSError | RuntimeError | None = None
    try:
        _write(engine, path, pipeline, tokenizer)
    except (OSError, RuntimeError) as e:  # a full disk, a quota, a size limit (torch.save: RuntimeError)
        error = e
    # every rank's part is written, or every rank raises
    if engine.all_reduce([float(error is not None)], ["max"])[0] > 0:
        if engine.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        free = shutil.disk_usage(Path(root)).free / 2**20
        why = "another learner rank could not write its part"
        if error is not None:
            why = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
        raise CheckpointError(
            f"could not write checkpoint {final.name} in {root} ({why}; {free:.0f} MiB free): free "
            f"disk space or set run.dir elsewhere; the newest complete checkpoint is still {latest_checkpoint(root)}"
        ) from error
    if engine.rank == 0:
        if final.exists():  # the same version saved again (e.g. right after a resume): swap, never merge
            old = final.with_name(final.name + ".old")
            os.replace(final, old)
            os.replace(path, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(path, final)
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    if engine.world > 1:
        dist.barrier()
    return final


def _write(engine: LearnerEngine, path: Path, pipeline: dict[str, Any] | None, tokenizer: Any) -> None:
    """This rank's part of a checkpoint into ``path``: DeepSpeed's state; on rank 0 also the HF
    directory (the other ranks take part in the gathers of the full weights, collectives under
    ZeRO-3, and copy nothing) and the pipeline record."""
    if engine.rank == 0:
        state = full_state(engine.module)
    else:
        take_part(engine.module)
    _save_deepspeed(engine, path / "ds")
    if engine.rank == 0:
        engine.module.save_pretrained(path / "hf", state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path / "hf")
        record = {
            "version": engine.version,
            "counters": engine.counters,
            "pipeline": pipeline or {},
            "rng": rng_state(),
        }
        (path / PIPELINE_FILE).write_text(json.dumps(record))


class _DeferredErrors:
    """Wraps writes so that the first one that fails keeps its error instead of raising it, and the
    later ones are skipped."""

    def __init__(self) -> None:
        self.error: OSError | RuntimeError | None = None

    def wrap(self, write: Callable[..., object]) -> Callable[..., None]:
        def deferred(*args: Any, **kwargs: Any) -> None:
            if self.error is None:
                try:
                    write(*args, **kwargs)
                except (OSError, RuntimeError) as e:
                    self.error = e

        return deferred


@contextlib.contextmanager
def _deferred_writes(ds: Any) -> Iterator[_DeferredErrors]:
    """DeepSpeed engine ``ds`` with the errors of its checkpoint's writes deferred: those of its
    checkpoint engine (every rank's state) and rank 0's copy of DeepSpeed's recovery scripts, all
    that its ``save_checkpoint`` writes without "latest"."""
    writes = _DeferredErrors()
    methods = [(ds.checkpoint_engine, "makedirs"), (ds.checkpoint_engine, "save"), (ds, "_copy_recovery_script")]
    for owner, name in methods:
        setattr(owner, name, writes.wrap(getattr(owner, name)))
    try:
        yield writes
    finally:
        for owner, name in methods:
            delattr(owner, name)  # the class's method again


def _save_deepspeed(engine: LearnerEngine, path: Path) -> None:
    """DeepSpeed's state of this rank into ``path``. A write that fails raises only after DeepSpeed's
    save, so this rank still takes part in each of its collectives (barriers, ZeRO-3 gathers)."""
    with _deferred_writes(engine.engine) as writes:
        engine.engine.save_checkpoint(str(path), tag="state", save_latest=False)
    if writes.error is not None:
        raise writes.error


def load_checkpoint(engine: LearnerEngine, path: str | Path) -> dict[str, Any]:
    """Restore weights, optimizer, version, counters and RNG from ``path``; returns the pipeline state."""
    path = Path(path)
    record = json.loads((path / PIPELINE_FILE).read_text())
    missing = FileNotFoundError(f"no DeepSpeed state in {path / 'ds'}: this checkpoint holds a model only")
    if not (path / "ds").is_dir():  # DeepSpeed would fail on a bare assertion
        raise missing
    loaded, _ = engine.engine.load_checkpoint(str(path / "ds"), tag="state")
    if loaded is None:
        raise missing
    engine.version = int(record["version"])
    engine.counters = dict(record["counters"])
    set_rng_state(record["rng"])
    return record["pipeline"]
