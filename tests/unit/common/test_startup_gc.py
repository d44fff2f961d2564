"""The start-up's collector: off inside the block, as it was after, and what the block made frozen."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest

from rredcot.common.startup_gc import collector_off, collector_on, import_frozen


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collector_enabled():
    """The collector on for the test, and as the test found it after."""
    enabled = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if enabled else gc.disable)()


def is_collectable(obj: object) -> bool:
    """Whether ``obj`` is in one of the collector's generations, not frozen. (The freeze count is no
    witness: a frozen object freed by another thread of the process lowers it.)"""
    return any(tracked is obj for tracked in gc.get_objects())


def test_the_block_runs_without_the_collector_and_what_it_made_is_frozen(collector_enabled):
    with collector_off():
        assert not gc.isenabled()
        made = Node()
    assert gc.isenabled() and not is_collectable(made)  # the cycle made in the block is frozen
    kept, after = weakref.ref(made), Node()
    freed = weakref.ref(after)
    del made, after
    gc.collect()
    assert kept() is not None and freed() is None  # a frozen cycle outlives a full collection; a later one does not


def test_a_collector_that_was_off_stays_off():
    enabled = gc.isenabled()
    gc.disable()
    try:
        with collector_off():
            pass
        assert not gc.isenabled()
    finally:
        (gc.enable if enabled else gc.disable)()


def test_the_collector_comes_back_when_the_block_fails(collector_enabled):
    with pytest.raises(RuntimeError), collector_off():
        raise RuntimeError("a start-up that failed")
    assert gc.isenabled()


def test_only_a_modules_first_import_freezes(tmp_path, monkeypatch, collector_enabled):
    (tmp_path / "rredcot_gc_probe.py").write_text("class Probe:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rredcot_gc_probe", raising=False)
    witness = Node()
    module = import_frozen("rredcot_gc_probe")
    assert module.Probe.__name__ == "Probe" and sys.modules["rredcot_gc_probe"] is module
    assert not is_collectable(witness)  # the first import froze
    witness = Node()
    assert import_frozen("rredcot_gc_probe") is module
    assert is_collectable(witness)  # loaded already: nothing more frozen


def test_work_inside_a_start_up_runs_with_the_collector_and_keeps_no_garbage(collector_enabled):
    """A model built on first use inside a worker's start: its garbage is collected as it goes, and
    nothing of it is frozen when the start-up ends."""
    with collector_off():
        with collector_on():
            assert gc.isenabled()
            garbage = weakref.ref(Node())  # a cycle with no reference left
            gc.collect()
            assert garbage() is None
        assert not gc.isenabled()  # the start-up's state again
    assert gc.isenabled()
