"""The code stays ruff clean and ruff formatted (the CI runs this with the rest of the suite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ["rredcot", "tests", "bench"]  # the package, its tests and its benchmarks


def ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is not installed (deploy/setup.sh installs the dev extra)"
    return [exe]


@pytest.mark.parametrize("args", [["check", "--quiet"], ["format", "--check", "--quiet"]])
def test_ruff(args: list[str]) -> None:
    out = subprocess.run([*ruff(), *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
