"""Fixtures for the transport tests: the learner tests' tiny models (what a publisher publishes) and
the actor tests' real vLLM-CPU engines (what a receiver updates, end to end)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.learner_samples import tiny_lm
from tests.unit.actors.conftest import helpers, tied, tokenizer  # noqa: F401 - the actor tests' fixtures


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    return tiny_lm
