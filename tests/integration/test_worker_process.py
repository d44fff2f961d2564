"""A Ray worker's process holds the process options' environment from its start: OpenMP reads its
wait policy when torch loads it, which is before a worker's own code runs."""

from __future__ import annotations

import pytest

from rredcot.launch.stages import process_options


class InitialEnvironment:
    """Reads its process's environment as it was at exec (``/proc/self/environ``), not ``os.environ``."""

    def read(self) -> dict[str, str]:
        with open("/proc/self/environ", "rb") as f:
            pairs = [item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item]
        return dict(pairs)


@pytest.fixture
def no_wait_policy(monkeypatch):
    """No policy in the environment Ray starts with (the test processes' own is passive: tests/__init__.py)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def test_a_workers_process_starts_with_a_passive_openmp_wait(no_wait_policy, ray_local):
    ray = ray_local
    plain = ray.remote(InitialEnvironment).options(num_cpus=0).remote()
    worker = ray.remote(InitialEnvironment).options(num_cpus=0, **process_options()).remote()
    assert "OMP_WAIT_POLICY" not in ray.get(plain.read.remote())  # the check can fail: Ray adds nothing itself
    assert ray.get(worker.read.remote())["OMP_WAIT_POLICY"] == "PASSIVE"
