import re
import time
import tracemalloc

import pytest

from rredcot.launch.heap_trace import ENV, FRAMES, OWN_FILES, HeapTrace, heap_sites, heap_trace_period, traced_mib


def _grow(store: list[bytes]) -> None:
    store.append(bytes(64 * 1024))


def test_the_report_names_the_line_that_keeps_allocating(tmp_path):
    path, store = tmp_path / "w.heap.txt", []
    trace = HeapTrace(path, every_s=0.3).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (path.exists() and len(store) > 60):
            _grow(store)
            time.sleep(0.01)
    finally:
        trace.stop()
    report = path.read_text()
    totals, first_site = report.split("\n\n")[:2]  # the totals per snapshot, then the site that grew most
    assert "test_heap_trace.py" in first_site and "MiB in +" in first_site, report
    rows = [line.split() for line in totals.splitlines()[1:-1]]
    assert len(rows) >= 2 and all(float(rss) > float(traced) > 0 for _, rss, traced, _ in rows), report
    assert float(rows[-1][2]) > float(rows[0][2]), report  # the store's growth shows in the traced total
    # RSS moves with everything else in the process (and may fall): only its presence is checked
    assert re.fullmatch(r"since the first snapshot: RSS [+-]\d+\.\d MiB, traced \+\d+\.\d MiB", totals.splitlines()[-1])


def test_the_period_comes_from_the_environment_and_must_be_positive(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert heap_trace_period() is None
    monkeypatch.setenv(ENV, "30")
    assert heap_trace_period() == 30.0
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}=.*a number > 0"):
            heap_trace_period()


def test_the_tracers_own_snapshots_are_not_counted_as_the_workers_heap():
    tracemalloc.start(FRAMES)
    try:
        store = [str(i) for i in range(20_000)]  # the worker's heap: one site
        base = heap_sites()  # held from here on, like the tracer's first snapshot
        now = heap_sites()
    finally:
        tracemalloc.stop()
    assert traced_mib(base) > 0.5 and len(store) == 20_000
    assert abs(traced_mib(now) - traced_mib(base)) < 0.05  # the held base and its report are not growth
    assert not [tb for tb in [*base, *now] if any(f.filename in OWN_FILES for f in tb)]
