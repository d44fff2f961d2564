"""What the pre-start cluster checks conclude from the nodes' probes (the probes themselves run on nodes
as network namespaces in tests/cluster/test_netns_cluster.py)."""

from __future__ import annotations

import re
import socket

import pytest

from rredcot.common.config import load_config
from rredcot.common.net import loopback_interface
from rredcot.launch.checks.cluster import (
    GIB,
    NodeReport,
    cluster_problems,
    code_digest,
    interface_problem,
    node_label,
    reach_problem,
    read_probe,
    redis_address,
    shared_dir_needed,
)
from rredcot.transports import deployment


def test_the_code_digest_is_stable_and_short():
    assert code_digest() == code_digest() and re.fullmatch(r"[0-9a-f]{16}", code_digest())


def test_a_cluster_whose_nodes_agree_has_no_problem():
    cfg = load_config("tests")
    good = NodeReport(node_label("10.0.0.2", "3ec6b42dbeef"), "", "abc", 8 * GIB)
    assert good.node == "10.0.0.2 (3ec6b42d)"
    assert cluster_problems(cfg, [good, good], here="abc") == []


def test_each_broken_assumption_is_one_line_naming_the_node_and_the_fix():
    cfg = load_config("tests", ["generation.weight_transport=ipc"])  # a CPU learner: slots in /dev/shm
    assert deployment(cfg).shm_versions(cfg) == 2
    reports = [
        NodeReport("10.0.0.1 (aaaaaaaa)", "", "abc", 8 * GIB),
        NodeReport("10.0.0.2 (bbbbbbbb)", "/runs/x/.probe/driver: No such file or directory", "abc", 8 * GIB),
        NodeReport("10.0.0.3 (cccccccc)", "", "def", 64 * 2**20),
        NodeReport.silent("10.0.0.4 (dddddddd)"),
        NodeReport("10.0.0.5 (eeeeeeee)", "", "abc", 8 * GIB, network="NCCL_SOCKET_IFNAME=ib0 names no interface"),
    ]
    checks = cluster_problems(cfg, reports, here="abc")
    assert [c.level for c in checks] == ["error"] * 5
    lines = [c.line() for c in checks]
    assert all("\n" not in line for line in lines)
    assert checks[0].found.startswith("node 10.0.0.2 (bbbbbbbb) does not see run.dir (/runs/x/.probe/driver: No such")
    assert "absolute path on a filesystem every node mounts" in checks[0].fix
    assert checks[1].found.startswith(
        "node 10.0.0.3 (cccccccc) imports other rredcot code (digest def, the driver's abc)"
    )
    assert checks[2].found.startswith("node 10.0.0.3 (cccccccc) has 64 MiB free in /dev/shm")
    assert "--shm-size" in checks[2].fix
    assert checks[3].found.startswith("node 10.0.0.4 (dddddddd) did not run a probe task")
    assert "RAY_AUTH_MODE" in checks[3].found
    assert checks[4].found == "node 10.0.0.5 (eeeeeeee): NCCL_SOCKET_IFNAME=ib0 names no interface"
    assert "RREDCOT_NODE_IFACE" in checks[4].fix


def test_a_run_that_needs_no_shared_run_dir_goes_on_with_a_warning():
    """Weights through the collective group, one learner rank, no evaluations: nothing needs files
    from another node, so a node without the run dir costs only what its workers write there."""
    apart = NodeReport("10.0.0.2 (bbbbbbbb)", "/runs/x/.probe/driver: No such file or directory", "abc", 8 * GIB)
    collective = ["generation.weight_transport=collective", "data.eval_size=0"]
    (check,) = cluster_problems(load_config("tests", collective), [apart], here="abc")
    assert check.level == "warning" and "the run goes on" in check.found and "logs and traces" in check.found
    assert "copied to the head's" in check.found  # at the end of the run (launch.observe.gather)
    assert not shared_dir_needed(load_config("tests", collective))
    for needs in (["data.eval_size=5"], ["cluster.learner_ranks=2"], ["credit.scorer.model=policy"]):
        assert shared_dir_needed(load_config("tests", [*collective, *needs])), needs
    assert shared_dir_needed(load_config("tests", ["generation.weight_transport=file"]))
    redis = ["generation.weight_transport=redis"]  # every receiver, the evaluator's too, reads the run's Redis
    assert not shared_dir_needed(load_config("tests", redis))
    assert not shared_dir_needed(load_config("tests", [*redis, "credit.scorer.model=policy"]))
    assert shared_dir_needed(load_config("tests", [*redis, "cluster.learner_ranks=2"]))  # one checkpoint together
    (check,) = cluster_problems(load_config("tests", redis), [apart], here="abc")
    assert check.level == "warning" and "weights through the redis transport" in check.found


def test_shared_memory_matters_only_where_the_ipc_transport_keeps_weights_on_the_host():
    file = load_config("tests", ["generation.weight_transport=file"])
    assert deployment(file).shm_versions(file) == 0
    gpu = load_config("tests", ["generation.weight_transport=ipc", "cluster.gpus_per_learner=1"])
    assert deployment(gpu).shm_versions(gpu) == 0  # auto: the GPU's own memory
    small = NodeReport("10.0.0.3 (cccccccc)", "", "abc", 64 * 2**20)
    assert cluster_problems(gpu, [small], here="abc") == []


def test_the_interface_nccl_is_told_to_use_must_exist_and_reach_the_head(monkeypatch):
    server = socket.create_server(("127.0.0.1", 0))
    head = f"127.0.0.1:{server.getsockname()[1]}"
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert interface_problem(head) == ""  # nothing named: the libraries choose
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "^docker0,lo")
    assert interface_problem(head) == ""  # an exclusion list names no interface to check
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "no-such-interface")
    assert interface_problem(head).startswith("GLOO_SOCKET_IFNAME=no-such-interface names no interface with an IPv4")
    loopback = loopback_interface()
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", f"={loopback}")
    assert interface_problem(head) == ""
    server.close()
    assert "does not reach the head at 127.0.0.1" in interface_problem(head)


def test_a_node_that_cannot_reach_the_runs_redis_is_named_with_the_fix():
    url = ["redis.url=redis://:pw@10.0.0.9:6380/0"]
    assert redis_address(load_config("tests", url)) == "10.0.0.9:6380"
    assert redis_address(load_config("tests")) == ""  # the embedded server: on the head's address
    assert redis_address(load_config("tests", ["redis.url=redis://[fd00::9]/0"])) == "[fd00::9]:6379"
    cut = NodeReport("10.0.0.2 (bbbbbbbb)", "", "abc", 8 * GIB, redis="Network is unreachable")
    (check,) = cluster_problems(load_config("tests", url), [cut], here="abc")
    assert check.level == "error"
    assert check.found == (
        "node 10.0.0.2 (bbbbbbbb) cannot reach redis.url's server at 10.0.0.9:6380 (Network is unreachable)"
    )
    assert "open a route (and the port) from that node to the server" in check.fix
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert reach_problem(f"127.0.0.1:{port}") == "" and reach_problem("") == ""
    server.close()
    assert reach_problem(f"127.0.0.1:{port}") == "Connection refused"


def test_a_node_lost_since_ray_listed_it_is_left_out_with_a_warning_not_a_failed_start():
    """A run resumed right after a node was lost: Ray still lists the node alive (it notices a lost
    node only after its health checks fail) but refuses the probe pinned to it. The start used to
    fail with `rredcot: failed: TaskUnschedulableError: … NodeAffinitySchedulingStrategy doesn't exist
    any more …` (tests/cluster/, a learner's node SIGKILLed, then run.resume=auto)."""
    from ray.exceptions import NodeDiedError, TaskUnschedulableError

    def refused():
        raise TaskUnschedulableError("The node specified via NodeAffinitySchedulingStrategy doesn't exist any more")

    def died():
        raise NodeDiedError("node 10.0.0.3 died")

    good = NodeReport(node_label("10.0.0.1", "aaaaaaaa"), "", "abc", 8 * GIB)
    assert read_probe(lambda: vars(good), "10.0.0.1", "aaaaaaaa") == good
    lost = read_probe(refused, "10.0.0.2", "bbbbbbbbcafe")
    assert "NodeAffinitySchedulingStrategy doesn't exist any more" in lost.left and lost.node_id
    checks = cluster_problems(load_config("tests"), [good, lost, read_probe(died, "10.0.0.3", "cc")], "abc")
    assert [c.level for c in checks] == ["warning", "warning"]
    assert checks[0].found.startswith(
        "node 10.0.0.2 (bbbbbbbb) left the cluster while the checks ran (The task is not schedulable"
    )
    assert "the run goes on without it" in checks[0].found and "deploy/ray/ray_worker.sh" in checks[0].fix

    def other():
        raise ValueError("a bug of the probe")

    with pytest.raises(ValueError):  # a probe that fails for another reason is no lost node
        read_probe(other, "10.0.0.4", "dd")
