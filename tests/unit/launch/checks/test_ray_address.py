"""The probe of ``cluster.address`` against a Ray head of its own and against other servers on loopback."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.common.net import free_port
from rredcot.launch.checks import ray_address
from rredcot.launch.checks.cluster import reach_problem
from rredcot.launch.checks.ray_address import check_ray_answers, gcs_problem, rpc_problem
from tests.processes import end_group

PROBE_S = 1.0  # the probe's wait here: a listener that never answers costs the check its whole wait


@pytest.fixture(autouse=True)
def _short_probe(monkeypatch):
    monkeypatch.setattr(ray_address, "GCS_PROBE_TIMEOUT_S", PROBE_S)


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP listener that never answers (``host:port``): the kernel takes the connection."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"127.0.0.1:{server.getsockname()[1]}"


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    """An HTTP/1 server on loopback (``host:port``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def grpc_server() -> Iterator[str]:
    """A gRPC server on loopback with no service (``host:port``)."""
    import grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


OTHER_SERVERS = [
    (silent_server, f"a server there takes the connection but sends no HTTP/2 (gRPC) answer in {PROBE_S:.0f} s"),
    (http_server, "a server there answers, but not in HTTP/2 (gRPC): Failed parsing HTTP/2 (Expected SETTINGS frame"),
    (grpc_server, "a gRPC server answers there, but not Ray's GCS"),
]


@pytest.mark.parametrize(("server", "says"), OTHER_SERVERS, ids=["silent TCP", "HTTP/1", "gRPC, not Ray"])
def test_an_address_with_another_server_behind_it_is_no_ray_cluster(server, says):
    """A listener that is not Ray's GCS: the TCP connection opens, and ``ray.init`` (or ``ray status``)
    waited 45 s to minutes; the probe says what answers there within ``GCS_PROBE_TIMEOUT_S``."""
    with server() as address:
        (check,) = check_ray_answers(load_config("tests", [f"cluster.address={address}"]))
    assert check.level == "error" and check.found.startswith(f"no Ray cluster answers at cluster.address={address} (")
    assert says in check.found, check.found
    assert "deploy/ray/ray_head.sh prints it" in check.fix
    assert check_ray_answers(load_config("tests")) == []  # a local Ray: nothing to ask


def test_a_gcs_that_asks_for_a_token_is_rays():
    """Ray's GCS refusing this process's token is still Ray's: ``ray.init`` sends the token it has."""
    assert rpc_problem("UNAUTHENTICATED", "InvalidAuthToken: Authentication token is missing", 5.0) == ""
    assert rpc_problem("INTERNAL", "boom", 5.0) == "INTERNAL: boom"


def test_train_says_in_one_line_that_no_ray_answers_before_ray_is_given_the_address(tmp_path, monkeypatch, capsys):
    """Through the command line: exit 2, one line naming cluster.address and the fix, no run.dir."""
    from rredcot.launch import driver
    from rredcot.launch.cli import main

    monkeypatch.setattr(driver, "lead_own_process_group", lambda cfg: None)  # keep pytest's process group
    with silent_server() as address:
        assert main(["train", "tests", f"run.dir={tmp_path / 'run'}", f"cluster.address={address}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: cannot start: ray: no Ray cluster answers at cluster.address=") and "\n" not in err
    assert "-> set cluster.address to the head's GCS address" in err, err
    assert not (tmp_path / "run").exists()


@contextlib.contextmanager
def ray_head() -> Iterator[str]:
    """A Ray head of its own on loopback (``ray start --head``; ``host:port`` of its GCS), stopped after."""
    port, client, agent = free_port(), free_port(), free_port()  # not Ray's fixed defaults (10001, 52365)
    recorded = Path("/tmp/ray/ray_current_cluster")
    before = recorded.read_bytes() if recorded.exists() else None
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}"]
        + ["--node-ip-address=127.0.0.1", "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats"]
        + [f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"},
    )
    try:
        deadline = time.monotonic() + 120
        while reach_problem(f"127.0.0.1:{port}"):
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        end_group(head)
        if before is None:
            recorded.unlink(missing_ok=True)
        else:
            recorded.write_bytes(before)


@pytest.mark.slow
def test_a_ray_head_passes_the_probe():
    """The probe's call is the one ``ray.init`` makes first: a real GCS answers it."""
    with ray_head() as address:
        assert gcs_problem(address) == ""
        assert check_ray_answers(load_config("tests", [f"cluster.address={address}"])) == []
