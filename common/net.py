"""Ports: a free local port for a server the run starts (Redis, a rendezvous store)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
