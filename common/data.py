"""Problems: dataset loaders (jsonl / parquet / Hugging Face datasets), the held-out split, a
deterministic resumable order.

Column conventions follow Numina-CoT and open-rs: ``problem`` and ``solution`` columns, and an
``answer`` column when present; otherwise the answer is the last ``\\boxed{...}`` of the solution.
A bad row raises ``DatasetError`` naming the file and the (1-based) row number.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rredcot.common.config import DataConfig


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the file and row."""


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    solution: str
    answer: str


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def problems_from_rows(rows: Iterable[Mapping[str, Any]], source: str, cfg: DataConfig) -> list[Problem]:
    """Validate rows (1-based numbering in errors) and map columns to ``Problem``s."""
    out = []
    for row_no, row in enumerate(rows, start=1):
        where = f"{source}: row {row_no}"
        if not isinstance(row, Mapping):
            raise DatasetError(f"{where}: expected an object with columns, got {type(row).__name__}")
        problem = _text(row, cfg.problem_column, where)
        solution = _text(row, cfg.solution_column, where)
        answer = row.get(cfg.answer_column) if cfg.answer_column else None
        if answer is None or str(answer).strip() == "":
            answer = last_boxed(solution)
            if answer is None:
                raise DatasetError(
                    f"{where}: no {cfg.answer_column!r} column and no \\boxed{{}} answer in the solution"
                )
        out.append(
            Problem(
                id=str(row.get("id", f"{Path(source).stem}-{row_no}")),
                problem=problem,
                solution=solution,
                answer=str(answer).strip(),
            )
        )
    if not out:
        raise DatasetError(f"{source}: no rows")
    return out


def _text(row: Mapping[str, Any], column: str, where: str) -> str:
    value = row.get(column)
    if not isinstance(value, str) or not value.strip():
        found = ", ".join(map(str, row.keys()))
        raise DatasetError(f"{where}: column {column!r} is missing or empty (columns found: {found})")
    return value


def read_jsonl(path: str | Path) -> Iterator[Mapping[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for row_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: row {row_no}: invalid JSON ({e.msg})") from None


def load_rows(cfg: DataConfig) -> list[Problem]:
    """All problems of ``data.path`` (``data.source``: jsonl, parquet or a Hugging Face dataset), in order."""
    path = str(cfg.path)
    if cfg.source == "jsonl":
        return problems_from_rows(read_jsonl(path), path, cfg)
    if cfg.source == "parquet":
        import pyarrow.parquet as pq

        return problems_from_rows(pq.read_table(path).to_pylist(), path, cfg)
    import datasets

    ds = datasets.load_from_disk(path) if Path(path).exists() else datasets.load_dataset(path, split=cfg.split)
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[cfg.split]
    return problems_from_rows(ds, f"{path}[{cfg.split}]", cfg)


def split_eval(problems: list[Problem], eval_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Deterministic (train, held-out eval) split."""
    order = np.random.default_rng(seed).permutation(len(problems))
    held = {int(i) for i in order[:eval_size]}
    train = [p for i, p in enumerate(problems) if i not in held]
    return train, [problems[i] for i in sorted(held)]


def train_and_held_out(task: Any, cfg: DataConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """The run's (training, held-out) problems of ``task`` (a ``common.task.Task``): every stage
    and the evaluator use this one split."""
    return split_eval(task.problems(cfg, seed), cfg.eval_size, cfg.shuffle_seed)


class ProblemOrder:
    """Deterministic epoch-wise shuffled order; ``at(n)`` is the n-th problem ever drawn.

    The global admission counter (``common.staleness``) supplies ``n``, so the position is shared
    by all generators and survives restarts without any extra state.
    """

    def __init__(self, problems: list[Problem], seed: int) -> None:
        if not problems:
            raise DatasetError("no training problems")
        self.problems, self.seed = problems, seed
        self._perms: dict[int, np.ndarray] = {}

    def at(self, n: int) -> Problem:
        epoch, pos = divmod(n, len(self.problems))
        perm = self._perms.get(epoch)
        if perm is None:
            perm = self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))
        return self.problems[int(perm[pos])]
