"""The floors of ``docs/architecture.md`` hold in the imports: ``common`` imports nothing above it,
``tasks`` and ``transports`` import only ``common`` (and themselves), ``models`` only ``common`` and
``tasks`` (and itself), ``actors``, ``redistributor`` and ``learner`` only ``common``, ``tasks``,
``transports`` and ``models`` (and themselves), ``launch`` anything; and no two modules import each
other, directly or in a circle, at module level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rredcot import SUBPACKAGES

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rredcot"
ALLOWED = {
    "common": {"common"},
    "tasks": {"common", "tasks"},
    "transports": {"common", "transports"},
    "models": {"common", "tasks", "models"},
    "actors": {"common", "tasks", "transports", "models", "actors"},
    "redistributor": {"common", "tasks", "transports", "models", "redistributor"},
    "learner": {"common", "tasks", "transports", "models", "learner"},
}


def imports(path: Path, top_level_only: bool = False) -> list[str]:
    """The ``rredcot.*`` modules a file imports (anywhere, or at module level only)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.startswith("rredcot.")]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def test_every_subpackage_has_a_floor() -> None:
    """A new folder of the package gets its floor here (``launch`` may import anything, ``configs``
    holds YAML), so no room escapes the check below."""
    assert set(SUBPACKAGES) == set(ALLOWED) | {"launch", "configs"}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_floor_imports_only_what_the_architecture_allows(folder: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {m}"
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        for m in imports(path)
        if m.split(".")[1] not in ALLOWED[folder]
    ]
    assert wrong == []


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> modules it imports) as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return [*path[path.index(t) :], t]
            if t not in state and (found := visit(t, [*path, t])):
                return found
        state[m] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_find_circle_by_hand() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_module_level_import_circles() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    graph = {module_name(p): set(imports(p, top_level_only=True)) for p in files}
    assert find_circle({m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}) is None


def test_no_import_circles_counting_imports_inside_functions() -> None:
    """No circle either when the imports inside functions (made on first use) count: such a circle
    is an arrow pointing down a floor, or two modules that are one. ``from package import module``
    counts as importing the module. A registry's built-ins are named by strings, so they are no
    import here."""
    files = sorted(PACKAGE.rglob("*.py"))
    graph = {module_name(p): set(imports(p)) for p in files}
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                graph[module_name(p)] |= {f"{node.module}.{a.name}" for a in node.names}
    assert find_circle({m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}) is None
