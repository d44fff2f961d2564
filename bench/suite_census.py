"""Suite census: the CPU seconds each test costs the machine, and the least wall time the suite can take.

Runs pytest on PATHS one test at a time (no xdist), with this module as its plugin: before and after
each test, the machine's busy CPU seconds (``/proc/stat``: every process, so Ray's daemons and a
test's subprocesses count too; keep the machine otherwise idle). Prints the heaviest files, the
whole runs (those ``tests/scheduling.py`` has the scheduler run in turn) against the rest, and the
floor: the CPU seconds over this machine's cores, the wall time no schedule of these tests can beat
here. The last line is one JSON object.

    rredcot bench suite_census [--top 25] [PATHS...]   (default: tests, about 20 min on 2 cores)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository: bench.actor_start, tests.scheduling

from bench.actor_start import busy_cpu_s  # noqa: E402
from rredcot.launch.arguments import bounded_int  # noqa: E402
from rredcot.launch.plan import local_cores  # noqa: E402
from tests.scheduling import runs_in_turn  # noqa: E402

OUT_ENV = "RREDCOT_SUITE_CENSUS"  # the plugin's output: one JSON line a test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """The plugin (``pytest -p bench.suite_census``): a test's wall time and the machine's CPU seconds
    over it, set-up and tear-down included, appended to ``$RREDCOT_SUITE_CENSUS``."""
    cpu, start = busy_cpu_s(), time.monotonic()
    yield
    record = {"id": item.nodeid, "wall_s": time.monotonic() - start, "cpu_s": busy_cpu_s() - cpu}
    with open(os.environ[OUT_ENV], "a") as f:
        f.write(json.dumps(record) + "\n")


def tally(records: list[dict]) -> dict:
    """Tests, wall and CPU seconds of ``records``."""
    return {
        "tests": len(records),
        "wall_s": sum((r["wall_s"] for r in records), 0.0),
        "cpu_s": sum((r["cpu_s"] for r in records), 0.0),
    }


def census(records: list[dict], cores: int) -> dict:
    """Per file, and whole runs against the rest (``tests.scheduling.runs_in_turn``): tests, wall and CPU
    seconds; the floor is the total CPU seconds over ``cores``."""
    files: dict[str, list[dict]] = collections.defaultdict(list)
    parts: dict[str, list[dict]] = {"runs": [], "rest": []}
    for r in records:
        files[r["id"].split("::", 1)[0]].append(r)
        parts["runs" if runs_in_turn(r["id"]) else "rest"].append(r)
    total = tally(records)
    by_file = {name: tally(rs) for name, rs in files.items()}
    return {
        **total,
        "cores": cores,
        "floor_s": total["cpu_s"] / cores,
        "parts": {part: tally(rs) for part, rs in parts.items()},
        "files": dict(sorted(by_file.items(), key=lambda kv: -kv[1]["cpu_s"])),
    }


def print_table(result: dict, top: int) -> None:
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file")
    for name, row in list(result["files"].items())[:top]:
        print(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f} {row['tests']:6d}  {name}")
    for part, row in result["parts"].items():
        print(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f} {row['tests']:6d}  ({part})")
    print(
        f"{result['cpu_s']:8.1f} {result['wall_s']:8.1f} {result['tests']:6d}  (all): at least "
        f"{result['floor_s'] / 60:.1f} min on {result['cores']} cores, each always busy"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top", type=bounded_int(1, 1000), default=25, help="files listed, heaviest first")
    p.add_argument("paths", nargs="*", default=["tests"], help="what pytest runs (default: tests)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "census.jsonl"
        out.touch()
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "bench.suite_census", *args.paths]
        done = subprocess.run(command, cwd=REPO, env=os.environ | {OUT_ENV: str(out)})
        records = [json.loads(line) for line in out.read_text().splitlines()]
    result = census(records, local_cores())
    print_table(result, args.top)
    print(json.dumps({"pytest_exit": done.returncode, **{k: v for k, v in result.items() if k != "files"}}))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
