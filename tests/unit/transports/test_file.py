"""The file publisher streams a version to disk without a serialised copy in memory (the learner's
buckets and their gathering: ``tests/unit/learner/test_weights.py``)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import torch

from rredcot.learner.weights import publish
from rredcot.transports.file import FilePublisher
from rredcot.transports.manifest import load_tensors


def test_rank_0_streams_the_file_without_a_serialised_copy_in_memory(tmp_path, redis_client, run_id):
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])  # 4 MiB of weights
    publisher = FilePublisher(redis_client, run_id, tmp_path)
    tracemalloc.start()
    try:
        manifest, _ = publish(publisher, model, 2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20 and manifest.nbytes > 4 * 2**20
    assert list(tmp_path.iterdir()) == [Path(manifest.path)]
    _assert_file_holds(manifest, model)  # read_weights verifies the checksum written beside it


def _assert_file_holds(manifest, module) -> None:
    state = load_tensors(manifest)
    assert all(torch.equal(state[n], p) for n, p in module.named_parameters())
