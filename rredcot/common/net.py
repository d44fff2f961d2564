"""Ports, stores and interfaces: a free local port for a server the run starts (Redis), the torch
``TCPStore`` a group forms on, listening on its own address only, and the loopback interface that
gloo's devices use on one machine.

torch's ``TCPStore`` server binds every interface (``*:<port>``) whatever host it is given; a store
built on a socket bound to the group's address (``master_listen_fd``) listens there alone: loopback
on one machine, the node's cluster address otherwise.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    import torch.distributed as dist


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def loopback_interface() -> str:
    """The name of the network interface that holds 127.0.0.1 (``lo`` on Linux): gloo, told it in
    ``GLOO_SOCKET_IFNAME``, listens there instead of on the address the host name resolves to."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    raise RuntimeError("no network interface holds 127.0.0.1: a one-machine run needs the loopback interface")


def hosted_store(address: str, world: int, timeout: timedelta) -> dist.TCPStore:
    """The server of a ``world``-member store on a port the kernel picks, listening on ``address``
    only; ``store.port`` is the port to publish."""
    server = socket.create_server((address, 0), backlog=max(128, world))
    port = server.getsockname()[1]
    fd = server.detach()  # the store owns the listening socket from here
    import torch.distributed as dist  # here, not at import: the driver and the CLI use the rest, not torch

    return dist.TCPStore(address, port, world, True, timeout, wait_for_workers=False, master_listen_fd=fd)
