"""``deploy/slurm/slurm.sbatch`` as ``sbatch`` runs it, on a two-node allocation of the cluster harness
(``tests/cluster/netns.py``): the batch script on the first node, stand-ins for SLURM's own ``srun``
(a step in its node's namespace, a process group) and ``scontrol`` (``slurm_shims/``), the real Ray,
Redis and driver."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

from rredcot.models.store import cache_dir
from tests.cluster.netns import IFACE, PREFIX, REPO, Cluster, pids_in, wait_for_file

SHIMS = Path(__file__).parent / "slurm_shims"
NODES = ("head", "w1")


def stop_seconds(driver_log: str) -> float:
    """Seconds between the driver's "stopping:" line and its last line (the report written)."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in driver_log.splitlines()
        if re.match(r"\d{4}-\d\d-\d\d ", line)
    ]
    stopping = next(line for line in driver_log.splitlines() if "stopping: interrupted (SIGTERM)" in line)
    return (stamps[-1] - datetime.strptime(stopping[:23], "%Y-%m-%d %H:%M:%S,%f")).total_seconds()


def test_the_slurm_script_trains_on_two_nodes_and_stops_in_order_before_the_time_limit(netns_cluster: Cluster):
    """The job's batch shell on the first node starts Ray's head there and a worker on the second (each
    node's address found from ``RREDCOT_NODE_IFACE``, its CPUs from ``SLURM_CPUS_ON_NODE``, the job's own
    token made by the script), the driver trains across both, and the USR1 that ``--signal=B:USR1@300``
    sends before the time limit stops the run in order, as any SIGTERM to the driver does: within 30 s,
    the learner's checkpoint, the report (interrupted by SIGTERM); then the script ends its steps, and
    with them every process it started on either node."""
    cluster = netns_cluster
    for name in NODES:
        cluster.add_node(name)
    run, home = cluster.run_dir / "slurm", cluster.root / "home"
    env = {
        "PATH": f"{SHIMS}:{cluster.bin}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "RAY_AUTH_TOKEN_PATH": None,  # no token yet: the script makes the job's, in ~/.ray
        "RREDCOT_CACHE": str(cache_dir()),  # the models come from the suite's cache: not built again
        "HARNESS_NETNS_PREFIX": f"{PREFIX}{cluster.owner}-",
        "HARNESS_ROOT": str(cluster.root),
        "SLURM_JOB_NODELIST": ",".join(NODES),
        "SLURM_CPUS_ON_NODE": "2",
        "NUM_GPUS": "0",
        "RREDCOT_NODE_IFACE": IFACE,
        "RAY_START_EXTRA": "--disable-usage-stats --dashboard-agent-listen-port=0",
    }
    overrides = f"run.dir={run} run.steps=40 data.eval_size=0 logging.progress_every_s=1 cluster.placement=spread"
    started = time.monotonic()
    job = cluster.spawn("head", f"cd {REPO} && exec bash deploy/slurm/slurm.sbatch tests {overrides}", "job.log", **env)
    log, driver_log = cluster.root / "head" / "job.log", run / "logs" / "driver.log"
    wait_for_file(run / "placement.json", job, log, timeout=300)
    placed_s = time.monotonic() - started
    deadline = time.monotonic() + 300
    while not (driver_log.is_file() and re.search(r"training step [1-9]\d*/", driver_log.read_text())):
        assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(2)
    names = cluster.node_names(HOME=str(home), RAY_AUTH_TOKEN_PATH=None)
    placed = {names[node_id] for node_id in json.loads((run / "placement.json").read_text()).values()}
    assert placed == set(NODES), placed  # the tiers on both nodes of the allocation

    stepped_s = time.monotonic() - started
    job.send_signal(signal.SIGUSR1)
    try:
        assert job.wait(180) != 0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the job did not end after USR1: {log.read_text()[-3000:]}") from None
    print(
        f"slurm job: placed {placed_s:.0f} s, a step {stepped_s:.0f} s, ended {time.monotonic() - started:.0f} s "
        "after its start"
    )
    said = log.read_text()
    assert "time limit near: stopping the run in order" in said
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["status"] == "interrupted (SIGTERM)"  # the driver's orderly stop, report written
    assert 0 < summary["steps"] < 40 and summary["learner_stopped_in_time"] is True
    assert list((run / "checkpoints").glob("step-*")), "no checkpoint at the stop"
    assert (run / "report" / "summary.md").read_text().startswith("# rredcot run report")
    assert stop_seconds(driver_log.read_text()) <= 30  # from the SIGTERM to the report
    assert f", Ray at {cluster.nodes['head'].ip}:" in said  # the driver's first line: HEAD_IP, found from cl0
    left = {name: pids_in(cluster.nodes[name].netns) for name in NODES}
    assert not any(left.values()), f"the job left processes: {left}"  # its steps' Ray nodes ended with it
