"""Problems: dataset loaders (jsonl / parquet / Hugging Face datasets), the held-out split, a
deterministic resumable order.

Column conventions follow Numina-CoT and open-rs: ``problem`` and ``solution`` columns, and an
``answer`` column when present; otherwise the answer is the last ``\\boxed{...}`` of the solution.
A bad row raises ``DatasetError`` naming the file and the (1-based) row number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from rredcot.common.config import DataConfig
from rredcot.common.errors import UserError
from rredcot.common.files import unreadable_file


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
        answer = _answer(row, cfg.answer_column, where) if cfg.answer_column else None
        if answer is None or answer.strip() == "":
            answer = last_boxed(solution)
            if answer is None:
                raise DatasetError(
                    f"{where}: no {cfg.answer_column!r} column and no \\boxed{{}} answer in the solution"
                )
        if not answer.strip():
            raise DatasetError(f"{where}: answer is empty (an empty \\boxed{{}} in the solution)")
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in (problem, solution, answer))
        if size > cfg.max_row_bytes:
            raise DatasetError(
                f"{where}: {size:,} bytes of problem, solution and answer, over data.max_row_bytes = "
                f"{cfg.max_row_bytes:,}"
            )
        out.append(
            Problem(
                id=str(row.get("id", f"{Path(source).stem}-{row_no}")),
                problem=problem,
                solution=solution,
                answer=answer.strip(),
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
    return _unicode(value, column, where)


def _answer(row: Mapping[str, Any], column: str, where: str) -> str | None:
    """The row's answer as text (None when absent); a list, a bool or a NaN is a ``DatasetError``."""
    value = row.get(column)
    if value is None:
        return None
    if isinstance(value, str):
        return _unicode(value, column, where)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DatasetError(f"{where}: column {column!r} must be a string or number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise DatasetError(f"{where}: column {column!r} must be a string or finite number, got {value}")
    return str(value)


def _unicode(value: str, column: str, where: str) -> str:
    """``value``, or a ``DatasetError`` when it holds a lone surrogate (no UTF-8 encodes it)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DatasetError(
            f"{where}: column {column!r} holds invalid Unicode (a lone surrogate {value[e.start]!r} at character "
            f"{e.start + 1})"
        ) from None
    return value


def read_jsonl(path: str | Path, max_bytes: int) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """``(line number, row)`` of a JSON-lines file, blank lines skipped; a line that is not UTF-8 or
    not JSON raises ``DatasetError`` with its number."""
    with _open_data(path, max_bytes) as f:
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


def _open_data(path: str | Path, max_bytes: int) -> BinaryIO:
    """``path`` opened for reading, or a ``DatasetError`` that names ``data.path``: it must be a
    regular file of at most ``max_bytes`` (``data.max_file_bytes``)."""
    problem = unreadable_file(path, max_bytes)
    if problem is not None:
        bound = "; raise data.max_file_bytes or" if "over the bound" in problem else ";"
        raise DatasetError(f"data.path {path}: {problem}{bound} fix data.path")
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as e:
        raise DatasetError(f"data.path {path}: {e.strerror.lower() if e.strerror else e}; fix data.path") from None


@contextmanager
def _reading_parquet(path: str, max_bytes: int) -> Iterator[Any]:
    """``pyarrow.parquet``, for reading ``path``: a file it cannot read raises ``DatasetError``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _open_data(path, max_bytes).close()
    try:
        yield pq
    except pa.ArrowException as e:
        raise DatasetError(f"data.path {path}: not a readable parquet file ({e})") from None


def _parquet_rows(path: str, limit: int | None, max_bytes: int) -> list[dict[str, Any]]:
    with _reading_parquet(path, max_bytes) as pq:
        if limit is None:
            return pq.read_table(path).to_pylist()
        first = next(pq.ParquetFile(path).iter_batches(batch_size=limit), None)
        return [] if first is None else first.to_pylist()


def _hf_dataset(cfg: DataConfig) -> Any:
    """The ``data.split`` of the Hugging Face dataset at ``data.path`` (a ``save_to_disk`` directory,
    else a hub id); a file, a directory without a dataset or a missing split is a ``DatasetError``."""
    import datasets

    path = str(cfg.path)
    if Path(path).exists() and not Path(path).is_dir():  # a file, a FIFO, a device: _open_data refuses the last two
        with _open_data(path, cfg.max_file_bytes) as f:
            head = f.read(4)
        looks = "parquet" if head == b"PAR1" else "jsonl" if head.lstrip().startswith(b"{") else None
        raise DatasetError(
            f"data.source = 'hf' is not allowed for the file {path}; expected one of 'hf' (a directory saved with "
            "datasets' save_to_disk, or a hub id), 'jsonl', 'parquet'"
            + (f": the file looks like {looks}, set data.source={looks}" if looks else "")
        )
    try:
        ds = datasets.load_from_disk(path) if Path(path).exists() else datasets.load_dataset(path, split=cfg.split)
    except FileNotFoundError as e:
        raise DatasetError(f"data.path {path}: {e}; fix data.path (data.source=hf)") from None
    except ValueError as e:  # a hub dataset without that split
        if "split" not in str(e):
            raise
        raise DatasetError(f"data.split = {cfg.split!r} is not allowed for {path}: {e}") from None
    if isinstance(ds, datasets.DatasetDict):
        if cfg.split not in ds:
            raise DatasetError(
                f"data.split = {cfg.split!r} is not allowed; expected one of {', '.join(map(repr, ds))} "
                f"(the splits of {path})"
            )
        ds = ds[cfg.split]
    return ds


def load_rows(cfg: DataConfig, limit: int | None = None) -> list[Problem]:
    """The problems of ``data.path`` (``data.source``: jsonl, parquet or a Hugging Face dataset), in
    order: all of them, or the first ``limit`` rows (checked the same way)."""
    path = str(cfg.path)
    if cfg.source == "jsonl":
        return problems_from_rows(islice(read_jsonl(path, cfg.max_file_bytes), limit), path, cfg)
    if cfg.source == "parquet":
        return problems_from_rows(enumerate(_parquet_rows(path, limit, cfg.max_file_bytes), start=1), path, cfg)
    return problems_from_rows(enumerate(islice(_hf_dataset(cfg), limit), start=1), f"{path}[{cfg.split}]", cfg)


def count_rows(cfg: DataConfig) -> int:
    """The rows of ``data.path`` without parsing them: a JSON-lines file's non-blank lines, a parquet
    file's metadata, a Hugging Face dataset's length (a hub id is downloaded)."""
    path = str(cfg.path)
    if cfg.source == "jsonl":
        with _open_data(path, cfg.max_file_bytes) as f:
            return sum(1 for line in f if line.strip())
    if cfg.source == "parquet":
        with _reading_parquet(path, cfg.max_file_bytes) as pq:
            return int(pq.ParquetFile(path).metadata.num_rows)
    return len(_hf_dataset(cfg))


def split_eval(problems: list[Problem], eval_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """Deterministic (train, held-out eval) split."""
    order = np.random.default_rng(seed).permutation(len(problems))
    held = {int(i) for i in order[:eval_size]}
    train = [p for i, p in enumerate(problems) if i not in held]
    return train, [problems[i] for i in sorted(held)]


def train_and_held_out(task: Any, cfg: DataConfig, seed: int) -> tuple[list[Problem], list[Problem]]:
    """The run's (training, held-out) problems of ``task`` (a ``tasks.task.Task``): every stage
    and the evaluator use this one split. ``data.train_size`` keeps the first N training problems."""
    problems = task.problems(cfg, seed)
    train, held = split_eval(problems, cfg.eval_size, cfg.shuffle_seed)
    if not train:
        raise DatasetError(
            f"{cfg.path or 'the task'} has {len(problems)} problems and data.eval_size = {cfg.eval_size} holds them "
            f"all out: set data.eval_size below {len(problems)}"
        )
    if cfg.train_size > len(train):
        raise DatasetError(
            f"data.train_size = {cfg.train_size}: {cfg.path or 'the task'} leaves {len(train)} problems to train on "
            f"after data.eval_size = {cfg.eval_size}; set data.train_size to at most {len(train)} (0: all of them)"
        )
    return train[: cfg.train_size or None], held


class ProblemOrder:
    """Deterministic epoch-wise shuffled order; ``at(n)`` is the n-th problem ever drawn.

    The global admission counter (``common.staleness``) supplies ``n``, so the position is shared
    by all generators and survives restarts without any extra state.
    """

    def __init__(self, problems: list[Problem], seed: int) -> None:
        if not problems:
            raise DatasetError("no training problems: data.eval_size holds out every problem of data.path")
        self.problems, self.seed = problems, seed
        self._perms: dict[int, np.ndarray] = {}

    def at(self, n: int) -> Problem:
        epoch, pos = divmod(n, len(self.problems))
        perm = self._perms.get(epoch)
        if perm is None:
            perm = self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))
        return self.problems[int(perm[pos])]
