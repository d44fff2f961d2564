import re
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from rredcot.launch.observe.heap_trace import (
    ENV,
    FRAMES,
    OWN_FILES,
    HeapTrace,
    census_growth,
    heap_sites,
    heap_trace_period,
    tensor_census,
    traced_mib,
)


def _grow(store: list) -> None:
    store.append(bytes(64 * 1024))
    store.append(torch.zeros(777))


def _snapshots(path: Path) -> int:
    """How many snapshots the report written so far holds (the rows of its first table)."""
    if not path.exists():
        return 0
    return max(0, len(path.read_text().split("\n\n")[0].splitlines()) - 2)


def test_the_report_names_the_line_that_keeps_allocating(tmp_path):
    path, store = tmp_path / "w.heap.txt", []
    trace = HeapTrace(path, every_s=0.3).start()
    try:
        deadline = time.monotonic() + 30  # under load the tracer's thread takes its snapshots late
        while time.monotonic() < deadline and not (len(store) > 60 and _snapshots(path) >= 3):
            _grow(store)
            time.sleep(0.01)
    finally:
        trace.stop()
    report = path.read_text()
    # the totals per snapshot, the tensor kinds that grew, then the site that grew most
    totals, tensors, first_site = report.split("\n\n")[:3]
    assert "test_heap_trace.py" in first_site and "MiB in +" in first_site, report
    rows = [line.split() for line in totals.splitlines()[1:-1]]
    assert len(rows) >= 2 and all(float(rss) > float(traced) > 0 for _, rss, traced, _ in rows), report
    assert float(rows[-1][2]) > float(rows[0][2]), report  # the store's growth shows in the traced total
    # RSS moves with everything else in the process (and may fall): only its presence is checked
    assert re.fullmatch(r"since the first snapshot: RSS [+-]\d+\.\d MiB, traced \+\d+\.\d MiB", totals.splitlines()[-1])
    grown = re.search(r"\+(\d+\.\d+) MiB in \+(\d+) tensors float32\[777\] on cpu", tensors)
    assert grown and int(grown[2]) > 0 and tensors.splitlines()[1].strip().endswith(")"), report  # the largest first


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


def test_the_census_counts_tensors_by_kind_and_a_shared_storage_once():
    base = tensor_census()
    keep = [torch.ones(513, dtype=torch.float64) for _ in range(3)]
    whole = torch.zeros(1031, dtype=torch.int16)
    views = [whole[:7], whole[7:14]]  # two tensors of one kind over a storage of another
    now = tensor_census()
    n0, b0 = base.get(("cpu", "float64", (513,)), (0, 0))
    assert now[("cpu", "float64", (513,))] == (n0 + 3, b0 + 3 * 513 * 8)
    assert now[("cpu", "int16", (7,))][0] >= 2
    lines = census_growth(base, now)
    assert lines[0].startswith("live tensors:")
    assert any("+3 tensors float64[513] on cpu" in line for line in lines), lines
    int16 = [("cpu", "int16", (1031,)), ("cpu", "int16", (7,))]
    assert sum(now[k][1] - base.get(k, (0, 0))[1] for k in int16) == 1031 * 2  # one storage, three tensors
    assert len(keep) == 3 and len(views) == 2


def test_the_census_leaves_out_a_compilers_fake_tensors_with_symbolic_shapes():
    """vLLM's torch.compile leaves fake tensors alive in a generator; their SymInt shapes are unhashable."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = [mode.from_tensor(torch.zeros(4, 5), static_shapes=False, source=ConstantSource("x")), torch.ones(11)]
    census = tensor_census()
    assert ("cpu", "float32", (11,)) in census
    assert not [kind for kind in census if kind[2] == (4, 5) or not all(type(d) is int for d in kind[2])]
    assert len(fakes) == 2
