"""A run holds its name: a second driver of the same run refuses before it touches the run's files;
a second run of a live name against the same Redis, whatever its run.dir, before it touches anything."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.common.streams import registry_key, run_key
from rredcot.launch.driver import train
from rredcot.launch.run_dir import RUN_MARKER
from rredcot.launch.run_lock import (
    LOCK,
    LeaseLost,
    LockFileError,
    NameLease,
    RunLocked,
    describe,
    hold,
    lease_key,
    lock_problem,
)
from tests.unit.launch.test_run_dir import train_line, unwritable

HOLDER = "import sys, time\nfrom pathlib import Path\nfrom rredcot.launch.run_lock import hold\n"
HOLDER += "hold(Path(sys.argv[1]), 'x')\nprint('held', flush=True)\ntime.sleep(600)\n"


def test_a_second_holder_is_refused_with_the_live_drivers_pid(tmp_path: Path) -> None:
    release = hold(tmp_path, "exp")
    with pytest.raises(RunLocked, match=rf"run 'exp' is already running in {tmp_path} \(driver pid {os.getpid()} on "):
        hold(tmp_path, "exp")
    release()
    hold(tmp_path, "exp")()  # free again once released


def test_a_driver_killed_by_sigkill_leaves_no_stale_lock(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(RunLocked, match=f"driver pid {proc.pid}"):
        hold(tmp_path, "x")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    hold(tmp_path, "x")()  # the kernel dropped the lock with the process


def marked(run_dir: Path) -> Path:
    """An earlier run's directory of run ``tests``: its marker and log; the lock file is the test's."""
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("tests\n")
    (run_dir / "logs" / "driver.log").write_text("the earlier run's log\n")
    return run_dir / LOCK


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (Path.mkdir, "is a directory -> remove it (rmdir "),
        (os.mkfifo, "is no regular file (a FIFO, socket or device) -> remove it (rm "),
    ],
    ids=["a directory", "a FIFO"],
)
def test_a_lock_file_that_is_no_file_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, make, says):
    """It was a raw IsADirectoryError, or ``OSError: [Errno 22] Invalid argument`` (exit 1)."""
    make(lock := marked(tmp_path / "run"))
    err = train_line(tmp_path / "run", monkeypatch, capsys)
    assert f"run.dir: the run's lock file {lock} {says}{lock}); rredcot makes it again as a file" in err, err
    assert (tmp_path / "run" / "logs" / "driver.log").read_text() == "the earlier run's log\n"
    with pytest.raises(LockFileError, match="lock file"):  # one that turns bad after the checks
        hold(tmp_path / "run", "tests")


def test_a_lock_file_this_user_cannot_write_is_one_line_before_anything_starts(tmp_path, monkeypatch, capsys):
    """Another user's run.dir: it was a raw PermissionError (exit 1)."""
    (lock := marked(tmp_path / "run")).write_text("driver pid 1 on elsewhere")
    with unwritable(lock):
        err = train_line(tmp_path / "run", monkeypatch, capsys)
        assert lock_problem(tmp_path / "run") in err
    assert f"run.dir: the run's lock file {lock} cannot be opened for writing (" in err, err
    assert "-> let this user write it (another user's run.dir?), or remove it if no driver of this run is alive" in err
    assert lock.read_text() == "driver pid 1 on elsewhere"


def test_a_lock_file_holding_garbage_is_taken_and_a_held_one_is_named_in_one_line(tmp_path):
    """An unheld lock file's bytes mean nothing (it is rewritten); a held one's garbage is not shown."""
    (lock := tmp_path / LOCK).write_bytes(b"\x00\xff garbage\nsecond line\x1b[31m")
    assert lock_problem(tmp_path) == ""
    release = hold(tmp_path, "exp")
    assert lock.read_text().startswith(f"driver pid {os.getpid()} on ")
    lock.write_bytes(b"\x00\xff garbage\nsecond line\x1b[31m")
    with pytest.raises(RunLocked) as refused:
        hold(tmp_path, "exp")
    release()
    assert str(refused.value) == (
        f"run 'exp' is already running in {tmp_path} (a driver): stop it first, or pick another run.name or run.dir"
    )


def test_train_refuses_a_live_run_before_touching_its_files(tmp_path: Path) -> None:
    """The same run started again used to truncate the live run's driver.log and delete its logs,
    Redis data and TensorBoard files while the live one kept running."""
    run_dir = tmp_path / "dup"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / RUN_MARKER).write_text("dup\n")
    (run_dir / "logs" / "driver.log").write_text("the live run's log\n")
    (run_dir / "logs" / "gen0.log").write_text("a worker's log\n")
    release = hold(run_dir, "dup")
    cfg = load_config("tests", ["model.path=tiny-qwen3", "run.name=dup", f"run.dir={run_dir}"])
    try:
        with pytest.raises(RunLocked, match="run 'dup' is already running"):
            train(cfg)
    finally:
        release()
    assert (run_dir / "logs" / "driver.log").read_text() == "the live run's log\n"
    assert (run_dir / "logs" / "gen0.log").read_text() == "a worker's log\n"


# ----- the lease on a run's name in its Redis -----

LEASE_HOLDER = """
import sys, time
from pathlib import Path
from rredcot.common.streams import connect
from rredcot.launch.run_lock import NameLease
lease = NameLease(connect(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), ttl_s=1.0, renew_every_s=0.2)
lease.take()
lease.start()
print('held', flush=True)
time.sleep(600)
"""


def _holder(url: str, name: str, run_dir: Path) -> subprocess.Popen:
    """A live driver of run ``name`` (its lease renewed by its thread), in a process of its own."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LEASE_HOLDER, url, name, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_lease_refuses_a_second_start_naming_the_live_run_and_expires_once_its_driver_is_killed(
    redis_server, redis_client, run_id, tmp_path
):
    """The live driver is named (pid, host, run.dir) with how to stop and resume it; a driver killed
    by SIGKILL stops renewing, so its lease expires and the name can be taken over (run.resume=auto)."""
    proc = _holder(redis_server.url, run_id, tmp_path / "first")
    try:
        time.sleep(2.5)  # past the lease's 1 s: its thread renews it
        second = NameLease(redis_client, run_id, tmp_path / "second", where=" at redis://…")
        with pytest.raises(RunLocked) as refused:
            second.take()
        line = str(refused.value)
        assert "\n" not in line and f"run {run_id!r} is already running with Redis at redis://… (driver pid " in line
        assert f"{proc.pid} on {socket.gethostname()}, run.dir {tmp_path / 'first'}" in line
        assert f"kill -TERM {proc.pid}" in line and f"run.resume=auto run.dir={tmp_path / 'first'}" in line
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 5
        while True:  # expires within its 1 s
            try:
                second.take()
                break
            except RunLocked:
                assert time.monotonic() < deadline, "the killed driver's lease did not expire"
                time.sleep(0.1)
        assert describe(redis_client.get(lease_key(run_id)))["run_dir"] == str(tmp_path / "second")
        assert second.release()
    finally:
        proc.kill()
        proc.wait(30)


def test_renewal_keeps_the_lease_past_its_ttl_and_release_deletes_only_our_own(redis_client, run_id, tmp_path):
    lease = NameLease(redis_client, run_id, tmp_path, ttl_s=0.5, renew_every_s=0.1).hold()
    time.sleep(1.5)  # three TTLs
    assert redis_client.get(lease_key(run_id)) == lease.token.encode() and redis_client.pttl(lease_key(run_id)) > 0
    assert lease.release() and redis_client.get(lease_key(run_id)) is None
    # a driver that could not renew in time: another took the name; its release leaves the other's lease
    stale = NameLease(redis_client, run_id, tmp_path / "a", ttl_s=0.2, renew_every_s=60)
    stale.take()
    time.sleep(0.5)
    other = NameLease(redis_client, run_id, tmp_path / "b")
    other.take()
    assert not stale.renew() and "another driver (driver pid" in stale.lost and str(tmp_path / "b") in stale.lost
    with pytest.raises(LeaseLost):
        stale.check()
    assert not stale.release()
    assert redis_client.get(lease_key(run_id)) == other.token.encode()
    assert other.release()


def test_train_refuses_a_live_name_in_its_redis_whatever_its_run_dir_before_touching_anything(
    redis_server, redis_client, run_id, tmp_path
):
    """A second run of a live name against the same redis.url, in another run.dir, with
    run.resume=never: it used to log `deleting the earlier run's Redis keys` and delete the live
    run's keys (the live run died with NOGROUP). Now it is refused before it creates its run.dir,
    starts Ray or deletes a key."""
    live = NameLease(redis_client, run_id, tmp_path / "live").hold()
    kept = run_key(redis_client, run_id, "admitted")
    redis_client.set(kept, 8)  # the live run's keys
    second = tmp_path / "second"
    cfg = load_config(
        "tests", ["model.path=tiny-qwen3", f"run.name={run_id}", f"run.dir={second}", f"redis.url={redis_server.url}"]
    )
    try:
        with pytest.raises(
            RunLocked, match=rf"run '{run_id}' is already running with Redis at .*run.dir {tmp_path / 'live'}"
        ):
            train(cfg)
        assert redis_client.get(kept) == b"8" and redis_client.exists(registry_key(run_id))
        assert not second.exists()
        assert redis_client.get(lease_key(run_id)) == live.token.encode()  # still the live run's
    finally:
        live.release()
