"""Python-heap growth of a worker, to find a slow leak: ``tracemalloc`` snapshots on a timer.

Set ``RREDCOT_HEAP_TRACE_S=<seconds>`` in the environment of ``rredcot train`` and every stage
worker traces its Python allocations; each period it writes to ``<run.dir>/logs/<worker>.heap.txt``
the allocation sites that grew most since its first snapshot, taken one period after the worker
started: choose a period longer than its start-up under tracing, or the start-up reads as growth.
Only Python's allocator is traced (not torch's, vLLM's or Ray's native memory), so each report
opens with the process's RSS beside the traced total at every snapshot so far: RSS that grows while
the traced heap stays flat is native memory. Tracing slows Python code: a diagnostic, off by default.

A snapshot of a vLLM worker holds millions of traces: each is reduced at once to its totals per
allocation site (one pass, ~3 s per million traces) and dropped, so the tracer neither holds a raw
snapshot (hundreds of MiB, which would read as growth) nor filters traces one by one (minutes).
"""

from __future__ import annotations

import linecache
import os
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


def growth_report(base: Sites, now: Sites, history: list[Sample]) -> str:
    """The RSS and traced totals of every snapshot in ``history`` (the first is ``base``'s, the last
    ``now``'s), then the sites whose traced memory grew most from ``base`` to ``now``, largest first."""
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

    def _sample(self, start: float) -> tuple[Sample, Sites]:
        rss, tracer = rss_mib(), tracemalloc.get_tracemalloc_memory() / MIB
        sites = heap_sites()
        return Sample(time.monotonic() - start, rss, traced_mib(sites), tracer), sites

    def _loop(self) -> None:
        start = time.monotonic()
        if self._stop.wait(self.every_s):
            return
        first, base = self._sample(start)
        history = [first]
        while not self._stop.wait(self.every_s):
            sample, now = self._sample(start)
            history.append(sample)
            write_text_atomic(self.path, growth_report(base, now, history))
