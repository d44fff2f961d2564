"""Multi-node on one machine for real: a head and worker nodes, each a network namespace with its own
address, loopback and host name (``tests/cluster/netns.py``), started with ``launch/ray_head.sh`` and
``launch/ray_worker.sh`` as ``docs/multinode.md`` says (``RREDCOT_NODE_IFACE``, ``HEAD_IP``, the head's
token). One cluster for the module: a run whose three tiers land on three nodes first, then the same
cluster broken node by node for the pre-start checks."""

from __future__ import annotations

import json
import re
import time

import pytest

from rredcot.launch.services import find_server_binary
from tests.cluster.netns import Cluster

pytestmark = pytest.mark.slow

PASSWORD = "harness-secret"


@pytest.fixture(scope="module")
def cluster(netns_cluster: Cluster) -> Cluster:
    """Head, w1, w2: one CPU each (a bundle per node), one shared run.dir."""
    for name in ("head", "w1", "w2"):
        netns_cluster.add_node(name)
    netns_cluster.start("head", "ray_head.sh")
    for name in ("w1", "w2"):
        netns_cluster.start(name, "ray_worker.sh")  # its auth mode asked of the head: token
    return netns_cluster


def rredcot(cluster: Cluster, command: str, *extra: str, nodes: int, run_dir: str = "", timeout: float = 420):
    """``rredcot COMMAND tests`` on the head, as a user there would run it against the cluster."""
    run = cluster.run_dir / run_dir
    overrides = [f"cluster.address={cluster.address}", f"cluster.nodes={nodes}", f"run.dir={run}"]
    line = " ".join([f"{cluster.bin}/rredcot", command, "tests", *overrides, *extra])
    return cluster.run("head", line, timeout=timeout, RAY_AUTH_MODE="token")


def test_generator_redistributor_and_learner_on_three_nodes_train_every_group_once(cluster):
    log = (cluster.root / "w1" / "node.log").read_text()
    assert "Ray authentication token (the head wants a token" in log  # asked of the head, not assumed
    started = time.monotonic()
    done = rredcot(
        cluster,
        "train",
        "cluster.placement=spread",
        "data.eval_size=0",
        "run.steps=2",
        "generation.weight_transport=file",
        "logging.progress=false",
        nodes=3,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    run = cluster.run_dir
    placement = json.loads((run / "placement.json").read_text())
    assert set(placement) == {"gen0", "red0", "learner0"}
    assert len(set(placement.values())) == 3, placement  # three nodes
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    ledger = summary["ledger"]
    prompts = 2 * 2  # run.steps x generation.prompts_per_step
    assert ledger["balanced"] and ledger["admitted"] == ledger["trained"] == prompts and not ledger["missing"]
    assert (ledger["dead"], ledger["rejected"], ledger["in_flight"]) == (0, 0, 0)
    learner = summary["workers"]["learner0"]
    assert learner["step"] == 2 and learner["duplicates"] == 0
    assert {p.name for p in (run / "logs").glob("*.log")} >= {"driver.log", "gen0.log", "red0.log", "learner0.log"}
    driver_log = (run / "logs" / "driver.log").read_text()
    head = cluster.nodes["head"].ip
    assert f"embedded Redis at redis://:***@{head}:" in driver_log  # bound to the head's cluster address
    print(f"three-node run: {took:.0f} s")


def test_misconfigured_nodes_are_named_with_their_fix_before_anything_starts(cluster):
    # a node whose interface variable names an interface it does not have: its script stops, one line
    cluster.add_node("w3", shared_run_dir=False)
    bad = cluster.start("w3", "ray_worker.sh", wait=False, RREDCOT_NODE_IFACE="ib0")
    assert bad.wait(60) == 2
    said = [line for line in (cluster.root / "w3" / "node.log").read_text().splitlines() if line.strip()]
    assert len(said) == 1, said
    assert said[0].startswith("rredcot: RREDCOT_NODE_IFACE=ib0 has no IPv4 address on w3 (it has: lo, cl0)")
    assert "set RREDCOT_NODE_IFACE to the cluster network's interface" in said[0]
    assert cluster.alive() == 3  # it never joined

    # the same node, started right, but without the shared run.dir (its own directory at that path)
    cluster.start("w3", "ray_worker.sh")
    # a node whose NCCL interface is not there
    cluster.add_node("w4")
    cluster.start("w4", "ray_worker.sh", NCCL_SOCKET_IFNAME="ib0")
    # the run's Redis on the head's service address, which w1 has no route to
    service = cluster.serve_on_head()
    cluster.drop_service_route("w1")
    port = 6380
    cluster.spawn(
        "head",
        f"exec {find_server_binary()} --bind {service} --port {port} --requirepass {PASSWORD} --save '' "
        "--appendonly no",
    )
    url = f"redis://:{PASSWORD}@{service}:{port}/0"
    nodes = {name: cluster.nodes[name].ip for name in ("w1", "w3", "w4")}

    doctor = rredcot(cluster, "doctor", f"redis.url={url}", nodes=5, run_dir="broken")
    errors = [line for line in doctor.stdout.splitlines() if line.startswith("error")]
    assert doctor.returncode == 1 and len(errors) == 3, doctor.stdout + doctor.stderr[-3000:]
    by_node = {name: [e for e in errors if re.search(rf"node {re.escape(ip)} \(", e)] for name, ip in nodes.items()}
    assert all(len(lines) == 1 for lines in by_node.values()), errors
    assert f"cannot reach redis.url's server at {service}:{port}" in by_node["w1"][0]
    assert "open a route (and the port) from that node to the server" in by_node["w1"][0]
    assert "does not see run.dir" in by_node["w3"][0] and "set run.dir to an absolute path" in by_node["w3"][0]
    assert "NCCL_SOCKET_IFNAME=ib0 names no interface with an IPv4 address here (it has: lo, cl0)" in by_node["w4"][0]
    assert "set RREDCOT_NODE_IFACE" in by_node["w4"][0]

    train = rredcot(cluster, "train", f"redis.url={url}", nodes=5, run_dir="broken")
    said = train.stdout + train.stderr
    assert train.returncode != 0
    for ip in nodes.values():
        assert f"node {ip} (" in said, said[-4000:]
    assert "cannot start" in said
    assert not list((cluster.run_dir / "broken" / "logs").glob("*0.log"))  # no stage worker ever started
