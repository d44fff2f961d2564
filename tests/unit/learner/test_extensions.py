"""JIT-build locks: a build in progress is waited for, a lock a killed build left is removed."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from rredcot.learner.extensions import SHM_OP, await_build_locks, build_key, extensions_dir, holding_shm_op


def _lock(root: Path, op: str, age_s: float) -> Path:
    lock = root / op / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_lock_a_killed_build_left_is_removed_with_a_warning(tmp_path, caplog):
    lock = _lock(tmp_path, "deepspeed_shm_comm", age_s=200)
    with caplog.at_level(logging.WARNING, logger="rredcot.learner.extensions"):
        assert await_build_locks(tmp_path, stale_s=180) == [lock]
    assert not lock.exists()
    assert "deepspeed_shm_comm/lock" in caplog.text and "killed while building" in caplog.text


def test_a_build_in_progress_is_waited_for_not_broken(tmp_path):
    lock = _lock(tmp_path, "op", age_s=0)
    threading.Timer(0.5, lock.unlink).start()  # the builder finishes
    t0 = time.monotonic()
    assert await_build_locks(tmp_path, stale_s=180, poll_s=0.05) == []
    assert time.monotonic() - t0 >= 0.4


def test_a_young_lock_whose_builder_died_is_removed_once_it_is_stale(tmp_path):
    lock = _lock(tmp_path, "op", age_s=0.8)
    t0 = time.monotonic()
    assert await_build_locks(tmp_path, stale_s=1.0, poll_s=0.05) == [lock]
    assert 0.1 <= time.monotonic() - t0 < 5 and not lock.exists()


def test_a_shm_op_lock_no_living_learner_can_hold_is_removed_at_once(tmp_path):
    """A learner killed while it loaded DeepSpeed's op (a node lost as the ranks start) left the lock:
    the restarted learners went on at once, not after STALE_LOCK_S (a suite's node-lost run waited 178 s)."""
    lock = _lock(tmp_path, SHM_OP, age_s=0)
    t0 = time.monotonic()
    assert await_build_locks(tmp_path, stale_s=180, poll_s=0.05) == [lock]
    assert time.monotonic() - t0 < 5 and not lock.exists()


def test_a_shm_op_lock_of_a_learner_loading_it_is_waited_for(tmp_path):
    with holding_shm_op(tmp_path):  # a living learner inside its load
        lock = _lock(tmp_path, SHM_OP, age_s=0)
        threading.Timer(0.5, lock.unlink).start()  # its load finishes
        t0 = time.monotonic()
        assert await_build_locks(tmp_path, stale_s=180, poll_s=0.05) == []
        assert time.monotonic() - t0 >= 0.4


def test_the_extensions_dir_is_one_shared_cache_per_environment(monkeypatch):
    """One directory for every process of one environment; another compiler (or another .venv's torch
    and DeepSpeed) builds in a directory of its own instead of over this one's build."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    here = extensions_dir()
    assert here.parent == Path.home() / ".cache" / "torch_extensions" and here.name == build_key()
    assert extensions_dir() == here  # stable, and kept in the environment for torch to read
    monkeypatch.setenv("CXX", "clang++")
    assert extensions_dir() != here  # a parent's choice is not inherited by a different environment
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/somewhere/else")
    assert extensions_dir() == Path("/somewhere/else")  # the user's own choice is kept


def test_the_environments_own_ninja_runs_every_build(monkeypatch):
    """A node's worker (the .venv's bin on PATH, as the launch scripts set it) and a process started
    without it used two ninja versions, each discarding the other's build log: every switch rebuilt
    the op."""
    own = Path(sys.executable).parent
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    extensions_dir()
    if (own / "ninja").is_file():
        assert shutil.which("ninja") == str(own / "ninja")
        assert os.environ["PATH"] == f"{own}:/usr/bin:/bin"
        extensions_dir()
        assert os.environ["PATH"] == f"{own}:/usr/bin:/bin"  # once
    else:  # no ninja of its own (a GPU image's system one): PATH as it was
        assert os.environ["PATH"] == "/usr/bin:/bin"
