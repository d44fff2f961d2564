"""Fixtures for the learner tests: tiny random models and random σ-weighted samples."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rredcot.learner.packing import TrainSample
from tests.learner_samples import random_samples, tiny_lm


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    return tiny_lm


@pytest.fixture
def make_samples() -> Callable[..., list[TrainSample]]:
    return random_samples
