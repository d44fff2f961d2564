import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from rredcot.common.streams import connect, single_try
from rredcot.launch.services import EmbeddedRedis, PortTaken


def test_password_and_aof_in_run_dir(tmp_path):
    with EmbeddedRedis(tmp_path, password="s3cret") as server:
        assert server.url.startswith("redis://:s3cret@127.0.0.1:")
        with_pw = connect(server.url)
        with_pw.set("k", "v")
        no_pw = single_try(host=server.host, port=server.port)
        try:
            no_pw.get("k")
            raise AssertionError("server accepted a client without the password")
        except redis.AuthenticationError:
            pass
        except redis.ResponseError as e:
            assert "NOAUTH" in str(e)
    assert any(p.name.startswith("appendonly") for p in tmp_path.iterdir())  # AOF lives in the run dir


def test_a_password_with_url_characters_works(tmp_path):
    """``openssl rand -base64`` passwords hold '/', '+' and '=': the URL quotes them."""
    with EmbeddedRedis(tmp_path, password="a/b#c%41+d=") as server:
        connect(server.url).set("k", "v")
        assert connect(server.url).get("k") == b"v"


def test_every_server_gets_a_random_password_kept_out_of_its_command_line(tmp_path):
    """Loopback too: any local user could otherwise write the run's key list (which decides what
    ``run.resume=never`` deletes). The password goes in on stdin, not argv, which ``ps`` shows to all."""
    assert EmbeddedRedis(tmp_path, host="0.0.0.0").password != EmbeddedRedis(tmp_path).password
    with EmbeddedRedis(tmp_path) as server:
        assert len(server.password) >= 24 and f":{server.password}@" in server.url
        assert connect(server.url).ping()
        try:
            single_try(host=server.host, port=server.port).set("k", "v")
            raise AssertionError("server accepted a client without the password")
        except (redis.AuthenticationError, redis.ResponseError) as e:
            assert "auth" in str(e).lower()
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
        assert server.password not in cmdline


def test_a_password_with_quotes_and_backslashes_reaches_the_server(tmp_path):
    with EmbeddedRedis(tmp_path, password='a"b\\c d') as server:
        assert connect(server.url).ping()


def test_stop_is_idempotent_and_frees_the_port(tmp_path):
    server = EmbeddedRedis(tmp_path).start()
    port = server.port
    server.stop()
    server.stop()
    try:
        single_try(port=port, password=server.password, socket_connect_timeout=0.5).ping()
        raise AssertionError("server still answers after stop()")
    except redis.ConnectionError:
        pass


_LAUNCHER = textwrap.dedent("""
    import sys, time
    from rredcot.launch.services import EmbeddedRedis
    s = EmbeddedRedis(sys.argv[1]).start()
    print(s.url, flush=True)
    time.sleep(60)
""")


def test_server_dies_with_a_killed_launcher(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().strip()
    assert connect(url).ping()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            single_try(url, socket_connect_timeout=0.2).ping()
            time.sleep(0.1)
        except redis.ConnectionError:
            return
    raise AssertionError("embedded server outlived its SIGKILLed launcher")


def test_a_ctrl_c_to_the_launchers_process_group_leaves_the_server_up(tmp_path):
    """A terminal's Ctrl-C is SIGINT to the whole foreground process group. The driver catches it and
    stops the run in order, through the server: the server must not get it (its own session)."""
    launcher = _LAUNCHER.replace(
        "import sys, time", "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, str(tmp_path)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        url = proc.stdout.readline().strip()
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        assert redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    finally:
        proc.kill()
        proc.wait()


def test_the_embedded_server_takes_a_pinned_port_and_a_directory_of_its_own(tmp_path):
    from rredcot.common.config import load_config
    from rredcot.common.net import free_port
    from rredcot.launch.services import embedded_redis

    port, aof = free_port(), tmp_path / "node-local"
    cfg = load_config("tests", [f"redis.port={port}", f"redis.dir={aof}"])
    with embedded_redis(cfg, tmp_path / "run", nodes=1) as server:
        assert server.port == port and f"@127.0.0.1:{port}/0" in server.url
        connect(server.url).set("k", "v")
    assert any(p.name.startswith("appendonly") for p in aof.iterdir()) and not (tmp_path / "run" / "redis").exists()
    default = embedded_redis(load_config("tests"), tmp_path / "run", nodes=1)
    assert default.data_dir == tmp_path / "run" / "redis"


def test_a_port_taken_after_it_was_chosen_moves_the_server_to_another(tmp_path):
    """``free_port`` sees a port free only at that moment: a suite's other worker took one before the
    server bound it, and the server exited at start-up. A port the server chose itself is replaced."""
    server = EmbeddedRedis(tmp_path)
    chosen = server.port
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", chosen))
        taker.listen()
        with server:
            assert server.port != chosen and connect(server.url).ping()


def test_a_pinned_port_that_is_taken_fails_with_the_servers_own_reason(tmp_path):
    """A pinned port (``redis.port``), like the port a restarted server must keep, is not moved: the
    error names the port and quotes the server's log, where the reason is (stderr is empty)."""
    with socket.socket() as taker:
        taker.bind(("127.0.0.1", 0))
        taker.listen()
        port = taker.getsockname()[1]
        with pytest.raises(PortTaken, match=rf"on port {port} .*Address already in use"):
            EmbeddedRedis(tmp_path, port=port).start()
