"""Checks on the Ray cluster itself, before any stage starts.

A plan can fit the cluster's totals and still not start: a bundle never spans nodes (``free_per_node``
feeds ``plan.check_fit``), and on more than one node a run assumes what nothing else checks. One probe
task on every alive node reads a file the driver wrote into ``run.dir`` and writes one back (the run
directory is shared: weights as files, checkpoints and logs depend on it), hashes the rredcot code it
imports (the same version on every node), connects to the head from the interface NCCL and gloo are
told to use, connects to the server of ``redis.url`` (every tier reads and writes the run's streams
there), and measures ``/dev/shm``. Each failure is one line naming
the node and the fix; ``rredcot doctor`` runs the same probes against ``cluster.address``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil

import rredcot
from rredcot.common.config import Config
from rredcot.common.errors import UserError
from rredcot.common.files import files_digest
from rredcot.launch.checks import Check
from rredcot.launch.checks.ray_address import check_ray_answers, ray_unreachable
from rredcot.launch.observe.logs import headline
from rredcot.launch.plan import PlanError, check_fit, check_plan, describe_free
from rredcot.transports import SHM_DIR, deployment

GIB = 2**30
CODE_SUFFIXES = (".py", ".yaml")
PROBE_TIMEOUT_S = 120.0  # a node's probe: a Ray worker start and a few file reads


class ClusterError(UserError):
    """An assumption of a multi-node run that a node does not meet (every one, each with its fix)."""

    label = "cannot start"

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def code_files() -> list[Path]:
    """The rredcot package's sources and bundled configs, as this process imports them."""
    root = Path(rredcot.__file__).parent
    return sorted(p for p in root.rglob("*") if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts)


def code_digest() -> str:
    """A digest of the rredcot code this process imports (its sources and configs)."""
    return files_digest(code_files(), Path(rredcot.__file__).parent, length=16)


def node_label(address: str, node_id: str) -> str:
    """``10.0.0.2 (3ec6b42d)``: a node's address and the head of its Ray node id (several nodes can
    share an address)."""
    return f"{address} ({node_id[:8]})"


def interface_problem(head: str, timeout_s: float = 5.0) -> str:
    """ "" when the interface this node's ``NCCL_SOCKET_IFNAME`` (else ``GLOO_SOCKET_IFNAME``) names has
    an IPv4 address from which a TCP connection reaches ``head`` (the Ray head's ``host:port``), else
    why not. Unset, or an exclusion list (``^docker0,lo``): nothing to check, the libraries choose."""
    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        names = os.environ.get(variable, "")
        if names and not names.startswith("^"):
            break
    else:
        return ""
    addresses = psutil.net_if_addrs()
    wanted = [n.strip() for n in names.lstrip("=").split(",") if n.strip()]
    found = [a.address for n in wanted for a in addresses.get(n, []) if a.family == socket.AF_INET]
    if not found:
        return f"{variable}={names} names no interface with an IPv4 address here (it has: {', '.join(addresses)})"
    host, port = head.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s, source_address=(found[0], 0)):
            return ""
    except OSError as e:
        return f"{variable}={names} ({found[0]}) does not reach the head at {head}: {e.strerror or e}"


def redis_address(cfg: Config) -> str:
    """``host:port`` of ``redis.url``'s server, which every node must reach; "" for the embedded server
    (started after the checks, on the head's address: a node that joined Ray reaches that address) or a
    Unix socket."""
    url = urlparse(cfg.redis.url or "")
    if url.scheme not in ("redis", "rediss") or not url.hostname:
        return ""
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{host}:{url.port or 6379}"


def reach_problem(address: str, timeout_s: float = 5.0) -> str:
    """ "" when a TCP connection to ``address`` (``host:port``) opens from here, else why not."""
    if not address:
        return ""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return ""
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


@dataclass(frozen=True)
class NodeReport:
    """What one node's probe found."""

    node: str  # node_label
    sees_run_dir: str  # "" when it read the driver's token in run.dir, else what it found instead
    code: str  # code_digest() there
    shm_free: int  # bytes free in /dev/shm there (0: none)
    network: str = ""  # "" when the interface NCCL and gloo are told to use reaches the head, else why not
    answered: bool = True  # False: the probe never ran there (the node cannot start a worker)
    node_id: str = ""  # Ray's id of the node, in full
    redis: str = ""  # "" when redis.url's server answers a TCP connection from the node, else why not
    left: str = ""  # not "": the node left the cluster since Ray listed it alive (what Ray said)

    @staticmethod
    def silent(node: str) -> NodeReport:
        return NodeReport(node, "", "", 0, answered=False)

    @staticmethod
    def gone(node: str, node_id: str, why: str) -> NodeReport:
        return NodeReport(node, "", "", 0, node_id=node_id, left=why)

    @staticmethod
    def probe(run_dir: str, token: str, redis_at: str = "") -> dict[str, Any]:
        """Runs on the node: read the driver's token, write this node's file back, hash the code,
        connect to the head and to ``redis_at`` (``redis_address``)."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        node = node_label(ray.util.get_node_ip_address(), node_id)
        path = Path(run_dir) / ".probe" / "driver"
        try:
            seen = path.read_text().strip()
            sees = "" if seen == token else f"{path} holds another run's probe"
            (path.parent / f"node-{node.replace(' ', '-')}").write_text(token)
        except OSError as e:
            sees = f"{path}: {e.strerror or e}"
        shm = shutil.disk_usage(SHM_DIR).free if SHM_DIR.is_dir() else 0
        network = interface_problem(ray.get_runtime_context().gcs_address)
        return {
            "node": node,
            "sees_run_dir": sees,
            "code": code_digest(),
            "shm_free": shm,
            "network": network,
            "node_id": node_id,
            "redis": reach_problem(redis_at),
        }


def probe_nodes(run_dir: Path, redis_at: str = "") -> list[NodeReport]:
    """Run ``NodeReport.probe`` on every alive node of the connected Ray cluster (``redis_at``: the
    ``host:port`` each must reach, ``redis_address``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = secrets.token_hex(8)
    probe_dir = run_dir / ".probe"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe_dir.mkdir(parents=True)
    (probe_dir / "driver").write_text(token)
    task = ray.remote(num_cpus=0, max_retries=0)(NodeReport.probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            str(run_dir), token, redis_at
        )
        for n in nodes
    ]
    try:
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for ref in pending:  # a node that cannot start a worker would hold it for ever
            ray.cancel(ref, force=True)
        reports = [
            read_probe(lambda ref=ref: ray.get(ref), n["NodeManagerAddress"], n["NodeID"])
            if ref in ready
            else NodeReport.silent(node_label(n["NodeManagerAddress"], n["NodeID"]))
            for ref, n in zip(refs, nodes)
        ]
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    return reports


def read_probe(get: Callable[[], dict[str, Any]], address: str, node_id: str) -> NodeReport:
    """A node's probe result (``get``: its ``ray.get``). A node lost since Ray listed it alive (Ray
    notices a lost node only after its health checks fail, up to a minute or more: a run resumed
    right after a node was lost lists it) cannot run the probe: Ray refuses a task pinned to a node
    it no longer has, or the task dies with its node; that node is ``gone``, not a failed start."""
    from ray.exceptions import NodeDiedError, TaskUnschedulableError, WorkerCrashedError

    try:
        return NodeReport(**get())
    except (TaskUnschedulableError, NodeDiedError, WorkerCrashedError) as e:
        return NodeReport.gone(node_label(address, node_id), node_id, headline(e) or type(e).__name__)


def shared_dir_needed(cfg: Config) -> bool:
    """Whether the run cannot go on without one ``run.dir`` for every node: its weight transport's
    receivers read the learner's files (``transports.Deployment.shared_run_dir``), or learner ranks
    write one checkpoint together."""
    return deployment(cfg).shared_run_dir(cfg) or cfg.cluster.learner_ranks > 1


def cluster_problems(cfg: Config, reports: list[NodeReport], here: str) -> list[Check]:
    """One check per broken assumption, naming the node and the fix (``here``: this process's code
    digest): errors, and a warning for a node without the shared run.dir where the run needs none."""
    out = []

    def error(found: str, fix: str) -> None:
        out.append(Check("error", "cluster", found, fix))

    for r in reports:
        if r.left:
            out.append(
                Check(
                    "warning",
                    "cluster",
                    f"node {r.node} left the cluster while the checks ran ({r.left}): the run goes on without it",
                    "a node that is back joins with deploy/ray/ray_worker.sh; `ray status` shows the nodes Ray counts",
                )
            )
            continue
        if not r.answered:
            error(
                f"node {r.node} did not run a probe task in {PROBE_TIMEOUT_S:.0f} s: its raylet cannot start "
                f"workers (a node joined with another RAY_AUTH_MODE than the head's, or it is overloaded)",
                "see raylet.out in its Ray logs, restart it with deploy/ray/ray_worker.sh",
            )
            continue
        if r.sees_run_dir and shared_dir_needed(cfg):
            error(
                f"node {r.node} does not see run.dir ({r.sees_run_dir})",
                "set run.dir to an absolute path on a filesystem every node mounts at the same place (weights "
                "as files, checkpoints and logs go there), or, with one learner rank, send weights through "
                "generation.weight_transport=redis (the run's Redis) or collective (and no evaluations)",
            )
        elif r.sees_run_dir:
            out.append(
                Check(
                    "warning",
                    "cluster",
                    f"node {r.node} does not see run.dir ({r.sees_run_dir}): the run goes on (weights through "
                    f"the {cfg.generation.weight_transport} transport); the logs and traces of its workers, and the "
                    f"checkpoints of a learner placed there, stay in run.dir on that node until the end of the run, "
                    f"when they are copied to the head's",
                    "a shared run.dir shows them on the head while the run goes on, and keeps them if the driver "
                    "is killed",
                )
            )
        if r.network:
            error(
                f"node {r.node}: {r.network}",
                "set RREDCOT_NODE_IFACE (or NCCL_SOCKET_IFNAME) to the cluster network's interface before "
                "deploy/ray/ray_worker.sh",
            )
        if r.redis:
            error(
                f"node {r.node} cannot reach redis.url's server at {redis_address(cfg)} ({r.redis})",
                "open a route (and the port) from that node to the server: every tier reads and writes the "
                "run's streams there; or set redis.url to an address every node reaches (unset, the driver "
                "starts one on the head's cluster address)",
            )
        if r.code != here:
            error(
                f"node {r.node} imports other rredcot code (digest {r.code}, the driver's {here})",
                "install the same checkout on every node (a shared checkout with its .venv, or one container image)",
            )
        if (versions := deployment(cfg).shm_versions(cfg)) and r.shm_free < GIB:
            error(
                f"node {r.node} has {r.shm_free / 2**20:.0f} MiB free in {SHM_DIR} for the "
                f"{cfg.generation.weight_transport} transport's {versions} weight versions",
                "give it more (docker run --shm-size=2g) or set generation.weight_transport=file",
            )
    return out


@dataclass(frozen=True)
class Findings:
    """What the start checks found on the cluster."""

    nodes: int  # alive
    checks: list[Check]  # each broken assumption (``cluster_problems``)
    apart: dict[str, str]  # the nodes that do not see run.dir: Ray node id -> label (``gather``)


def cluster_findings(cfg: Config, run_dir: Path) -> Findings:
    """What a run checks on the connected Ray cluster before it starts: raises ``PlanError`` when the
    plan does not fit (the totals, then each node's free resources); on more than one node, each
    node's broken assumptions and the nodes that do not see ``run.dir``."""
    import ray

    nodes = sum(bool(n.get("Alive")) for n in ray.nodes())
    check_plan(cfg, ray.cluster_resources(), nodes=nodes)
    check_fit(cfg, free_per_node())  # a bundle never spans nodes: the free resources of one must hold it
    if nodes < 2:
        return Findings(nodes, [], {})
    reports = probe_nodes(run_dir, redis_address(cfg))
    if left := sum(bool(r.left) for r in reports):  # the plan against the nodes that are still there
        nodes -= left
        check_plan(cfg, ray.cluster_resources(), nodes=nodes)
    apart = {r.node_id: r.node for r in reports if r.answered and not r.left and r.sees_run_dir}
    return Findings(nodes, cluster_problems(cfg, reports, code_digest()), apart)


def check_nodes(cfg: Config, run_dir: Path) -> Findings:
    """``cluster_findings`` for the driver: raise ``PlanError`` or ``ClusterError`` (every node that
    breaks an assumption of the run); else what was found (warnings only)."""
    found = cluster_findings(cfg, run_dir)
    if errors := [c for c in found.checks if c.level == "error"]:
        raise ClusterError([f"{c.found} -> {c.fix}" for c in errors])
    return found


def free_per_node() -> dict[str, dict[str, float]]:
    """What is free on each alive node now, by ``node_label`` (Ray's developer API: no public one yet)."""
    import ray
    from ray._private.state import available_resources_per_node

    free = available_resources_per_node()
    return {
        node_label(n["NodeManagerAddress"], n["NodeID"]): {k: float(v) for k, v in free.get(n["NodeID"], {}).items()}
        for n in ray.nodes()
        if n.get("Alive")
    }


PLACEMENT_TIMEOUT_S = 300.0


def wait_for_placement(cfg: Config, pg: Any, timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
    """Wait for the placement group's bundles; past ``timeout_s`` raise ``PlanError`` with what each
    node has free now (others took the room since the plan was checked, or an autoscaler never came)."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except GetTimeoutError:
        raise PlanError(
            f"Ray could not place the plan's bundles ({cfg.cluster.placement} across nodes) in {timeout_s:.0f} s; "
            f"free now: {describe_free(free_per_node())}: other jobs hold the room, or a node left; "
            "free it or lower the plan"
        ) from None


def check_cluster(cfg: Config) -> list[Check]:
    """``rredcot doctor`` with ``cluster.address``: join the cluster as the run would and check what
    the run checks before it starts (the plan against every node's free resources, and on more than
    one node run.dir, the code and /dev/shm on each). Nothing else: the address is checked by the
    doctor's services check first, so an unreachable one is reported there, not waited for here."""
    address = cfg.cluster.address
    if not address or (address != "auto" and ray_unreachable(address) is not None):
        return []  # no cluster, or the services check says it is unreachable
    if answers := check_ray_answers(cfg):
        return answers
    import ray

    try:
        ray.init(address=cfg.cluster.address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as e:
        return [Check("error", "cluster", f"cannot join {cfg.cluster.address}: {str(e).splitlines()[0]}")]
    try:
        found = cluster_findings(cfg, Path(cfg.run.dir).absolute())
    except PlanError as e:
        return [Check("error", "cluster", str(e))]
    finally:
        ray.shutdown()
    redis = ", redis.url reached" if redis_address(cfg) else ""
    shared = f": run.dir shared, the same code, the network interface{redis}, room in /dev/shm"
    shared = shared if found.nodes > 1 else ""
    return found.checks or [Check("ok", "cluster", f"{found.nodes} node(s) hold the plan{shared}")]
