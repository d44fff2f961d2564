"""A free local port, and stores that listen on their own address only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

import psutil
import torch.distributed as dist

from rredcot.common.net import free_port, hosted_store, loopback_interface


def test_the_port_is_free_and_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if someone held it
        assert s.getsockname() == ("127.0.0.1", port)


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"]


def test_a_hosted_store_listens_on_its_address_only() -> None:
    """torch's TCPStore server binds every interface (``*:<port>``) whatever host it is given; the
    learner's rendezvous store and the weight group's store listen on their address alone."""
    store = hosted_store("127.0.0.1", 2, timedelta(seconds=10))
    on_its_port = [(ip, port) for ip, port in _listening(os.getpid()) if port == store.port]
    assert on_its_port == [("127.0.0.1", store.port)]  # not ('::', port) or ('0.0.0.0', port)
    member = dist.TCPStore("127.0.0.1", store.port, 2, False, timedelta(seconds=10))
    member.set("k", "v")
    assert store.get("k") == b"v"


def test_the_loopback_interface_holds_127_0_0_1() -> None:
    addresses = psutil.net_if_addrs()[loopback_interface()]
    assert "127.0.0.1" in [a.address for a in addresses if a.family == socket.AF_INET]


def test_a_single_learner_rank_listens_on_loopback_only() -> None:
    """One rank forms its group on an in-process store: env:// hosted a TCPStore on every interface
    (``*:<port>``). What is left listening is gloo's own device: on the loopback interface a local
    run names (``GLOO_SOCKET_IFNAME``, set by ``launch.stages.stage_env``), not on the address the
    host name resolves to (127.0.0.1 on this machine, a network address on many)."""
    script = (
        "import os, psutil\n"
        "from rredcot.learner.engine import init_distributed\n"
        "print(init_distributed())\n"
        "print(sorted({c.laddr.ip for c in psutil.Process().net_connections('tcp') if c.status == 'LISTEN'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "WORLD_SIZE", "RANK")}
    env["GLOO_SOCKET_IFNAME"] = loopback_interface()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks, addresses = done.stdout.splitlines()[-2:]
    assert ranks == "(0, 1)" and addresses == "['127.0.0.1']", addresses
