"""Each extension folder's README says what it holds, and its first table cannot drift from the
registry: a row per built-in and no other, each naming (as bare backticked words in its settings
column) exactly the fields of the settings dataclass the entry takes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rredcot.common.config import load_config
from rredcot.common.registry import CREDIT_METHODS, TASKS, WEIGHT_TRANSPORTS, Registry, load_class
from rredcot.tasks.task import Task
from rredcot.transports import deployment

ROOT = Path(__file__).resolve().parents[2]
CELL_SEPARATOR = re.compile(r"(?<!\\)\|")  # a pipe not escaped as \| (σ = 1/\|o\|)
CODE = re.compile(r"`([^`]+)`")
KEY = re.compile(r"[a-z_][a-z0-9_]*")


def first_table(text: str) -> list[dict[str, str]]:
    """The body rows of a markdown page's first table (outside code blocks), each a dict from its
    header's cells to its own, ``\\|`` read as ``|``."""
    rows: list[list[str]] = []
    for line in re.sub(r"```.*?```", "", text, flags=re.S).splitlines():
        if line.startswith("|"):
            cells = CELL_SEPARATOR.split(line.strip().removeprefix("|").removesuffix("|"))
            rows.append([c.strip().replace(r"\|", "|") for c in cells])
        elif rows:
            break
    assert len(rows) > 2, "no table with a body"
    header = rows[0]
    return [dict(zip(header, cells, strict=True)) for cells in rows[2:]]


def named(row: dict[str, str]) -> str:
    """The entry a row is about: the one backticked word of its first cell."""
    names = CODE.findall(next(iter(row.values())))
    assert len(names) == 1, f"row {row}: expected one `name` in its first cell"
    return names[0]


def keys_named(row: dict[str, str]) -> set[str]:
    """The settings keys a row names: the bare backticked words of its column headed ``settings``
    (a dotted key such as ``data.path`` is a reference, not one of the entry's keys)."""
    cell = next(v for k, v in row.items() if k.startswith("settings"))
    return {word for word in CODE.findall(cell) if KEY.fullmatch(word)}


def fields(settings: Any) -> set[str]:
    """The field names of a settings dataclass (or of the one a ``"module:Class"`` names); none for None."""
    return set() if settings is None else {f.name for f in dataclasses.fields(load_class(settings))}


def credit_settings(name: str) -> Any:
    """A credit method's own settings; one that reads another's (``settings_of``) names none."""
    method = CREDIT_METHODS.get(name)
    return None if method.settings_of else method.settings


@dataclass(frozen=True)
class Case:
    readme: str  # from the repository root
    registry: Registry[Any]
    settings: Callable[[str], Any]  # a built-in's name -> its settings dataclass, or None

    def rows(self) -> list[dict[str, str]]:
        return first_table((ROOT / self.readme).read_text(encoding="utf-8"))

    def builtin_rows(self) -> list[tuple[str, dict[str, str]]]:
        """(name, row) of the rows about a built-in (another row fails the test of names)."""
        return [(name, row) for row in self.rows() if self.registry.is_builtin(name := named(row))]


CASES = [  # a README of one more extension folder is one more case
    Case("rredcot/tasks/README.md", TASKS, lambda name: TASKS.get(name).Settings),
    Case("rredcot/redistributor/README.md", CREDIT_METHODS, credit_settings),
    Case("rredcot/transports/README.md", WEIGHT_TRANSPORTS, lambda name: WEIGHT_TRANSPORTS.get(name).settings),
]


def test_first_table_on_a_hand_case() -> None:
    text = "# T\n\n```\n| not | a table |\n```\n| a | b |\n|---|---|\n| `x` | 1/\\|o\\| |\n\n| c |\n|---|\n| d |\n"
    assert first_table(text) == [{"a": "`x`", "b": "1/|o|"}]
    row = {"method": "`m`", "settings (`credit.settings.<method>.<key>`)": "`alpha`, `beta`; `data.path`"}
    assert named(row) == "m" and keys_named(row) == {"alpha", "beta"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.readme)
def test_a_row_for_every_builtin_and_no_other(case: Case) -> None:
    builtins = [name for name in case.registry.names() if case.registry.is_builtin(name)]
    assert builtins, f"{case.registry.kind}: no built-ins"
    assert sorted(named(row) for row in case.rows()) == sorted(builtins)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.readme)
def test_each_row_names_its_settings_fields(case: Case) -> None:
    wrong = {
        name: (sorted(keys_named(row)), sorted(expected))
        for name, row in case.builtin_rows()
        if keys_named(row) != (expected := fields(case.settings(name)))
    }
    assert not wrong, f"{case.readme}: (keys named, fields) by row: {wrong}"


def test_the_tasks_table_says_which_tasks_check_slips() -> None:
    """``no`` exactly where the task keeps ``Task``'s answer (it has no slip checker)."""
    for name, row in CASES[0].builtin_rows():
        has_none = TASKS.get(name).checks_slips is Task.checks_slips
        assert (row["slip checker"] == "no") == has_none, row


def test_the_transports_table_says_what_each_deployment_needs() -> None:
    """Each needs column starts with yes or no as the transport's ``Deployment`` answers for a CPU run
    without evaluations (the cells say what changes it)."""
    columns = {"shared `run.dir`": "shared_run_dir", "`/dev/shm`": "shm_versions", "weight group": "group_size"}
    for name, row in CASES[2].builtin_rows():
        cfg = load_config("tests", [f"generation.weight_transport={name}", "data.eval_size=0"])
        needs = deployment(cfg)
        for column, method in columns.items():
            answer = getattr(needs, method)(cfg)
            assert row[column].startswith("yes" if answer not in (False, 0, None) else "no"), (name, column, answer)
