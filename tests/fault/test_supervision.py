"""A generator, redistributor, the learner or the embedded Redis server killed with SIGKILL mid-run:
the run restarts it and finishes on its own, every admitted prompt trained, nothing trained twice
into the same weights, the ledger balanced (real ``train`` on configs/tests.yaml). Each run is a
Ray start and every tier's start-up: faults that a run survives one after another share a run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
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


def kill_redis_after_the_workers(run_dir: Path, run_id: str, killed: dict[str, list[int]], timeout_s: float = 600):
    """SIGKILL the run's embedded Redis server once gen0 and red0 were killed, their successors
    report, and the learner has made a step: the faults come one after another."""
    client, deadline = client_of(run_dir), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snaps = RunControl(client, run_id).all_metrics()
        successors = all(
            killed[w] and "pid" in snaps.get(w, {}) and int(snaps[w]["pid"]) != killed[w][0] for w in ("gen0", "red0")
        )
        if successors and snaps.get("learner0", {}).get("step", 0) >= 1:
            pid = int(client.info("server")["process_id"])
            os.kill(pid, signal.SIGKILL)
            killed["redis"].append(pid)
            return
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("worker", "ranks", "transport"),
    [("gen0+red0+redis", 1, "file"), ("learner1", 2, "ipc")],
    ids=["gen0-red0-and-redis", "learner1-of-2-ipc"],
)
def test_killed_worker_is_restarted_and_the_run_loses_nothing(
    local_ray,  # noqa: F811
    redis_server,
    redis_client,
    run_id,
    tmp_path,
    worker,
    ranks,
    transport,
):
    """A dead learner rank restarts every rank (a torch.distributed group cannot take one back): rank
    1 dies, and rank 0, which sends the weights over ipc, is restarted with it; its successor replaces
    its shared slots. A generator and a redistributor die in the same run (``gen0+red0+redis``): each
    restarts and reclaims what it held; then the run's embedded Redis server dies (no ``redis.url``)
    and the driver restarts it on its port from its append-only file, the workers reconnect. (Each
    case is a whole run: cases share runs where they can.)"""
    victims = [w for w in worker.split("+") if w != "redis"]
    killed: dict[str, list[int]] = {w: [] for w in [*victims, "redis"]}
    run_dir, own_redis = tmp_path / run_id, "redis" in worker
    # a checkpoint every 2 steps: the learner may die before, on or after one (it resumes from the newest)
    overrides = ["learner.skip_zero_advantage=false", "learner.checkpoint_every=2", "logging.progress=false"]
    overrides += [f"cluster.learner_ranks={ranks}", f"generation.weight_transport={transport}", "data.eval_size=0"]
    if own_redis:  # the driver's own server, which it restarts; its password the test's; a step to spare after it
        overrides += ["run.steps=5", f"redis.password={TEST_PASSWORD}"]
        killers = [threading.Thread(target=kill_redis_after_the_workers, args=(run_dir, run_id, killed), daemon=True)]
    else:
        overrides += ["run.steps=4", f"redis.url={redis_server.url}"]
        killers = []

    def kill(w: str) -> None:
        kill_when_working(client_of(run_dir) if own_redis else redis_client, run_id, w, killed[w])

    killers += [threading.Thread(target=kill, args=(w,), daemon=True) for w in victims]
    for killer in killers:
        killer.start()
    cfg = load_config("tests", [f"run.dir={run_dir}", f"run.name={run_id}", *overrides])
    report = train(cfg)
    for killer in killers:
        killer.join(timeout=5)
    with contextlib.ExitStack() as stack:
        if own_redis:  # what the run left in its server, read back from its append-only file
            server = stack.enter_context(served(run_dir / "redis"))
            check = connect(server.url)
            assert killed["redis"], "the Redis server was never killed"
            assert "restarting it on port" in (run_dir / "logs" / "driver.log").read_text()
            assert RunControl(check, run_id).all_metrics()["driver"]["redis_restarts"] == 1
        else:
            check = redis_client
        assert_nothing_lost(check, cfg, report, run_id, worker, victims, killed, ranks, transport)


@contextlib.contextmanager
def served(data_dir: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(data_dir, password=TEST_PASSWORD).start()
    try:
        yield server
    finally:
        server.stop()


def assert_nothing_lost(client, cfg, report: Path, run_id: str, worker: str, victims, killed, ranks, transport):
    """Each victim was killed once and restarted once; every admitted prompt's samples trained once
    into the final weights, within η updates of their policy; the ledger balanced."""
    snaps = RunControl(client, run_id).all_metrics()
    for w in victims:
        assert killed[w], f"{w} was never seen working"
        assert snaps[w]["restarts"] == 1 and snaps[w]["pid"] != killed[w][0]
    learners = [v for v in snaps.values() if v["tier"] == "learner"]
    assert len(learners) == ranks and all(v.get("restarts", 0) == 1 for v in learners) == worker.startswith("learner")
    assert snaps.get("driver", {}).get("learner_restarts", 0) == int(worker.startswith("learner"))
    prompts = cfg.run.steps * cfg.generation.prompts_per_step
    expected = prompts * cfg.generation.group_size
    assert all(v["step"] == cfg.run.steps for v in learners)
    # a restored learner publishes its checkpoint as one version above the dead one's, then steps on
    versions = {v["version"] for v in learners}
    assert versions == {cfg.run.steps} if worker[:3] != "lea" else len(versions) == 1 and min(versions) >= cfg.run.steps
    # every admitted prompt's samples, once into the final weights, within η updates of their policy
    assert {v["samples_trained"] for v in learners} == {expected}  # each rank counts the global batch
    assert client.scard(key(run_id, "trained_ids")) == expected
    assert max(v["staleness_max"] for v in learners) <= cfg.staleness.eta
    assert sum(v["ahead_tokens"] for v in learners) == 0
    assert Admission(client, run_id, 2, cfg.staleness.eta).admitted() == prompts
    assert client.xlen(key(run_id, DEAD)) == 0
    assert client.xlen(key(run_id, ROLLOUTS)) == client.xlen(key(run_id, BATCHES)) == 0
    assert_ledger_balanced(report, prompts)
    if transport == "ipc":  # the successor's slots carried every version, and went with it
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
