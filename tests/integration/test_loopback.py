"""A one-machine run listens on loopback only: the local Ray and the embedded Redis, started by the
driver's own functions in a fresh interpreter (as ``rredcot train`` starts them), open no socket on
a network address."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.processes import end_group

SCRIPT = textwrap.dedent(
    """
    import contextlib, sys
    from pathlib import Path

    from rredcot.common.config import load_config
    from rredcot.launch.local_ray import init_ray
    from rredcot.launch.services import embedded_redis

    cfg = load_config("tests")
    with contextlib.ExitStack() as stack:
        init_ray(cfg, stack)
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        server = stack.enter_context(embedded_redis(cfg, Path(sys.argv[1]), len(nodes)))
        print("ready", server.proc.pid, flush=True)
        sys.stdin.readline()
    """
)


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)  # ::ffff:127.0.0.1 on a dual-stack socket
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def _listening(pid: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of ``pid`` and its descendants."""
    root = psutil.Process(pid)
    out = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="tcp")
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def test_local_ray_and_embedded_redis_listen_on_loopback_only(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}  # as a shell has it
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "redis")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("ready"):
            line = proc.stdout.readline()
        assert line.startswith("ready"), "the driver's Ray and Redis did not start"
        redis_pid = int(line.split()[1])
        sockets = _listening(proc.pid)
        names = {n for n, _, _ in sockets}
        assert {"gcs_server", "raylet"} <= names, sockets  # Ray's own servers were seen
        assert redis_pid in {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        assert any(port for n, _, port in sockets if n == psutil.Process(redis_pid).name()), sockets
        exposed = [s for s in sockets if not _is_loopback(s[1])]
        assert not exposed, f"listening on a network address: {exposed}"
    finally:
        proc.stdin.close()  # the driver's ExitStack stops Redis and Ray
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_local_ray_is_refused_when_ray_was_imported_too_early():
    """Ray fixes its bind address when imported: imported before the driver could set loopback, the
    local Ray would listen on the network, so the driver refuses to start it."""
    script = (
        "import contextlib, ipaddress, ray\n"
        "if ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:\n"
        "    raise SystemExit('no network address')\n"
        "from rredcot.common.config import load_config\n"
        "from rredcot.launch.local_ray import init_ray\n"
        "with contextlib.ExitStack() as stack:\n"
        "    init_ray(load_config('tests'), stack)\n"
        "print('initialized', ray.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    if "no network address" in done.stderr:
        pytest.skip("this machine has no network address for Ray to bind")
    assert done.returncode != 0 and "initialized" not in done.stdout
    assert "RuntimeError: a local Ray would listen on this machine's network address" in done.stderr
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in done.stderr


BESIDE = textwrap.dedent(
    """
    import contextlib
    from rredcot.common.config import load_config
    from rredcot.launch.checks.doctor import preflight
    from rredcot.launch.local_ray import init_ray

    cfg = load_config("tests")
    print("warned", any("another Ray instance" in w.found for w in preflight(cfg)), flush=True)
    with contextlib.ExitStack() as stack:
        init_ray(cfg, stack)
        import ray

        print("gcs", ray.get_runtime_context().gcs_address, flush=True)
    """
)


def test_a_run_beside_another_local_ray_starts_its_own(tmp_path):
    """A Ray started with ``ray start --head`` (it records itself in /tmp/ray/ray_current_cluster,
    where a bare ``ray.init`` finds it and then refuses the driver's ``num_cpus``): the run's checks
    warn in one line and the driver starts a local Ray of its own."""
    from rredcot.common.net import free_port

    recorded = Path("/tmp/ray/ray_current_cluster")
    had_record = recorded.exists()
    port = free_port()
    head = subprocess.Popen(
        ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=1", "--include-dashboard=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",  # a stopped node drains 30 s by default
        },
    )
    try:
        deadline = time.monotonic() + 90
        while not any(f"--gcs_server_port={port}" in " ".join(p.info["cmdline"] or []) for p in _gcs_servers()):
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.5)
        done = subprocess.run([sys.executable, "-c", BESIDE], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
        assert lines["warned"] == "True"
        assert not lines["gcs"].endswith(f":{port}")  # its own Ray, not the head's
    finally:
        end_group(head)
        if not had_record:
            recorded.unlink(missing_ok=True)


def _gcs_servers() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "gcs_server"]
