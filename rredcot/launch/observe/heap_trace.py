"""Python-heap growth of a worker, to find a slow leak: ``tracemalloc`` snapshots on a timer.

Set ``RREDCOT_HEAP_TRACE_S=<seconds>`` in the environment of ``rredcot train`` and every stage
worker traces its Python allocations; each period it writes to ``<run.dir>/logs/<worker>.heap.txt``
the allocation sites that grew most since its first snapshot, taken one period after the worker
started: choose a period longer than its start-up under tracing, or the start-up reads as growth.
Only Python's allocator is traced (not torch's, vLLM's or Ray's native memory), so each report
opens with the process's RSS beside the traced total at every snapshot so far: RSS that grows while
the traced heap stays flat is native memory. Tracing slows Python code: a diagnostic, off by default.

Tensor storage is native memory too: each report also counts the live torch tensors that the
garbage collector sees, per (device, dtype, shape), and lists the kinds whose count or bytes grew
since the first snapshot, so tensors that something keeps adding to show by their shape even though
their Python wrappers are too small to stand out in the traced heap.

A snapshot of a vLLM worker holds millions of traces: each is reduced at once to its totals per
allocation site (one pass, ~3 s per million traces) and dropped, so the tracer neither holds a raw
snapshot (hundreds of MiB, which would read as growth) nor filters traces one by one (minutes).
"""

from __future__ import annotations

import gc
import linecache
import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import psutil

from rredcot.common.files import write_text_atomic
from rredcot.common.heap import trim_heap

ENV = "RREDCOT_HEAP_TRACE_S"
FRAMES = 8  # frames kept per allocation: enough to reach the caller in our code
TOP = 25
MIB = 2**20
OWN_FILES = frozenset({__file__, tracemalloc.__file__, linecache.__file__})  # the tracer's and its report's


def heap_trace_period() -> float | None:
    """Seconds between snapshots from ``RREDCOT_HEAP_TRACE_S``; None when it is not set."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise ValueError(f"{ENV}={value!r}: expected seconds between heap snapshots, a number > 0")
    return seconds


def rss_mib() -> float:
    """This process's resident memory in MiB."""
    return psutil.Process().memory_info().rss / MIB


Sites = dict[tracemalloc.Traceback, tracemalloc.Statistic]
TensorKind = tuple[str, str, tuple[int, ...]]  # device, dtype, shape
Census = dict[TensorKind, tuple[int, int]]  # kind -> (tensors, bytes of the storages they reach)


def tensor_census() -> Census:
    """The live torch tensors the garbage collector tracks, per kind: their number and the bytes of
    the distinct storages they reach (a storage shared by views counts once, under its first kind).
    Meta tensors and a compiler's fake tensors (symbolic shapes, no memory) are left out. Empty
    where torch is not imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    census: dict[TensorKind, list[int]] = {}
    seen: set[tuple[str, int]] = set()
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor) or obj.is_meta:  # type(): no proxy objects touched
            continue
        shape = tuple(obj.shape)
        if (fake is not None and isinstance(obj, fake.FakeTensor)) or not all(type(d) is int for d in shape):
            continue
        entry = census.setdefault((str(obj.device), str(obj.dtype).removeprefix("torch."), shape), [0, 0])
        entry[0] += 1
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without a storage (sparse, some subclasses)
            continue
        key = (str(obj.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            entry[1] += storage.nbytes()
    return {kind: (n, size) for kind, (n, size) in census.items()}


def census_growth(base: Census, now: Census) -> list[str]:
    """Lines for the tensor kinds whose count or bytes grew from ``base`` to ``now``, most bytes first."""
    (n0, bytes0), (n1, bytes1) = ((sum(n for n, _ in c.values()), sum(b for _, b in c.values())) for c in (base, now))
    lines = [f"live tensors: {n0} ({bytes0 / MIB:.1f} MiB) at the first snapshot, {n1} ({bytes1 / MIB:.1f} MiB) now"]
    grown = []
    for kind, (n, size) in now.items():
        n0, size0 = base.get(kind, (0, 0))
        if n > n0 or size > size0:
            grown.append((size - size0, n - n0, kind, n, size))
    grown.sort(key=lambda g: (g[0], g[1]), reverse=True)
    for size_diff, n_diff, (device, dtype, shape), n, size in grown[:TOP]:
        lines.append(
            f"  {size_diff / MIB:+.2f} MiB in {n_diff:+d} tensors {dtype}{list(shape)} on {device} "
            f"(now {n}, {size / MIB:.2f} MiB)"
        )
    return lines


def heap_sites() -> Sites:
    """The traced heap now, per allocation site (its traceback), without the tracer's own allocations."""
    snapshot = tracemalloc.take_snapshot()
    sites = {s.traceback: s for s in snapshot.statistics("traceback")}
    del snapshot
    trim_heap()  # the snapshot's pages go back to the OS, or the next RSS sample would count them
    return {tb: s for tb, s in sites.items() if not any(f.filename in OWN_FILES for f in tb)}


def traced_mib(sites: Sites) -> float:
    return sum(s.size for s in sites.values()) / MIB


@dataclass(frozen=True)
class Sample:
    """One snapshot's totals: seconds since the worker started, its RSS (taken just before the
    snapshot), its traced heap and the tracer's own bookkeeping (part of the RSS), in MiB."""

    elapsed_s: float
    rss: float
    traced: float
    tracer: float


def growth_report(base: Sites, now: Sites, history: list[Sample], tensors: tuple[Census, Census] = ({}, {})) -> str:
    """The RSS and traced totals of every snapshot in ``history`` (the first is ``base``'s, the last
    ``now``'s), the tensor kinds that grew (``tensors``: the first census and the last), then the
    sites whose traced memory grew most from ``base`` to ``now``, largest first."""
    grown = []
    for tb, s in now.items():
        before = base.get(tb)
        size_diff = s.size - (before.size if before else 0)
        if size_diff > 0:
            grown.append((size_diff, s.count - (before.count if before else 0), s))
    grown.sort(key=lambda g: g[0], reverse=True)
    lines = [f"{'s after start':>14} {'RSS MiB':>9} {'traced MiB':>11} {'tracer MiB':>11}"]
    lines += [f"{h.elapsed_s:>14.0f} {h.rss:>9.1f} {h.traced:>11.1f} {h.tracer:>11.1f}" for h in history]
    first, last = history[0], history[-1]
    lines.append(
        f"since the first snapshot: RSS {last.rss - first.rss:+.1f} MiB, traced {last.traced - first.traced:+.1f} MiB"
    )
    lines += ["", *census_growth(*tensors)]
    for size_diff, count_diff, s in grown[:TOP]:
        lines.append(f"\n{size_diff / MIB:+.2f} MiB in {count_diff:+d} blocks (now {s.size / MIB:.2f} MiB)")
        lines += [f"    {line}" for line in s.traceback.format(most_recent_first=True)]
    return "\n".join(lines) + "\n"


class HeapTrace:
    """Traces this process's Python allocations and rewrites ``path`` with the growth every ``every_s``."""

    def __init__(self, path: Path, every_s: float) -> None:
        self.path, self.every_s = path, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="heap-trace")

    def start(self) -> HeapTrace:
        tracemalloc.start(FRAMES)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        tracemalloc.stop()

    def _sample(self, start: float) -> tuple[Sample, Sites, Census]:
        rss, tracer = rss_mib(), tracemalloc.get_tracemalloc_memory() / MIB
        sites = heap_sites()
        return Sample(time.monotonic() - start, rss, traced_mib(sites), tracer), sites, tensor_census()

    def _loop(self) -> None:
        start = time.monotonic()
        if self._stop.wait(self.every_s):
            return
        first, base, base_tensors = self._sample(start)
        history = [first]
        while not self._stop.wait(self.every_s):
            sample, now, tensors = self._sample(start)
            history.append(sample)
            write_text_atomic(self.path, growth_report(base, now, history, (base_tensors, tensors)))
