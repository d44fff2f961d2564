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
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from rredcot.common.config import DataConfig
from rredcot.common.errors import UserError


class DatasetError(UserError):
    """A dataset that cannot be used; the message names the file and row."""

    label = "data error"


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


def problems_from_rows(rows: Iterable[tuple[int, Mapping[str, Any]]], source: str, cfg: DataConfig) -> list[Problem]:
    """Validate ``(row number, row)`` pairs (the number is what errors name: a JSON-lines file's
    line, else the 1-based row) and map columns to ``Problem``s."""
    out = []
    for row_no, row in rows:
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


def read_jsonl(path: str | Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(line number, row)`` of a JSON-lines file, blank lines skipped; a line that is not UTF-8 or
    not JSON raises ``DatasetError`` with its number."""
    with _open_data(path) as f:
        for row_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(
                    f"{path}: row {row_no}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                yield row_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{path}: row {row_no}: invalid JSON ({e.msg})") from None


def _open_data(path: str | Path) -> BinaryIO:
    """``path`` opened for reading, or a ``DatasetError`` that names ``data.path``."""
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as e:
        raise DatasetError(f"data.path {path}: {e.strerror.lower() if e.strerror else e}; fix data.path") from None


def _parquet_rows(path: str, limit: int | None) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    _open_data(path).close()
    try:
        if limit is None:
            return pq.read_table(path).to_pylist()
        first = next(pq.ParquetFile(path).iter_batches(batch_size=limit), None)
        return [] if first is None else first.to_pylist()
    except pa.ArrowException as e:
        raise DatasetError(f"data.path {path}: not a readable parquet file ({e})") from None


def load_rows(cfg: DataConfig, limit: int | None = None) -> list[Problem]:
    """The problems of ``data.path`` (``data.source``: jsonl, parquet or a Hugging Face dataset), in
    order: all of them, or the first ``limit`` rows (checked the same way)."""
    path = str(cfg.path)
    if cfg.source == "jsonl":
        return problems_from_rows(islice(read_jsonl(path), limit), path, cfg)
    if cfg.source == "parquet":
        return problems_from_rows(enumerate(_parquet_rows(path, limit), start=1), path, cfg)
    import datasets

    ds = datasets.load_from_disk(path) if Path(path).exists() else datasets.load_dataset(path, split=cfg.split)
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[cfg.split]
    return problems_from_rows(enumerate(islice(ds, limit), start=1), f"{path}[{cfg.split}]", cfg)


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
