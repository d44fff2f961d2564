"""``bench/suite_census.py``: the CPU seconds each test costs the machine, and the suite's floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suite_census import census

REPO = Path(__file__).resolve().parents[2]

SAMPLE = """
import time

def test_spins():
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass

def test_sleeps():
    time.sleep(0.5)

def test_fails():
    assert False
"""


def test_census_on_hand_records() -> None:
    records = [
        {"id": "tests/fault/test_x.py::test_a", "wall_s": 40.0, "cpu_s": 60.0},
        {"id": "tests/unit/test_y.py::test_b", "wall_s": 2.0, "cpu_s": 1.0},
        {"id": "tests/unit/test_y.py::test_c[1]", "wall_s": 3.0, "cpu_s": 3.0},
    ]
    result = census(records, cores=2)
    assert result["cpu_s"] == 64.0 and result["wall_s"] == 45.0 and result["floor_s"] == 32.0
    assert result["parts"] == {
        "runs": {"tests": 1, "wall_s": 40.0, "cpu_s": 60.0},
        "rest": {"tests": 2, "wall_s": 5.0, "cpu_s": 4.0},
    }
    assert list(result["files"]) == ["tests/fault/test_x.py", "tests/unit/test_y.py"]  # heaviest first
    assert result["files"]["tests/unit/test_y.py"] == {"tests": 2, "wall_s": 5.0, "cpu_s": 4.0}


def test_the_bench_runs_pytest_counts_every_test_and_exits_with_its_code(tmp_path: Path) -> None:
    """A test that spins for half a second costs at least that CPU time (the machine's count includes
    what runs beside it, so only a lower bound holds); a failed test is counted, and the bench exits
    with pytest's code."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    done = subprocess.run(
        [sys.executable, "bench/suite_census.py", "--top", "3", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # test_fails
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["pytest_exit"] == 1 and summary["tests"] == 3 and summary["parts"]["runs"]["tests"] == 0
    assert summary["wall_s"] >= 1.0 and summary["cpu_s"] >= 0.45
    assert summary["floor_s"] == pytest.approx(summary["cpu_s"] / summary["cores"])
    assert "test_sample.py" in done.stdout and "(all): at least" in done.stdout
