"""Nodes as network namespaces: a head and workers on one machine, each with its own network stack.

Every node is a network namespace (``ip netns add``) with its own ``lo`` and one interface, ``cl0``,
whose veth peer sits on a bridge inside a "switch" namespace of the harness's own; the harness gives
each node an address on a private /24 that no interface of this machine holds. No namespace has a
default route, so nothing a node sends can leave the namespaces: an address outside the subnet is
unreachable there (``ENETUNREACH``), not routed. Commands run in a node with ``ip netns exec``, which
gives them a mount namespace of their own too, and ``unshare --uts`` a host name (the node's name): a
node started with ``shared_run_dir=False`` has its own directory bind-mounted over the cluster's run
directory, so it sees the same path and other files (a node without the shared filesystem); one
added with ``code=DIR`` has DIR bind-mounted over ``rredcot/launch`` (a node with another checkout).

Nodes are started with the project's scripts (``deploy/ray/ray_head.sh``, ``deploy/ray/ray_worker.sh``) and the
variables ``docs/multinode.md`` documents, each with a Ray temp dir of its own. ``close`` kills every
process in the harness's namespaces (and only those: a process's network namespace says whose it is),
deletes the namespaces, whose veths and bridge go with them, and the directory; ``leftovers`` names
anything of a harness still there.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LAUNCH = REPO / "rredcot" / "launch"
PREFIX = "rrcl"  # every namespace of a harness: rrcl<pid>-<node>, <pid> the test process's
ROOT_PREFIX = "rrcl"  # and its directory: <tmp>/rrcl<pid>-<random>
IFACE = "cl0"  # each node's cluster-network interface
JOIN_TIMEOUT_S = 180.0
GCS_NODES = REPO / "tests" / "cluster" / "gcs_nodes.py"  # the nodes alive, from the head's GCS
# Ray's worker processes (actors) listen on a port of this range (their gRPC server, on every
# interface: Ray's, not rredcot's), so a listening socket of an actor outside it is of its own making
RAY_WORKER_PORTS = (10002, 10999)


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket of a node (``ss -ltnp``): its address, port and the processes holding it."""

    address: str  # 0.0.0.0, :: or * when it listens on every interface
    port: int
    processes: tuple[tuple[str, int], ...]  # (name, pid)

    @property
    def wildcard(self) -> bool:
        return self.address in ("0.0.0.0", "::", "*", "[::]")


def cannot_run() -> str:
    """Why network namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    name = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ""


def namespaces() -> list[str]:
    """The names of this machine's named network namespaces."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def remove_namespaces(names: list[str], grace_s: float = 10.0) -> None:
    """Stop everything running in ``names`` (SIGTERM, then SIGKILL after ``grace_s``) and delete them."""
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while pids := [p for n in names for p in pids_in(n)]:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.5)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        if time.monotonic() > deadline + 30:
            raise RuntimeError(f"processes {pids} in {names} do not end")
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def remove_stale() -> None:
    """What a harness whose test process died (SIGKILL: no finalizer ran) left behind: its namespaces,
    every process in them, its directory."""
    stale = []
    for name in namespaces():
        owner = name[len(PREFIX) :].split("-", 1)[0]
        if name.startswith(PREFIX) and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            stale.append(name)
    if stale:
        remove_namespaces(stale, grace_s=2.0)
    for root in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*-*"):  # their directories
        owner = root.name[len(ROOT_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(root, ignore_errors=True)


def leftovers(owner: int | None = None) -> list[str]:
    """What a harness of ``owner`` (a test process id; any when None) left: namespaces and processes."""
    mine = f"{PREFIX}{owner}-" if owner is not None else PREFIX
    return [f"namespace {n} (pids {pids_in(n)})" for n in namespaces() if n.startswith(mine)]


def private_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no address or route of this machine overlaps."""
    used = []
    for cmd in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        for word in subprocess.run(cmd, capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randint(64, 250)}.{random.randint(0, 254)}.0/24")
        spare = ipaddress.ip_network(f"{net.network_address + 256}/24")  # the next /24: a service network
        if not any(u.overlaps(n) for u in used if u.prefixlen > 0 for n in (net, spare)):
            return net
    raise RuntimeError("no free 10.x.y.0/24 for the harness")


def wait_for_file(path: Path, run: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    """Until ``path`` exists, while ``run`` (its output in ``log``) still runs."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert run.poll() is None, f"the run ended ({run.returncode}) before {path.name}: {log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path} in {timeout:.0f} s: {log.read_text()[-4000:]}"
        time.sleep(1)


@dataclass
class Node:
    name: str  # head, w1, …
    netns: str
    ip: str  # its address on the cluster network (on cl0)
    shared_run_dir: bool = True
    code: Path | None = None  # bind-mounted over rredcot/launch: another checkout's code
    procs: list[subprocess.Popen] = field(default_factory=list)
    log: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ip})"


class Cluster:
    """A switch namespace with a bridge, and nodes plugged into it (``add_node``)."""

    def __init__(self) -> None:
        remove_stale()
        self.owner = os.getpid()
        # short: Ray's socket paths stay under 108 characters
        self.root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{self.owner}-", dir=tempfile.gettempdir()))
        self.run_dir = self.root / "run"
        self.run_dir.mkdir()
        self.net = private_subnet()
        self.service_net = ipaddress.ip_network(f"{self.net.network_address + 256}/24")
        self.nodes: dict[str, Node] = {}
        self.bin = BIN  # the checkout's .venv/bin: rredcot, ray
        self.port = 6379  # each node has its own stack: Ray's default port clashes with nothing
        self._gcs: subprocess.Popen | None = None  # asks the head's GCS which nodes are alive (nodes_alive)
        self.token = self.root / "auth_token"  # the cluster's, as slurm.sbatch makes one for a job
        self.token.write_text(secrets.token_hex(32))
        self.switch = f"{PREFIX}{self.owner}-sw"
        self._ns = [self.switch]
        self._ip("netns", "add", self.switch)
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")

    # the network
    def _ip(self, *args: str) -> None:
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def add_node(self, name: str, shared_run_dir: bool = True, code: Path | None = None) -> Node:
        """A namespace with ``lo`` up and ``cl0`` on the bridge, at the next address of the subnet."""
        netns = f"{PREFIX}{self.owner}-{name}"
        ip = str(self.net.network_address + len(self.nodes) + 1)
        self._ip("netns", "add", netns)
        self._ns.append(netns)
        port = f"p{len(self.nodes)}"  # the switch's end
        self._ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", netns)
        self._ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        self._ip("-n", netns, "addr", "add", f"{ip}/{self.net.prefixlen}", "dev", IFACE)
        self._ip("-n", netns, "link", "set", "lo", "up")
        self._ip("-n", netns, "link", "set", IFACE, "up")
        node = self.nodes[name] = Node(name, netns, ip, shared_run_dir, code)
        (self.root / name).mkdir()
        if not shared_run_dir:
            (self.root / name / "run").mkdir()
        return node

    def serve_on_head(self) -> str:
        """An address of the head on the service network (another /24, on the head's ``lo``); every
        node gets a route to it through the head. ``drop_service_route`` takes one node's away."""
        head = self.nodes["head"]
        address = str(self.service_net.network_address + 1)
        self._ip("-n", head.netns, "addr", "add", f"{address}/32", "dev", "lo")
        for node in self.nodes.values():
            if node is not head:
                self._ip("-n", node.netns, "route", "add", str(self.service_net), "via", head.ip, "dev", IFACE)
        return address

    def drop_service_route(self, name: str) -> None:
        self._ip("-n", self.nodes[name].netns, "route", "del", str(self.service_net))

    # processes in a node
    def env(self, **extra: str | None) -> dict[str, str]:
        """The environment of a command in a node: the tests' own Ray settings removed (a shell has
        none), this cluster's token; ``extra`` on top, where None unsets a variable."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
        env["PATH"] = f"{BIN}:{env['PATH']}"
        env["RAY_AUTH_TOKEN_PATH"] = str(self.token)
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "2"  # a stopped node drains 30 s by default
        # a lost node declared dead after 3 failed checks a second apart (Ray's default: 5, 3 s apart, each
        # allowed 10 s): the node-lost run's learner tier restarts sooner (with the driver's 10-s peer wait
        # of before 2026-12-04 its run stopped and resumed under Ray's defaults: 210 s in two suites)
        env.update(RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3")
        return {k: v for k, v in {**env, **extra}.items() if v is not None}

    def wrap(self, node: Node, command: str) -> list[str]:
        """``command`` (a shell line) in ``node``: its network namespace, its own run dir where it does
        not share the cluster's, and its own code where it has another checkout's."""
        if not node.shared_run_dir:
            command = f"mount --bind {self.root / node.name / 'run'} {self.run_dir} && {command}"
        if node.code:
            command = f"mount --bind {node.code} {LAUNCH} && {command}"
        command = f"hostname {node.name} && {command}"  # a host name of its own (a UTS namespace)
        return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "bash", "-c", command]

    def run(
        self, name: str, command: str, timeout: float = 300, input_text: str | None = None, **env: str | None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.wrap(self.nodes[name], command),
            cwd=self.root,
            env=self.env(**env),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, name: str, script: str, wait: bool = True, **env: str) -> subprocess.Popen:
        """A launch script in node ``name``, in the foreground (``ray start --block``), with
        ``RREDCOT_NODE_IFACE=cl0`` unless ``env`` says otherwise; waits for the node to join."""
        node = self.nodes[name]
        extra = (
            f"--block --disable-usage-stats --temp-dir={self.root / name / 'ray'} "
            "--dashboard-agent-listen-port=0 "  # agents: a port each
            f"--min-worker-port={RAY_WORKER_PORTS[0]} --max-worker-port={RAY_WORKER_PORTS[1]}"
        )
        if script == "ray_head.sh":
            extra += " --include-dashboard=false"
        env = {
            "RREDCOT_NODE_IFACE": IFACE,
            "HEAD_IP": self.nodes["head"].ip if "head" in self.nodes else "",
            "RAY_PORT": str(self.port),
            "NUM_GPUS": "0",
            "NUM_CPUS": "1",
            "RAY_START_EXTRA": extra,
            **env,
        }
        count = (self.alive() if wait and "head" in self.nodes and self.nodes["head"].procs else 0) + 1
        node.log = self.root / name / "node.log"
        proc = self.spawn(name, f"exec bash {REPO}/deploy/ray/{script}", log=node.log.name, **env)
        if wait:
            self.wait_for({name: proc}, count)
        return proc

    def start_workers(self, names: list[str], **env: str) -> None:
        """``ray_worker.sh`` on several nodes at once (their starts overlap); waits for all to join."""
        count = self.alive() + len(names)
        self.wait_for({name: self.start(name, "ray_worker.sh", wait=False, **env) for name in names}, count)

    def spawn(self, name: str, command: str, log: str = "spawned.log", **env: str | None) -> subprocess.Popen:
        """A long-running ``command`` in node ``name`` (a server, a run), ended with the node; its output
        in ``log`` in the node's directory."""
        node = self.nodes[name]
        with open(self.root / name / log, "a") as log:
            proc = subprocess.Popen(
                self.wrap(node, command),
                cwd=self.root,
                env=self.env(**env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.procs.append(proc)
        return proc

    def end(self, proc: subprocess.Popen) -> None:
        """A spawned command and its process group killed, if still running (Ray ends a killed driver's
        actors and frees its placement group)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def alive(self) -> int:
        """How many Ray nodes the head's GCS holds alive."""
        return len(self.nodes_alive())

    def nodes_alive(self) -> dict[str, str]:
        """Ray's node id -> address of each node the head's GCS holds alive, asked of one process in the
        head's namespace that the harness keeps (``tests/cluster/gcs_nodes.py``)."""
        if self._gcs is None or self._gcs.poll() is not None:
            with open(self.root / "gcs_nodes.log", "a") as log:
                self._gcs = subprocess.Popen(
                    self.wrap(self.nodes["head"], f"exec {self.bin}/python {GCS_NODES} {self.address}"),
                    cwd=self.root,
                    env=self.env(RAY_AUTH_MODE="token"),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                )
        self._gcs.stdin.write("\n")
        self._gcs.stdin.flush()
        line = self._gcs.stdout.readline()
        assert line, f"the GCS query ended: {(self.root / 'gcs_nodes.log').read_text()[-2000:]}"
        return json.loads(line)

    def wait_for(self, procs: dict[str, subprocess.Popen], count: int) -> None:
        """Until the head counts ``count`` nodes alive, while the launch scripts ``procs`` run. The head
        is asked only once every script has said ``Ray runtime started``: asked every second by ``ray
        status`` (a Python process importing Ray, 2 CPU-s on these machines), it took CPU from the nodes
        it waited for."""
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            logs = {name: (self.root / name / "node.log").read_text() for name in procs}
            if all("Ray runtime started" in log for log in logs.values()) and self.alive() >= count:
                return
            for name, proc in procs.items():
                log = logs[name][-3000:]
                assert proc.poll() is None, f"{name}'s launch script ended ({proc.returncode}): {log}"
                assert time.monotonic() < deadline, f"{name} did not join in {JOIN_TIMEOUT_S:.0f} s: {log}"
            time.sleep(0.5)

    def stop(self, name: str) -> None:
        """End node ``name``'s Ray (its script's process group, then whatever is left in its namespace)."""
        node = self.nodes[name]
        for proc in node.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # ray start --block takes its node down
        for proc in node.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        node.procs.clear()
        for pid in pids_in(node.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def kill(self, name: str) -> None:
        """Node ``name`` lost at once: SIGKILL to every process in its namespace (its raylet, agents,
        workers, its launch script), as a machine that loses power; its network stays."""
        node = self.nodes[name]
        for pid in pids_in(node.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in node.procs:
            self.end(proc)
        node.procs.clear()

    def listening(self, name: str) -> list[Listener]:
        """The listening TCP sockets in node ``name``'s network namespace, with their processes."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.nodes[name].netns, "ss", "-Hltnp"], capture_output=True, text=True
        ).stdout
        found = []
        for line in out.splitlines():
            words = line.split()
            if len(words) < 4:
                continue
            address, _, port = words[3].rpartition(":")
            procs = tuple((n, int(p)) for n, p in re.findall(r'\("([^"]*)",pid=(\d+)', line))
            found.append(Listener(address.split("%")[0], int(port), procs))
        return found

    def node_names(self, **env: str | None) -> dict[str, str]:
        """Ray's node id of each harness node alive (by its address): placement.json names nodes by id.
        With ``env`` (another token's place), asked once by a process of its own."""
        if env:
            query = f"{self.bin}/python {GCS_NODES} {self.address}"
            done = self.run("head", query, 120, input_text="\n", RAY_AUTH_MODE="token", **env)
            assert done.returncode == 0, done.stderr[-2000:]
            alive = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            alive = self.nodes_alive()
        by_ip = {node.ip: name for name, node in self.nodes.items()}
        return {node_id: by_ip[ip] for node_id, ip in alive.items()}

    @property
    def address(self) -> str:
        return f"{self.nodes['head'].ip}:{self.port}"

    def close(self) -> None:
        if self._gcs is not None:
            self._gcs.kill()
            self._gcs.wait(10)
        try:
            for name in list(self.nodes):
                if name != "head":
                    self.stop(name)
            if "head" in self.nodes:
                self.stop("head")
        finally:
            remove_namespaces(self._ns)
            shutil.rmtree(self.root, ignore_errors=True)
