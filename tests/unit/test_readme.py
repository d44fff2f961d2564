"""The README shows what is true now: a short page whose "Current results" table holds at most 8
rows, and whose figures for the demo, the test suite and the fast tier are those of the newest row
of docs/benchmarks.md's table for the same measurement (no drift between the two pages)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"

DEMO, SUITE, FAST = (
    "### Every demo run",
    "## The test suite (the README's second command)",
    '### The fast tier (`-m "not slow"`)',
)
# README row (its "what" cell starts so) -> (benchmarks.md heading whose first table records it, which
# of that table's rows are this measurement, the columns whose figures the README must show)
MEASURES = {
    "the demo (first command)": (
        DEMO,
        lambda row: "AVX2" not in row["CPU, dtype"],
        ("time", "held-out sampled, change [95%]"),
    ),
    "the demo on a CPU without native bf16": (
        DEMO,
        lambda row: "AVX2" in row["CPU, dtype"],
        ("time", "held-out sampled, change [95%]"),
    ),
    "the tests (second command)": (SUITE, lambda row: "-n 3" not in row[0], ("tests", "time")),
    "the fast tier": (FAST, lambda row: True, ("tests", "time")),
}

COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")  # a digit: not a word like "defaced"
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# a figure: a decimal (a time, an accuracy, a change and its interval), a count of tests, or seconds
FIGURE = re.compile(
    r"(?<![\w.])([+\-−]?\d[\d,]*\.\d+)"
    r"|(?<![\w.])(\d[\d,]*)(?: GPU-only)? (passed|skipped|failed|tests)\b"
    r"|(?<![\w.])(\d[\d,]*) s\b"
)


class Row(dict):
    """A table row: its cells by header, and by position (``row[0]``)."""

    def __init__(self, header: list[str], cells: list[str]) -> None:
        super().__init__(zip(header, cells, strict=True))
        self.cells = cells

    def __getitem__(self, key: str | int) -> str:
        return self.cells[key] if isinstance(key, int) else super().__getitem__(key)


def figures(text: str) -> set[str]:
    """The figures a text shows, normalised (``1,030`` is ``1030``, ``−0.011`` is ``-0.011``,
    ``17 GPU-only skipped`` is ``17 skipped``)."""
    found = set()
    for m in FIGURE.finditer(text):
        if m[1]:
            found.add(m[1].replace("−", "-").replace(",", ""))
        elif m[2]:
            found.add(f"{m[2].replace(',', '')} {m[3]}")
        else:
            found.add(f"{m[4].replace(',', '')} s")
    return found


def table_after(text: str, heading: str) -> list[Row]:
    """The rows of the first table after a heading line (outside code blocks)."""
    lines = re.sub(r"```.*?```", "", text, flags=re.S).splitlines()
    assert heading in lines, f"no heading {heading!r}"
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows or line.startswith("#"):
            break
    assert len(rows) > 2, f"no table under {heading!r}"
    header, body = rows[0], rows[2:]
    return [Row(header, cells) for cells in body]


def readme_results(text: str) -> list[Row]:
    return table_after(text, "## Current results")


def newest(rows: list[Row]) -> Row:
    """The newest row: the latest date in its first cell, the last such row in the table."""

    def key(item: tuple[int, Row]) -> tuple[str, int]:
        dates = DATE.findall(item[1][0])
        assert dates, f"no date in {item[1][0]!r}"
        return max(dates), item[0]

    return max(enumerate(rows), key=key)[1]


def drift(readme: str, benchmarks: str) -> list[str]:
    """What the README's rows for the demo, the suite and the fast tier show that benchmarks.md's
    tables do not: each row must cite (by commit) its table's newest row for the measurement, show
    that row's figures, and show no figure that the rows it cites do not hold."""
    problems = []
    results = readme_results(readme)
    for what, (heading, selects, columns) in MEASURES.items():
        mine = [row for row in results if row["what"].startswith(what)]
        if len(mine) != 1:
            problems.append(f"README: {len(mine)} rows for {what!r}, expected one")
            continue
        row = mine[0]
        table = [r for r in table_after(benchmarks, heading) if selects(r)]
        cited = set(COMMIT.findall(row["where, when"]))
        rows = [r for r in table if cited & set(COMMIT.findall(r[0]))]
        latest = newest(table)
        if not any(r is latest for r in rows):
            problems.append(
                f"{what!r}: the README cites {sorted(cited)}, not the newest row of {heading!r} ({latest[0]})"
            )
        shown = figures(row["result"])
        held = set().union(*(figures(" ".join(r.cells)) for r in rows)) if rows else set()
        if missing := sorted(shown - held):
            problems.append(f"{what!r}: the README shows {missing}, which no row of {heading!r} it cites holds")
        if missing := sorted(figures(" ".join(latest[c] for c in columns)) - shown):
            problems.append(
                f"{what!r}: the newest row of {heading!r} ({latest[0]}) shows {missing}; the README does not"
            )
    return problems


def test_readme_is_short_and_its_results_few() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    rows = readme_results(text)
    assert 1 <= len(rows) <= 8, f"{len(rows)} result rows"
    for row in rows:  # each with where it ran and when
        assert DATE.search(row["where, when"]), row["what"]


def test_the_readmes_first_commands_are_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert "bash deploy/setup.sh && .venv/bin/rredcot train demo_cpu\n" in text
    assert "bash deploy/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile\n" in text


def test_figures_on_hand_cases() -> None:
    assert figures("**17.1 min**: 1030 passed, 17 GPU-only skipped; 1,201 s (20.0 min)") == {
        "17.1",
        "1030 passed",
        "17 skipped",
        "1201 s",
        "20.0",
    }
    assert figures("0.492 → 0.750, +0.258 [+0.136, −0.380], seeds 0–4 on 2 cores, AVX2") == {
        "0.492",
        "0.750",
        "+0.258",
        "+0.136",
        "-0.380",
    }
    assert COMMIT.findall("AMD EPYC (family 25 model 17), 9e26ce8, 2026-11-29; deadbeef0") == ["9e26ce8", "deadbeef0"]


def test_the_readmes_figures_are_the_newest_in_benchmarks() -> None:
    problems = drift(README.read_text(encoding="utf-8"), BENCHMARKS.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("page", "old", "new"),
    [
        ("readme", "12.6 min the latest", "12.9 min the latest"),
        (
            "readme",
            "**2.1 min** (121 s of tests, 1181 passed) on an AMD EPYC",
            "**2.1 min** (122 s of tests, 1181 passed) on an AMD EPYC",
        ),
        ("readme", "+0.088 [+0.030, +0.145]", "+0.088 [+0.031, +0.145]"),
        (
            "benchmarks",
            "| 1307 passed, 17 skipped (GPU-only) | 12.6 min |",
            "| 1307 passed, 17 skipped (GPU-only) | 12.8 min |",
        ),
        ("benchmarks", "+0.088 [+0.030, +0.145] | as above; cut 0.0%", "+0.088 [+0.031, +0.145] | as above; cut 0.0%"),
        (
            "benchmarks",
            "| 10.4 min | 0.388 → 0.467, +0.079 [+0.021, +0.138] | CPU engines",
            "| 10.5 min | 0.388 → 0.467, +0.079 [+0.021, +0.138] | CPU engines",
        ),
    ],
)
def test_a_figure_changed_on_one_page_only_is_drift(page: str, old: str, new: str) -> None:
    readme, benchmarks = README.read_text(encoding="utf-8"), BENCHMARKS.read_text(encoding="utf-8")
    if page == "readme":
        assert old in readme
        readme = readme.replace(old, new)
    else:
        assert old in benchmarks
        benchmarks = benchmarks.replace(old, new)
    assert drift(readme, benchmarks)


def test_a_newer_measurement_not_in_the_readme_is_drift() -> None:
    readme, benchmarks = README.read_text(encoding="utf-8"), BENCHMARKS.read_text(encoding="utf-8")
    fast = table_after(benchmarks, FAST)
    last = "| " + " | ".join(fast[-1].cells) + " |"
    newer = "| abcdef1, 2099-01-01 | 901 passed | 2.6 min (150 s of tests) | |"
    problems = drift(readme, benchmarks.replace(last, f"{last}\n{newer}"))
    assert any("abcdef1" in p for p in problems), problems
