"""The launch scripts on a local multi-node Ray: ``deploy/ray/ray_head.sh`` starts a head and
``deploy/ray/ray_worker.sh`` joins nodes to it (several raylets on one machine, no GPUs). A node started in
a mount namespace of its own (``unshare -m``) sees its own files: a tmpfs over the run directory is a
node without the shared filesystem, and a bind mount over the code a node with another checkout.
``rredcot doctor`` and ``rredcot train`` must name each such node before any stage starts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

import rredcot.launch
from rredcot.common.net import free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOIN_TIMEOUT_S = 180.0

pytestmark = pytest.mark.slow


@dataclass
class LocalCluster:
    root: Path  # short: Ray's socket paths must stay under 108 characters
    address: str
    env: dict[str, str]
    nodes: list[subprocess.Popen] = field(default_factory=list)

    def start(self, script: str, mounts: list[str] = (), **env: str) -> None:
        """Run a launch script (``ray start --block`` stays in the foreground), in a mount namespace of
        its own when there are ``mounts`` (shell commands run there first)."""
        command = ["bash", f"deploy/ray/{script}"]
        if mounts:
            command = ["unshare", "-m", "bash", "-c", " && ".join([*mounts, f"exec bash deploy/ray/{script}"])]
        log = open(self.root / f"node{len(self.nodes)}.log", "w")  # noqa: SIM115 (lives with the node)
        self.nodes.append(
            subprocess.Popen(
                command, cwd=REPO, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
        self.wait_for(len(self.nodes))

    def alive(self) -> int:
        out = subprocess.run([BIN / "ray", "status", "--address", self.address], capture_output=True, text=True)
        active = out.stdout.split("Active:")[-1].split("Pending:")[0]
        return sum(line.strip().startswith("1 node_") for line in active.splitlines())

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while self.alive() < count:
            logs = {p.name: p.read_text()[-2000:] for p in self.root.glob("node*.log")}
            assert time.monotonic() < deadline, f"{count} Ray node(s) did not come up: {logs}"
            assert all(n.poll() is None for n in self.nodes), f"a node's ray start ended: {logs}"
            time.sleep(2)

    def stop(self) -> None:
        for node in self.nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)  # ray start --block takes its node down
        for node in self.nodes:
            node.wait(60)
        for p in psutil.process_iter(["cmdline"]):  # whatever of this session outlived its node
            if any(str(self.root) in arg for arg in p.info["cmdline"] or []):
                p.kill()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="rmn", dir="/tmp"))
    address_of_this_node = subprocess.run(
        ["bash", "deploy/ray/cluster_env.sh"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    port = free_port()
    extra = "--block --dashboard-agent-listen-port=0 --disable-usage-stats"  # agents: a port each
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "RAY_PORT": str(port),
        "HEAD_IP": address_of_this_node,
        "NUM_GPUS": "0",
        "NUM_CPUS": "2",
        "RAY_START_EXTRA": extra,
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2",  # a stopped node drains 30 s by default
    }
    env.pop("RAY_AUTH_MODE", None)
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # the tests' loopback-only Ray: a shell has none
    c = LocalCluster(root, f"{address_of_this_node}:{port}", env)
    (root / "run").mkdir()
    try:
        c.start(
            "ray_head.sh",
            RAY_AUTH_MODE="disabled",
            RAY_START_EXTRA=f"{extra} --include-dashboard=false --temp-dir={root}/ray",
        )
        c.start("ray_worker.sh")  # its auth mode is asked of the head: disabled
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _rredcot(cluster: LocalCluster, command: str, *extra: str, timeout: float = 420) -> subprocess.CompletedProcess:
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_")}
    overrides = [f"cluster.address={cluster.address}", f"run.dir={cluster.root / 'run'}", "cluster.nodes=2", *extra]
    return subprocess.run(
        [BIN / "rredcot", command, "tests", *overrides],
        cwd=cluster.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_nodes_started_by_the_scripts_pass_the_doctors_cluster_checks(cluster):
    log = (cluster.root / "node1.log").read_text()
    assert "Ray authentication disabled (the head answers without a token" in log  # asked, not assumed
    out = _rredcot(cluster, "doctor").stdout
    assert "ok      cluster   2 node(s) hold the plan: run.dir shared, the same code" in out, out
    assert "error   cluster" not in out


def test_a_node_without_the_run_dir_or_with_other_code_is_named_before_anything_starts(cluster):
    changed = cluster.root / "other-launch"
    shutil.copytree(rredcot.launch.__path__[0], changed)
    with open(changed / "plan.py", "a") as f:
        f.write("# another checkout\n")
    cluster.start(
        "ray_worker.sh",
        mounts=[
            f"mount -t tmpfs tmpfs {cluster.root / 'run'}",  # this node does not share the run dir
            f"mount --bind {changed} {rredcot.launch.__path__[0]}",  # and imports other code
        ],
        NCCL_SOCKET_IFNAME="ib7",  # and tells NCCL to use an interface it does not have
    )
    doctor = _rredcot(cluster, "doctor")
    errors = [line for line in doctor.stdout.splitlines() if line.startswith("error   cluster")]
    assert len(errors) == 3 and doctor.returncode == 1, doctor.stdout
    assert "does not see run.dir" in errors[0] and "set run.dir to an absolute path on a filesystem" in errors[0]
    assert "NCCL_SOCKET_IFNAME=ib7 names no interface with an IPv4 address" in errors[1]
    assert "imports other rredcot code" in errors[2] and "install the same checkout on every node" in errors[2]
    node = errors[0].split("node ")[1].split(")")[0] + ")"
    assert all(node in e for e in errors)  # the same node, named by address and Ray node id

    # weights through the collective group, one learner rank, no evaluations: the run needs no shared dir
    collective = _rredcot(cluster, "doctor", "generation.weight_transport=collective", "data.eval_size=0")
    lines = [line for line in collective.stdout.splitlines() if line.split()[1:2] == ["cluster"]]
    assert [line.split()[0] for line in lines] == ["warning", "error", "error"], collective.stdout
    assert f"node {node} does not see run.dir" in lines[0] and "the run goes on" in lines[0]

    started = time.monotonic()
    train = _rredcot(cluster, "train")
    assert train.returncode != 0
    said = train.stdout + train.stderr
    assert f"cannot start: node {node} does not see run.dir" in said and "imports other rredcot code" in said, said
    assert not list((cluster.root / "run" / "logs").glob("*0.log"))  # no stage worker ever started
    assert time.monotonic() - started < 300

    # what a worker on that node writes in its own run.dir is copied to the head's at the end of a run
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_")}
    args = [str(cluster.root / "run"), cluster.address]
    out = subprocess.run([sys.executable, "-c", GATHER, *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [{"node": node, "files": 1, "bytes": 20, "moved": 0}]
    assert (cluster.root / "run" / "logs" / "gen9.log").read_text() == "written on the node\n"


GATHER = """
import json, sys
from pathlib import Path
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rredcot.launch.checks.cluster import probe_nodes
from rredcot.launch.observe.gather import gather

def write(run_dir):  # on the node, as a worker placed there would
    (Path(run_dir) / "logs").mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "logs" / "gen9.log").write_text("written on the node\\n")

run_dir = Path(sys.argv[1])
ray.init(address=sys.argv[2], log_to_driver=False, logging_level="ERROR")
apart = {r.node_id: r.node for r in probe_nodes(run_dir) if r.sees_run_dir}
on = lambda n: NodeAffinitySchedulingStrategy(n, soft=False)
ray.get([ray.remote(num_cpus=0)(write).options(scheduling_strategy=on(n)).remote(str(run_dir)) for n in apart])
print(json.dumps([vars(g) for g in gather(run_dir, apart)]))
"""
