"""The run's own Ray and embedded Redis (``launch.local_ray.init_ray`` and ``services.embedded_redis``,
in a fresh interpreter as ``rredcot train`` starts them), on a machine where another Ray already runs
(``ray start --head``): the run's checks warn in one line and it starts a Ray of its own; that Ray and
the Redis listen on loopback only; its workers run at the driver's priority, not Ray's default
niceness of 15 (under which any other busy process starves the run); and it prestarts no idle
workers, which the run's actors (each with a runtime_env) could not take. One Ray start checks all of
it: each costs seconds of both cores in the suite's busiest worker. A Ray imported too early is refused."""

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

from rredcot.common.net import free_port
from tests.processes import end_group

SCRIPT = textwrap.dedent(
    """
    import contextlib, os, sys, time
    from pathlib import Path

    import psutil

    from rredcot.common.config import load_config
    from rredcot.launch.checks.doctor import preflight
    from rredcot.launch.local_ray import init_ray
    from rredcot.launch.services import embedded_redis

    cfg = load_config("tests")
    print("warned", any("another Ray instance" in w.found for w in preflight(cfg)), flush=True)
    with contextlib.ExitStack() as stack:
        init_ray(cfg, stack)
        import ray

        print("gcs", ray.get_runtime_context().gcs_address, flush=True)
        time.sleep(3)  # Ray prestarts its workers within a second of the first driver's connection
        idle = [p for p in psutil.Process().children(recursive=True) if "ray::IDLE" in " ".join(p.cmdline())]
        print("idle", len(idle), flush=True)
        worker = ray.get(ray.remote(lambda: os.nice(0)).options(num_cpus=0).remote())
        print("niceness", os.nice(0), worker, flush=True)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        server = stack.enter_context(embedded_redis(cfg, Path(sys.argv[1]), len(nodes)))
        print("ready", server.proc.pid, flush=True)
        sys.stdin.readline()
    """
)


def _user_env() -> dict[str, str]:
    """The environment a user's shell has: without what tests/conftest.py sets for the tests' own Rays
    (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, and RAY_prestart_worker_first_driver, which rredcot sets itself)."""
    ours = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_prestart_worker_first_driver")
    return {k: v for k, v in os.environ.items() if k not in ours}


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


def _gcs_servers() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "gcs_server"]


def _another_ray_head(port: int) -> subprocess.Popen:
    """``ray start --head`` (it records itself in /tmp/ray/ray_current_cluster, where a bare ``ray.init``
    finds it and then refuses the driver's ``num_cpus``), once its GCS is up."""
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
    deadline = time.monotonic() + 90
    while not any(f"--gcs_server_port={port}" in " ".join(p.info["cmdline"] or []) for p in _gcs_servers()):
        if head.poll() is not None or time.monotonic() > deadline:
            end_group(head)
            raise AssertionError("ray start --head did not come up")
        time.sleep(0.5)
    return head


def test_the_runs_own_ray_beside_another_listens_on_loopback_at_the_drivers_priority(tmp_path):
    recorded = Path("/tmp/ray/ray_current_cluster")
    had_record = recorded.exists()
    port = free_port()
    head = _another_ray_head(port)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "redis")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_user_env(),
    )
    try:
        said: dict[str, str] = {}
        line = proc.stdout.readline()
        while line and not line.startswith("ready"):
            key, _, value = line.partition(" ")
            said[key] = value.strip()
            line = proc.stdout.readline()
        assert line.startswith("ready"), f"the driver's Ray and Redis did not start: {said}"
        assert said["warned"] == "True"  # the checks named the other Ray
        assert not said["gcs"].endswith(f":{port}")  # its own Ray, not the head's
        assert said["idle"] == "0"
        driver, worker = (int(v) for v in said["niceness"].split())
        assert worker == driver, f"Ray workers at niceness {worker}, the driver at {driver}"

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
        end_group(head)
        if not had_record:
            recorded.unlink(missing_ok=True)


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
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_user_env(), timeout=120)
    if "no network address" in done.stderr:
        pytest.skip("this machine has no network address for Ray to bind")
    assert done.returncode != 0 and "initialized" not in done.stdout
    assert "RuntimeError: a local Ray would listen on this machine's network address" in done.stderr
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in done.stderr
