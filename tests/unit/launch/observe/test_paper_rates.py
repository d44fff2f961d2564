"""Rates on paper (``launch.observe.paper_rates``) against a hand computation."""

from __future__ import annotations

import pytest

from rredcot.launch.observe.paper_rates import Gpu, Workload, paper_rates


def test_paper_rates_by_hand():
    """1e9 parameters, 2 layers, 4 heads of 2 (1 KV head), 100 + 100 tokens, on a toy GPU."""
    gpu = Gpu(flops=1e15, bandwidth=1e12, memory=10e9, train_mfu=0.5, prefill_mfu=0.5, decode_efficiency=1.0)
    r = paper_rates(Workload(1e9, 2, 4, 1, 2, 100, 100, scored_tokens=200), gpu)
    kv = 2 * 2 * 1 * 2 * 2  # bytes a token
    batch = (9e9 - 2e9) / (kv * 200)
    step = (2e9 + batch * kv * 150) / 1e12
    forward = 2e9 + 4 * 2 * 4 * 2 * 100  # FLOPs a token
    assert r.generator == pytest.approx(batch / step / 100)
    assert r.redistributor == pytest.approx(0.5e15 / (forward * 400))
    assert r.learner == pytest.approx(0.5e15 / (3 * forward * 200))
