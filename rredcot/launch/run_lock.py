"""A run holds its name: an exclusive lock on its run directory, and a lease on its name in the
Redis namespace its data lives in, for as long as its driver lives.

A second ``rredcot train`` of the same run (same ``run.dir``) used to truncate the live run's
``driver.log``, delete its worker logs, its Redis data and its TensorBoard files while the first
kept running. The lock is an ``flock`` on ``<run.dir>/.rredcot-lock``, taken before anything in the
directory is touched; the kernel drops it with the driver's file descriptor, so a driver killed by
SIGKILL leaves no stale lock behind. A lock file that cannot be one (a directory, a FIFO, another
user's file) is one line naming it and the fix, among the pre-start checks (``lock_problem``).

The directory's lock does not cover a run of the same name in another ``run.dir`` against the same
``redis.url``: both runs' keys are ``rredcot:<run.name>:…``, and the second one's
``run.resume=never`` deleted the live run's keys (it died with ``NOGROUP``). So a run against a
``redis.url`` also takes a *lease* on its name in that server (``NameLease``): a key
``rredcot:<run.name>:lease`` set only if absent (``SET NX PX``), whose value names its owner (host,
pid, run.dir, start time and a random nonce). The driver renews it from a thread of its own every
``RENEW_EVERY_S`` for the whole run (whatever the main thread waits on: Ray's start, a placement, an
evaluation); a driver killed by SIGKILL stops renewing, so its lease expires after ``LEASE_TTL_S``
and ``run.resume=auto`` takes the name over. A clean end deletes the lease only if it still holds
this driver's value (compare-and-delete in one script). The lease is not in the run's key registry,
so clearing the run (``run.resume=never``) never deletes it. An embedded Redis lives in the run's
directory, which its ``flock`` already holds, so a run without ``redis.url`` takes no lease.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from rredcot.common.config import redact_url
from rredcot.common.errors import UserError
from rredcot.common.streams import connect, key

log = logging.getLogger(__name__)

LOCK = ".rredcot-lock"
LEASE_TTL_S = 30.0  # how long a driver that stopped renewing (killed) keeps its name
RENEW_EVERY_S = 5.0


class RunLocked(UserError):
    """Another driver holds this run."""

    label = "cannot start"


class LockFileError(UserError):
    """The run's lock file is no file this process can lock (a directory, a FIFO, another user's)."""

    label = "cannot start"


class LeaseLost(RuntimeError):
    """Another driver took this run's name while this one runs (it could not renew its lease in time)."""


def hold(run_dir: Path, name: str) -> Callable[[], None]:
    """Take run ``name``'s lock in ``run_dir``; returns its release. Raises ``RunLocked`` naming the
    live run's driver (pid, host, start) when another process holds it, ``LockFileError`` when the
    lock file cannot be one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = open_lock(run_dir / LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 300).decode("utf-8", "replace").strip()
        os.close(fd)
        holder = holder if holder.startswith("driver pid ") and holder.isprintable() else "a driver"
        raise RunLocked(
            f"run {name!r} is already running in {run_dir} ({holder}): stop it first, or pick another "
            "run.name or run.dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(
        fd, f"driver pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode()
    )

    def release() -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    return release


def open_lock(lock: Path, create: bool = True) -> int:
    """The lock file ``lock`` open for reading and writing (made when absent and ``create``); raises
    ``LockFileError`` (one line with the fix) when it is no regular file or this user cannot open it."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_NONBLOCK | (os.O_CREAT if create else 0), 0o644)
    except OSError as e:
        if os.path.isdir(lock):
            raise LockFileError(lock_refusal(lock, "is a directory", "rmdir")) from None
        raise LockFileError(
            f"the run's lock file {lock} cannot be opened for writing ({e.strerror or e}) -> let this user "
            "write it (another user's run.dir?), or remove it if no driver of this run is alive"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LockFileError(lock_refusal(lock, "is no regular file (a FIFO, socket or device)", "rm"))
    return fd


def lock_refusal(lock: Path, what: str, remove: str) -> str:
    """The line for a lock file that is no regular file (no driver holds such a lock, so it may go)."""
    return f"the run's lock file {lock} {what} -> remove it ({remove} {lock}); rredcot makes it again as a file"


def lock_problem(run_dir: Path) -> str:
    """Why the run's lock file in ``run_dir`` cannot be taken, with the fix, as one line; "" when it
    can, or when there is none yet (nothing is created)."""
    lock = run_dir / LOCK
    if not os.path.lexists(lock):
        return ""
    try:
        os.close(open_lock(lock, create=False))
    except LockFileError as e:
        return str(e)
    return ""


def lease_key(run_id: str) -> str:
    """The run's name lease (never registered: clearing the run leaves it to its owner)."""
    return key(run_id, "lease")


# renew: ours -> extend it (1); gone (expired while Redis was unreachable) -> ours again (2);
# another owner's -> lost (0)
_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def owner_token(run_dir: Path) -> str:
    """The lease's value: who holds the name (host, pid, run.dir, since) and a nonce that makes it unique."""
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_dir": str(run_dir),
            "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "nonce": uuid.uuid4().hex,
        }
    )


def describe(token: bytes | str) -> dict[str, Any]:
    """A lease value as a dict (an unreadable one: its text under ``raw``)."""
    text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
    try:
        owner = json.loads(text)
    except ValueError:
        owner = None
    return owner if isinstance(owner, dict) else {"raw": text[:200]}


class NameLease:
    """Run ``run_id``'s lease on its name in ``client``'s server (module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        run_dir: Path,
        where: str = "",
        ttl_s: float = LEASE_TTL_S,
        renew_every_s: float = RENEW_EVERY_S,
    ) -> None:
        self.client, self.run_id, self.run_dir, self.where = client, run_id, run_dir, where
        self.key, self.token = lease_key(run_id), owner_token(run_dir)
        self.ttl_ms, self.renew_every_s = int(ttl_s * 1000), renew_every_s
        self.lost: str | None = None  # why this driver no longer holds the name
        self._renew, self._release = client.register_script(_RENEW), client.register_script(_RELEASE)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> None:
        """Take the name, or raise ``RunLocked`` naming the live run and how to stop or resume it."""
        for _ in range(3):  # the holder's lease may expire between the SET and the GET
            if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                return
            holder, left_ms = self.client.get(self.key), self.client.pttl(self.key)
            if holder is not None:
                raise RunLocked(self._refusal(describe(holder), left_ms))
        raise RunLocked(f"run {self.run_id!r}: could not take its lease {self.key} in Redis{self.where}; try again")

    def _refusal(self, owner: dict[str, Any], left_ms: int) -> str:
        name, where = self.run_id, self.where
        if "raw" in owner:
            return (
                f"run {name!r} is held in Redis{where} by a lease rredcot did not write ({self.key} = "
                f"{owner['raw']!r}): pick another run.name, or delete that key if nothing uses it"
            )
        host, pid, run_dir = owner.get("host", "?"), owner.get("pid", "?"), owner.get("run_dir", "?")
        expiry = f"{left_ms / 1000:.0f} s" if left_ms >= 0 else "never (the key has no expiry)"
        return (
            f"run {name!r} is already running with Redis{where} (driver pid {pid} on {host}, run.dir {run_dir}, "
            f"since {owner.get('since', '?')}): stop it first (kill -TERM {pid} on {host}; it checkpoints) and "
            f"continue it with run.resume=auto run.dir={run_dir}, or pick another run.name; if that driver is "
            f"gone, its lease on the name expires in {expiry}"
        )

    def renew(self) -> bool:
        """Extend the lease once; False (and ``lost`` set) when another driver holds the name now."""
        got = int(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))
        if got == 2:
            log.warning("run %r: its lease in Redis had expired (Redis unreachable?); taken again", self.run_id)
        if got == 0:
            holder = describe(self.client.get(self.key) or b"")
            pid, host, run_dir = (holder.get(k, "?") for k in ("pid", "host", "run_dir"))
            who = f"driver pid {pid} on {host}, run.dir {run_dir}"
            self.lost = (
                f"run {self.run_id!r}: another driver ({who}) took its name in Redis{self.where} after this driver "
                f"could not renew its lease for {self.ttl_ms / 1000:.0f} s; stopping this run"
            )
            log.error("%s", self.lost)
        return got != 0

    def hold(self) -> NameLease:
        """``take`` the name and ``start`` renewing it."""
        self.take()
        return self.start()

    def start(self) -> NameLease:
        """Renew from a thread of its own until ``release`` (or until the lease is lost)."""
        self._thread = threading.Thread(target=self._keep, name=f"rredcot-lease-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _keep(self) -> None:
        failing = False
        while not self._stop.wait(self.renew_every_s):
            try:
                if not self.renew():
                    return
                failing = False
            except redis.RedisError as e:  # a restarting server: the clients retry; so does the lease
                if not failing:
                    log.warning("run %r: could not renew its lease in Redis (%s: %s)", self.run_id, type(e).__name__, e)
                failing = True

    def check(self) -> None:
        """Raise ``LeaseLost`` if another driver took the name."""
        if self.lost is not None:
            raise LeaseLost(self.lost)

    def release(self) -> bool:
        """Stop renewing and delete the lease if it is still this driver's; True if it was."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            return bool(int(self._release(keys=[self.key], args=[self.token])))
        except redis.RedisError as e:  # Redis gone: the lease expires by itself
            log.warning("run %r: could not release its lease in Redis (%s: %s)", self.run_id, type(e).__name__, e)
            return False


@contextlib.contextmanager
def hold_name(url: str, run_id: str, run_dir: Path) -> Iterator[NameLease]:
    """Run ``run_id``'s lease on its name in the server at ``url``, renewed until the block ends."""
    client = connect(url, retries=3)
    try:
        lease = NameLease(client, run_id, run_dir, where=f" at {redact_url(url)}")
        lease.hold()
        try:
            yield lease
        finally:
            lease.release()
    finally:
        client.close()
