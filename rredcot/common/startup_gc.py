"""Python's cyclic garbage collector during a process's start-up.

A worker's start imports torch, transformers, vLLM or DeepSpeed and builds its model: millions of
objects that live as long as the process. The collector walks every one of them at each full
collection, and the libraries ask for several while they build (vLLM's loader, its engine core);
automatic collections fire hundreds of times as the imports allocate. ``collector_off`` runs such a
phase with the collector off and then freezes what it made (``gc.freeze``: moved out of every later
collection, as vLLM's own engine core does once it is built). A 2-step run of the tests config took
43.8 CPU-s instead of 51.1 (docs/benchmarks.md, "Start-up without the cyclic collector").
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The block runs with the cyclic collector off; every object tracked when it ends (what the
    block made, and what lived before it) is frozen, then the collector is as it was. Use it around
    imports and the build of objects that live until the process ends: a frozen object is never
    collected (``gc.unfreeze`` hands them all back)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


@contextlib.contextmanager
def collector_on() -> Iterator[None]:
    """The block runs with the collector on, whatever it was, and nothing is frozen after: for work
    inside a start-up that is not start-up (building a model on first use, an SFT of minutes), whose
    garbage must be collected, not kept for the process's life."""
    enabled = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not enabled:
            gc.disable()


def import_frozen(name: str) -> ModuleType:
    """Module ``name``; its first import runs under ``collector_off`` (later ones find it loaded and
    freeze nothing: a process that builds engine after engine keeps its own garbage collectable)."""
    if name in sys.modules:
        return sys.modules[name]
    with collector_off():
        return importlib.import_module(name)
