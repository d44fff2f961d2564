"""A run never deletes what it did not create: run directories and Redis keys; a run.dir it cannot
make or write in is one line naming it, before anything starts."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.common.control import RunControl
from rredcot.common.ledger import inflight_key
from rredcot.common.staleness import Admission
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, Consumer, Producer, run_key
from rredcot.launch import driver
from rredcot.launch.cli import main
from rredcot.launch.driver import train
from rredcot.launch.run_dir import (
    RUN_MARKER,
    RunDirError,
    claim_run_dir,
    clear_run_dir,
    clear_run_keys,
    run_dir_problem,
)

EARLIER_RUN = ("logs/gen0.log", "checkpoints/step-1/x", "report/summary.md", "tensorboard/ev", "redis/aof", "traces/t")


def _fill(root: Path, files: tuple[str, ...]) -> None:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)


def _run_keys(client, run: str) -> set[str]:
    """The keys a run's workers write, made by the real components; returns their names."""
    control = RunControl(client, run)
    control.request_stop("done")
    control.publish_metrics("gen0", "generator", {"tokens": 1})
    Admission(client, run, prompts_per_step=2, eta=1).try_admit(inflight_key(client, run, "gen0"))
    Producer(client, run_key(client, run, ROLLOUTS), maxlen=8).put(b"x")
    Consumer(client, run_key(client, run, BATCHES), "learner", "learner0", run_key(client, run, DEAD))
    return {k.decode() for k in client.keys(f"rredcot:{run}:*")}


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[Path]:
    """``path`` made unwritable for this process: its mode for a user, the immutable attribute for
    root, whom modes do not stop (the test skips where neither is possible)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield path
        finally:
            path.chmod(mode)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("root, and no immutable attribute here: nothing is unwritable to root")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def train_line(run_dir: Path, monkeypatch, capsys, *overrides: str) -> str:
    """``rredcot train tests run.dir=<run_dir>``'s error line; it must exit 2 before the run starts."""
    monkeypatch.setattr(driver, "lead_own_process_group", lambda cfg: None)  # keep pytest's process group

    def started(*args: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(driver, "_run", started)
    assert main(["train", "tests", f"run.dir={run_dir}", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: cannot start: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("resume", ["never", "auto"])
def test_a_run_dir_that_is_a_file_or_lies_under_one_is_one_line(tmp_path, monkeypatch, capsys, resume):
    """It was a misleading 'not empty' (never) or a raw FileExistsError / NotADirectoryError (exit 1)."""
    (afile := tmp_path / "afile").write_text("keep\n")
    err = train_line(afile, monkeypatch, capsys, f"run.resume={resume}")
    assert f"run.dir: {afile} is a file -> set run.dir to a directory, or to a path rredcot creates" in err, err
    err = train_line(afile / "run", monkeypatch, capsys, f"run.resume={resume}")
    assert f"run.dir: {afile / 'run'} lies under {afile}, which is a file -> set run.dir to a path under" in err, err
    assert afile.read_text() == "keep\n" and sorted(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("below", ["", "run"], ids=["the run.dir", "its parent"])
def test_a_run_dir_this_user_cannot_write_is_one_line(tmp_path, monkeypatch, capsys, below):
    """It was a raw PermissionError (exit 1) from the claim or the lock."""
    (parent := tmp_path / "ro").mkdir()
    with unwritable(parent):
        err = train_line(parent / below, monkeypatch, capsys)
        assert run_dir_problem(parent / below) in err
    assert f"run.dir: {parent / below}: this user cannot write in {parent} (" in err, err
    assert "-> set run.dir to a directory this user can write" in err
    assert list(parent.iterdir()) == []


def test_a_run_dir_the_run_can_make_has_no_problem(tmp_path):
    assert run_dir_problem(tmp_path) == run_dir_problem(tmp_path / "a" / "b") == ""
    assert list(tmp_path.iterdir()) == []  # nothing made to find out


def test_train_refuses_to_clear_a_directory_it_did_not_create(tmp_path, monkeypatch):
    """``run.dir=.`` over a directory with someone's files: a one-line error, nothing deleted, no
    Ray started (``train`` claims the directory before it starts any service)."""
    _fill(tmp_path, (*EARLIER_RUN, "notes.txt"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config("tests", ["run.dir=."])
    with pytest.raises(RunDirError) as e:
        train(cfg)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg and RUN_MARKER in msg
    assert "another run.dir or run.name" in msg and "run.resume=auto" in msg
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("marker", [None, "someone-else"])
def test_claim_needs_this_runs_marker_to_start_afresh(tmp_path, marker):
    _fill(tmp_path, EARLIER_RUN)
    if marker:
        (tmp_path / RUN_MARKER).write_text(marker)
    with pytest.raises(RunDirError, match="no .rredcot-run file naming run 'exp'"):
        claim_run_dir(tmp_path, "exp", "never")
    claim_run_dir(tmp_path, "exp", "auto")  # resuming deletes nothing, and does not mark it as exp's
    assert (tmp_path / RUN_MARKER).exists() == bool(marker)
    assert all((tmp_path / name).exists() for name in EARLIER_RUN)


def test_a_run_dir_created_by_the_run_is_cleared_and_every_path_logged(tmp_path, caplog):
    run_dir = tmp_path / "runs" / "exp"
    claim_run_dir(run_dir, "exp", "never")  # a new directory: created with the marker
    assert (run_dir / RUN_MARKER).read_text() == "exp\n"
    _fill(run_dir, (*EARLIER_RUN, "logs/driver.log", "notes.txt", "placement.json"))
    claim_run_dir(run_dir, "exp", "never")  # the same run again: its own directory, no error
    with caplog.at_level(logging.INFO, logger="rredcot.launch.run_dir"):
        clear_run_dir(run_dir, keep=run_dir / "logs" / "driver.log")
    doomed = [run_dir / p for p in ("checkpoints", "logs/gen0.log", "placement.json", "redis", "report")]
    doomed += [run_dir / p for p in ("tensorboard", "traces")]
    assert not any(p.exists() for p in doomed)
    assert (run_dir / "logs" / "driver.log").exists() and (run_dir / "notes.txt").exists()
    assert (run_dir / RUN_MARKER).exists()
    (line,) = [r.getMessage() for r in caplog.records if "deleting" in r.getMessage()]
    assert all(str(p) in line for p in doomed) and "driver.log" not in line and "notes" not in line


def test_clearing_a_run_deletes_only_the_keys_it_registered(redis_client, run_id):
    """Run ``exp`` next to ``exp2`` (its name is a prefix), a foreign key, and a key under exp's
    namespace that no exp worker wrote: clearing exp deletes exp's keys and nothing else."""
    mine = _run_keys(redis_client, run_id)
    names = {"stop", "metrics:gen0", "admitted", "inflight:gen0", "rollouts", "batches", "keys"}
    assert mine == {f"rredcot:{run_id}:{n}" for n in names}
    theirs = _run_keys(redis_client, run_id + "2")
    foreign = [f"rredcot:{run_id}-other:x", f"rredcot:{run_id}:notes"]
    for name in foreign:
        redis_client.set(name, "not exp's")
    clear_run_keys(redis_client, run_id)
    assert not any(redis_client.exists(k) for k in mine)
    assert all(redis_client.exists(k) for k in [*theirs, *foreign])


def test_clearing_a_run_never_deletes_a_key_outside_its_prefix(redis_client, run_id):
    """Anyone who can write to Redis can add a name to a run's registry (``SADD rredcot:<run>:keys
    myapp:important``): clearing the run checks each name against the run's own prefix."""
    mine = _run_keys(redis_client, run_id)
    planted = [f"myapp:{run_id}:important", f"rredcot:{run_id}2:stop"]
    for name in planted:
        redis_client.set(name, "keep me")
        redis_client.sadd(f"rredcot:{run_id}:keys", name)
    clear_run_keys(redis_client, run_id)
    assert not any(redis_client.exists(k) for k in mine)
    assert all(redis_client.get(k) == b"keep me" for k in planted)


def test_a_glob_in_a_run_id_reaches_no_other_run(redis_client, run_id):
    """Even a run id with glob characters (refused by the config) clears only its registry."""
    theirs = _run_keys(redis_client, run_id)
    other = f"rredcot:{run_id}-other:x"
    redis_client.set(other, "x")
    clear_run_keys(redis_client, f"{run_id}*")
    assert all(redis_client.exists(k) for k in [*theirs, other])
