"""Ports and stores: a free local port for a server the run starts (Redis), and the torch
``TCPStore`` a group forms on, listening on its own address only.

torch's ``TCPStore`` server binds every interface (``*:<port>``) whatever host it is given; a store
built on a socket bound to the group's address (``master_listen_fd``) listens there alone: loopback
on one machine, the node's cluster address otherwise.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def hosted_store(address: str, world: int, timeout: timedelta) -> dist.TCPStore:
    """The server of a ``world``-member store on a port the kernel picks, listening on ``address``
    only; ``store.port`` is the port to publish."""
    server = socket.create_server((address, 0), backlog=max(128, world))
    port = server.getsockname()[1]
    fd = server.detach()  # the store owns the listening socket from here
    return dist.TCPStore(address, port, world, True, timeout, wait_for_workers=False, master_listen_fd=fd)
