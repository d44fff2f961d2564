"""A free local port: bindable right after, on loopback by default."""

from __future__ import annotations

import socket

from rredcot.common.net import free_port


def test_the_port_is_free_and_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if someone held it
        assert s.getsockname() == ("127.0.0.1", port)
