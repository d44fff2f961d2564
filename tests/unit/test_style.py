"""The code stays ruff clean and ruff formatted (the CI runs this with the rest of the suite)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
# every package folder pyproject.toml installs, then the tests and the benchmarks
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
FOLDERS = sorted(set(PACKAGES.values())) + ["tests", "bench"]


def ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is not installed (launch/setup.sh installs the dev extra)"
    return [exe]


def test_every_package_folder_is_checked() -> None:
    assert {"actors", "redistributor", "learner", "common", "tasks", "launch"} <= set(FOLDERS)


@pytest.mark.parametrize("args", [["check", "--quiet"], ["format", "--check", "--quiet"]])
def test_ruff(args: list[str]) -> None:
    out = subprocess.run([*ruff(), *args, *FOLDERS], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
