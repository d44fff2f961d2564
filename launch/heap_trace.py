"""Python-heap growth of a worker, to find a slow leak: ``tracemalloc`` snapshots on a timer.

Set ``RREDCOT_HEAP_TRACE_S=<seconds>`` in the environment of ``rredcot train`` and every stage
worker traces its Python allocations; each period it writes to ``<run.dir>/logs/<worker>.heap.txt``
the allocation sites that grew most since its first snapshot, taken one period after the worker
started: choose a period longer than its start-up under tracing, or the start-up reads as growth.
Only Python's allocator is traced (not torch's, vLLM's or Ray's native memory), so each report
opens with the process's RSS beside the traced total at every snapshot so far: RSS that grows while
the traced heap stays flat is native memory. Tracing slows Python code: a diagnostic, off by default.
"""

from __future__ import annotations

import linecache
import os
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

from rredcot.common.files import write_text_atomic

ENV = "RREDCOT_HEAP_TRACE_S"
FRAMES = 8  # frames kept per allocation: enough to reach the caller in our code
TOP = 25
MIB = 2**20


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
    """This process's resident memory in MiB (Linux ``/proc``; NaN elsewhere)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return float("nan")
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / MIB


@dataclass(frozen=True)
class Sample:
    """One snapshot's totals: seconds since the worker started, its RSS and its traced heap (MiB)."""

    elapsed_s: float
    rss: float
    traced: float


def growth_report(base: tracemalloc.Snapshot, now: tracemalloc.Snapshot, history: list[Sample]) -> str:
    """The RSS and traced totals of every snapshot in ``history`` (the first is ``base``'s, the last
    ``now``'s), then the sites whose traced memory grew most from ``base`` to ``now``, largest first."""
    diffs = now.compare_to(base, "traceback")  # every site, largest change first
    grown = sum(s.size_diff for s in diffs) / MIB
    stats = [s for s in diffs if s.size_diff > 0][:TOP]
    lines = [f"{'s after start':>14} {'RSS MiB':>9} {'traced MiB':>11}"]
    lines += [f"{h.elapsed_s:>14.0f} {h.rss:>9.1f} {h.traced:>11.1f}" for h in history]
    first, last = history[0], history[-1]
    lines.append(f"since the first snapshot: RSS {last.rss - first.rss:+.1f} MiB, traced {grown:+.1f} MiB")
    for s in stats:
        lines.append(f"\n{s.size_diff / MIB:+.2f} MiB in {s.count_diff:+d} blocks (now {s.size / MIB:.2f} MiB)")
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

    def _snapshot(self) -> tracemalloc.Snapshot:
        own = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, linecache.__file__)]
        return tracemalloc.take_snapshot().filter_traces(own)  # not the report's own allocations

    def _sample(self, start: float, snapshot: tracemalloc.Snapshot) -> Sample:
        traced = sum(t.size for t in snapshot.traces) / MIB
        return Sample(time.monotonic() - start, rss_mib(), traced)

    def _loop(self) -> None:
        start = time.monotonic()
        if self._stop.wait(self.every_s):
            return
        base = self._snapshot()
        history = [self._sample(start, base)]
        while not self._stop.wait(self.every_s):
            now = self._snapshot()
            history.append(self._sample(start, now))
            write_text_atomic(self.path, growth_report(base, now, history))
