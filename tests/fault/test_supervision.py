"""A generator, redistributor, a learner rank or the embedded Redis server killed with SIGKILL
mid-run: the run restarts it and finishes on its own, every admitted prompt trained, nothing trained
twice into the same weights, the ledger balanced (real ``train`` on rredcot/configs/tests.yaml). Each run is a
Ray start and every tier's start-up: the faults a run survives come one after another in one run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
from omegaconf import OmegaConf

from rredcot.common.config import load_config
from rredcot.common.control import RunControl
from rredcot.common.staleness import Admission
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, connect, key
from rredcot.launch.driver import train
from rredcot.launch.services import EmbeddedRedis
from tests.integration.test_pipeline import _run, local_ray  # noqa: F401 - the module's Ray fixture

# the metric that shows the worker is mid-run
WORK = {"gen0": "samples", "red0": "rollouts", "learner0": "step", "learner1": "step"}
TEST_PASSWORD = "fault-test"  # the run's embedded Redis password, which config.yaml redacts


def kill_when_working(client, run_id: str, worker: str, killed: list[int], timeout_s: float = 600) -> None:
    """SIGKILL ``worker``'s process once it has reported some work (its metrics carry its pid)."""
    control, deadline = RunControl(client, run_id), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = control.all_metrics().get(worker, {})
        if snap.get(WORK[worker], 0) >= 1 and "pid" in snap:
            os.kill(int(snap["pid"]), signal.SIGKILL)
            killed.append(int(snap["pid"]))
            return
        time.sleep(0.05)


def client_of(run_dir: Path, timeout_s: float = 600):
    """A client of the run's embedded Redis, once the run has written its config.yaml (which holds the
    URL with its password redacted; the test set that password itself)."""
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "config.yaml").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return connect(OmegaConf.load(run_dir / "config.yaml").redis.url.replace("***", TEST_PASSWORD))


def metrics_while_redis_restarts(client, run_id: str) -> dict[str, dict]:
    """The workers' metrics; none while the server is down (the test killed it)."""
    try:
        return RunControl(client, run_id).all_metrics()
    except redis.ConnectionError:
        return {}


def kill_redis_then_a_learner_rank(run_dir: Path, run_id: str, killed: dict[str, list[int]], timeout_s: float = 600):
    """SIGKILL the run's embedded Redis server once gen0 and red0 were killed, their successors report
    and the learner has made a step; then learner rank 1 once the server is back and the learner has
    made another step: each fault after the run recovered from the ones before."""
    client, deadline, stepped = client_of(run_dir), time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        snaps = metrics_while_redis_restarts(client, run_id)
        step = snaps.get("learner1", {}).get("step", 0)
        if stepped is None:
            successors = all(
                killed[w] and "pid" in snaps.get(w, {}) and int(snaps[w]["pid"]) != killed[w][0]
                for w in ("gen0", "red0")
            )
            if successors and step >= 1:
                pid = int(client.info("server")["process_id"])
                os.kill(pid, signal.SIGKILL)
                killed["redis"].append(pid)
                stepped = step
        elif snaps.get("driver", {}).get("redis_restarts", 0) >= 1 and step > stepped and "pid" in snaps["learner1"]:
            os.kill(int(snaps["learner1"]["pid"]), signal.SIGKILL)
            killed["learner1"].append(int(snaps["learner1"]["pid"]))
            return
        time.sleep(0.05)


def test_killed_workers_and_redis_are_restarted_and_the_run_loses_nothing(local_ray, tmp_path, run_id):  # noqa: F811
    """Faults one after another in one run (each a Ray start and every tier's start-up saved), with no
    ``redis.url`` (the driver's own server), two learner ranks and weights over ipc:
    - a generator and a redistributor die: each restarts and reclaims what it held;
    - then the embedded Redis server dies: the driver restarts it on its port from its append-only
      file, and the workers reconnect;
    - then learner rank 1 dies: a dead learner rank restarts every rank (a torch.distributed group
      cannot take one back), so rank 0, which sends the weights over ipc, is restarted with it, and
      its successor replaces its shared slots.
    The run finishes on its own, every admitted prompt trained once, the ledger balanced."""
    run_dir = tmp_path / run_id
    killed: dict[str, list[int]] = {w: [] for w in ("gen0", "red0", "redis", "learner1")}
    killers = [
        threading.Thread(target=lambda w=w: kill_when_working(client_of(run_dir), run_id, w, killed[w]), daemon=True)
        for w in ("gen0", "red0")
    ]
    killers.append(threading.Thread(target=kill_redis_then_a_learner_rank, args=(run_dir, run_id, killed), daemon=True))
    for killer in killers:
        killer.start()
    # a checkpoint every 2 steps: the learner may die before, on or after one (it resumes from the newest);
    # 6 steps: a step or more between one fault and the next
    overrides = ["run.steps=6", "learner.skip_zero_advantage=false", "learner.checkpoint_every=2"]
    overrides += ["cluster.learner_ranks=2", "generation.weight_transport=ipc", f"redis.password={TEST_PASSWORD}"]
    cfg = load_config(
        "tests",
        [f"run.dir={run_dir}", f"run.name={run_id}", "logging.progress=false", "data.eval_size=0", *overrides],
    )
    report = train(cfg)
    for killer in killers:
        killer.join(timeout=5)
    assert killed["redis"], "the Redis server was never killed"
    assert "restarting it on port" in (run_dir / "logs" / "driver.log").read_text()
    # what the run left in its server, read back from its append-only file
    server = EmbeddedRedis(run_dir / "redis", password=TEST_PASSWORD).start()
    try:
        client = connect(server.url)
        assert RunControl(client, run_id).all_metrics()["driver"]["redis_restarts"] == 1
        assert_nothing_lost(client, cfg, report, run_id, ["gen0", "red0", "learner1"], killed)
    finally:
        server.stop()


def assert_nothing_lost(client, cfg, report: Path, run_id: str, victims: list[str], killed) -> None:
    """Each victim was killed once and restarted once (a learner rank with every rank); every admitted
    prompt's samples trained once into the final weights, within η updates of their policy, none
    left in a stream or a shared slot; the ledger balanced."""
    snaps = RunControl(client, run_id).all_metrics()
    for w in victims:
        assert killed[w], f"{w} was never seen working"
        assert snaps[w]["restarts"] == 1 and snaps[w]["pid"] != killed[w][0]
    learners = [v for v in snaps.values() if v["tier"] == "learner"]
    assert len(learners) == cfg.cluster.learner_ranks and all(v.get("restarts", 0) == 1 for v in learners)
    assert snaps["driver"]["learner_restarts"] == 1
    prompts = cfg.run.steps * cfg.generation.prompts_per_step
    expected = prompts * cfg.generation.group_size
    assert all(v["step"] == cfg.run.steps for v in learners)
    # a restored learner publishes its checkpoint as one version above the dead one's, then steps on
    versions = {v["version"] for v in learners}
    assert len(versions) == 1 and min(versions) >= cfg.run.steps
    # every admitted prompt's samples, once into the final weights, within η updates of their policy
    assert {v["samples_trained"] for v in learners} == {expected}  # each rank counts the global batch
    assert client.scard(key(run_id, "trained_ids")) == expected
    assert max(v["staleness_max"] for v in learners) <= cfg.staleness.eta
    assert sum(v["ahead_tokens"] for v in learners) == 0
    assert Admission(client, run_id, 2, cfg.staleness.eta).admitted() == prompts
    assert client.xlen(key(run_id, DEAD)) == 0
    assert client.xlen(key(run_id, ROLLOUTS)) == client.xlen(key(run_id, BATCHES)) == 0
    assert_ledger_balanced(report, prompts)
    # the successor's slots carried every version, and went with it
    assert all(v["broadcast_fallbacks"] == 0 for v in learners)
    assert not list(Path("/dev/shm").glob(f"rredcot-{run_id}-*-slot*"))


def assert_ledger_balanced(report: Path, prompts: int) -> None:
    """The run report's ledger: every admitted prompt trained, none dead, rejected, in flight or missing."""
    ledger = json.loads((report / "summary.json").read_text())["ledger"]
    assert ledger["balanced"] and ledger["missing"] == [] and ledger["admitted"] == prompts, ledger
    assert (ledger["trained"], ledger["dead"], ledger["rejected"], ledger["in_flight"]) == (prompts, 0, 0, 0)
    assert "## Ledger" in (report / "summary.md").read_text()


def test_a_learner_lost_past_its_restarts_stops_the_run_and_says_how_to_resume(
    local_ray,  # noqa: F811
    redis_server,
    redis_client,
    run_id,
    tmp_path,
):
    """``cluster.max_restarts=0``: the learner's death stops the run, with a checkpoint to resume from
    and a report that says how."""
    killed: list[int] = []
    killer = threading.Thread(target=kill_when_working, args=(redis_client, run_id, "learner0", killed), daemon=True)
    killer.start()
    overrides = (
        "run.steps=4",
        "learner.checkpoint_every=1",
        "cluster.max_restarts=0",
        "generation.weight_transport=ipc",
    )
    with pytest.raises(
        RuntimeError, match=r"learner tier has used its 0 restart.* resume the run with run.resume=auto"
    ):
        _run(tmp_path, redis_server, run_id, *overrides)
    killer.join(timeout=5)
    summary = json.loads((tmp_path / run_id / "report" / "summary.json").read_text())
    assert killed and summary["status"].startswith("failed") and "run.resume=auto" in summary["status"]
    slots = sorted(Path("/dev/shm").glob(f"rredcot-{run_id}-*-slot*"))  # the killed learner's newest weights
    log = (tmp_path / run_id / "logs" / "driver.log").read_text()
    for slot in slots:
        slot.unlink()
    assert slots and "for run.resume=auto" in log and f"free them with: rm {slots[0]}" in log
