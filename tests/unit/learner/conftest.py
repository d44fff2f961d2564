"""Fixtures for the learner tests: tiny random models, random σ-weighted samples, and ranks as threads."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rredcot.learner.batches import Gather
from rredcot.learner.packing import TrainSample
from tests.learner_samples import random_samples, tiny_lm


@pytest.fixture
def make_model() -> Callable[..., torch.nn.Module]:
    return tiny_lm


@pytest.fixture
def make_samples() -> Callable[..., list[TrainSample]]:
    return random_samples


def thread_all_gather(world: int) -> Callable[[int], Gather]:
    """An in-process all-gather for ``world`` threads (what the engine's collective does across ranks):
    each rank's gather, by rank."""
    slots: list[bytes] = [b""] * world
    barrier = threading.Barrier(world, timeout=30)

    def gather_for(rank: int) -> Gather:
        def gather(data: bytes) -> list[bytes]:
            slots[rank] = data
            barrier.wait()
            out = list(slots)
            barrier.wait()
            return out

        return gather

    return gather_for


def on_threads(world: int, body: Callable[[int], Any]) -> list[Any]:
    """``body(rank)`` on ``world`` threads (the ranks); their results, exceptions re-raised here."""
    out: list[Any] = [None] * world

    def run(rank: int) -> None:
        try:
            out[rank] = body(rank)
        except BaseException as e:  # noqa: BLE001 - re-raised below, on the test's thread
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


@pytest.fixture
def thread_gather() -> Callable[[int], Callable[[int], Gather]]:
    return thread_all_gather


@pytest.fixture
def on_ranks() -> Callable[[int, Callable[[int], Any]], list[Any]]:
    return on_threads
