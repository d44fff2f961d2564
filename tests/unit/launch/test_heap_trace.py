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
    first_site = report.split("\n\n")[1]  # the site that grew most
    assert "test_heap_trace.py" in first_site and "MiB in +" in first_site, report
    assert "since the first snapshot" in report.splitlines()[0]


def test_the_period_comes_from_the_environment_and_must_be_positive(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert heap_trace_period() is None
    monkeypatch.setenv(ENV, "30")
    assert heap_trace_period() == 30.0
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ValueError, match=f"{ENV}=.*a number > 0"):
            heap_trace_period()
