import time

import pytest

from rredcot.launch.heap_trace import ENV, HeapTrace, heap_trace_period


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
    assert len(rows) >= 2 and all(float(rss) > float(traced) > 0 for _, rss, traced in rows), report
    assert float(rows[-1][2]) > float(rows[0][2]), report  # the store's growth shows in the traced total
    assert totals.splitlines()[-1].startswith("since the first snapshot: RSS +"), report


def test_the_period_comes_from_the_environment_and_must_be_positive(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert heap_trace_period() is None
    monkeypatch.setenv(ENV, "30")
    assert heap_trace_period() == 30.0
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}=.*a number > 0"):
            heap_trace_period()
