"""Which Ray a run will use, and whether it answers: a local Ray (and another instance beside it),
this node's cluster (``cluster.address=auto``), or a Ray cluster at ``cluster.address``, asked before
``ray.init`` joins it: a TCP connection opens to anything, and ``ray.init`` against a port with another
server behind it waits 45 s to minutes; the probe asks the first call ``ray.init`` makes and says in
seconds what answers there."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from rredcot.common.config import Config
from rredcot.launch.checks import Check


def ray_unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """None when a TCP connection to the Ray ``address`` (``host:port`` or ``ray://…``) opens, else why not."""
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    try:
        with socket.create_connection((parsed.hostname or "", parsed.port or 6379), timeout=timeout_s):
            return None
    except OSError as e:
        return str(e) or type(e).__name__


GCS_PROBE_TIMEOUT_S = 5.0  # a Ray GCS answers the probe in milliseconds; ray.init waits up to minutes
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"  # the first call ray.init makes to the GCS


def gcs_problem(address: str, timeout_s: float = GCS_PROBE_TIMEOUT_S) -> str:
    """ "" when a Ray GCS answers at ``address`` (``host:port``) the first call ``ray.init`` makes
    (``GetClusterId`` over gRPC) within ``timeout_s``, else what answers there instead."""
    import grpc

    options = [("grpc.enable_http_proxy", 0), ("grpc.enable_retries", 0)]  # as Ray's own channels
    with grpc.insecure_channel(address, options=options) as channel:
        try:
            channel.unary_unary(GCS_METHOD)(b"", timeout=timeout_s)  # an empty request: every field its default
        except grpc.RpcError as e:
            return rpc_problem(e.code().name, e.details() or "", timeout_s)
    return ""


def rpc_problem(code: str, details: str, timeout_s: float) -> str:
    """What a failed probe of the GCS (``gcs_problem``) says about the server behind the address: ""
    for Ray's GCS refusing this process's token (``ray.init`` sends its own)."""
    if code == "UNAUTHENTICATED":
        return ""
    if code == "DEADLINE_EXCEEDED":
        return f"a server there takes the connection but sends no HTTP/2 (gRPC) answer in {timeout_s:.0f} s"
    if code == "UNIMPLEMENTED":
        return "a gRPC server answers there, but not Ray's GCS (another of Ray's ports, or another service)"
    if "HTTP/2" in details:  # an HTTP/1 server, TLS, or another protocol
        return f"a server there answers, but not in HTTP/2 (gRPC): {details.rsplit(': ', 1)[-1]}"
    return f"{code}: {details}"


def check_ray_answers(cfg: Config) -> list[Check]:
    """A Ray GCS answers at ``cluster.address`` (``host:port``): a TCP connection opens to anything,
    and ``ray.init`` against a port with another server behind it waits 45 s to minutes; the probe
    (``gcs_problem``) answers in ``GCS_PROBE_TIMEOUT_S`` at most."""
    address = cfg.cluster.address
    if not address or address == "auto" or "://" in address or ray_unreachable(address) is not None:
        return []  # none, this node's own, a client URL, or unreachable (the services check says so)
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return []  # the GCS speaks TLS: ray.init brings the certificates the probe lacks
    why = gcs_problem(address, GCS_PROBE_TIMEOUT_S)
    if not why:
        return []
    return [
        Check(
            "error",
            "ray",
            f"no Ray cluster answers at cluster.address={address} ({why[:200]})",
            "set cluster.address to the head's GCS address, host:port (deploy/ray/ray_head.sh prints it), or "
            "ray://host:10001 for Ray's client server",
        )
    ]


def ray_instances_here() -> list[int]:
    """Process ids of the Ray GCS servers running on this machine (one per Ray instance), found
    without importing Ray, which must not be imported before the driver sets its environment."""
    import psutil

    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "gcs_server"]


def ray_node_processes() -> list[str]:
    """The Ray node processes running here: ``gcs_server`` on a head, ``raylet`` on every node."""
    import psutil

    return sorted({p.info["name"] for p in psutil.process_iter(["name"])} & {"gcs_server", "raylet"})


def check_auto_ray() -> Check:
    """``cluster.address=auto``: ``ray.init`` joins the cluster this node belongs to (head or worker),
    found through the address file Ray writes under its temp folder."""
    if running := ray_node_processes():
        return Check("ok", "ray", f"cluster.address=auto: joins the Ray cluster of this node ({', '.join(running)})")
    current = Path(os.environ.get("RAY_TMPDIR", "/tmp/ray")) / "ray_current_cluster"
    fix = "start Ray on this node first (deploy/ray/ray_head.sh or ray_worker.sh), or set cluster.address=host:port"
    if current.exists():
        return Check("warning", "ray", f"cluster.address=auto: no Ray process here, and {current} may be stale", fix)
    return Check("error", "ray", "cluster.address=auto but no Ray runs on this node (no gcs_server or raylet)", fix)


def check_local_ray() -> Check:
    """No ``cluster.address``: the Ray this process started, or a local one (and whether another runs here)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():  # train() in a notebook or a test that started one
        return Check("ok", "ray", "the run uses the Ray this process has already started (ray.init)")
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address:
        return Check(
            "error",
            "ray",
            f"RAY_ADDRESS={env_address} is set but cluster.address is not, so the run would not know which Ray to use",
            f"set cluster.address={env_address} to run on that cluster, or unset RAY_ADDRESS for a local Ray",
        )
    if pids := ray_instances_here():
        return Check(
            "warning",
            "ray",
            f"another Ray instance runs on this machine (gcs_server pid {', '.join(map(str, pids))}); the run "
            "starts its own local Ray beside it and the two share the cores",
            "set cluster.address=auto to run on that one instead, or stop it (ray stop)",
        )
    return Check("ok", "ray", "a local Ray starts with the run (loopback only)")
