"""The rows a run trains on stay the rows it started with: a digest of ``data.path``'s rows is kept
with the run's Redis keys at its first start, and a later start of the run (a generator Ray
restarted, a resume with ``run.resume=auto``, ``rredcot generate`` alone) whose rows digest otherwise
is refused. A problem's id is its row, and an admission index its place in the order, so a file
edited under a live run would otherwise be trained under the old ids, silently.

The digest covers every row the task loaded (its id, problem, solution and answer; other columns do
not count), whatever ``data.source``: it is computed from the rows a generator reads anyway, so it
costs a hash over their text and no second read. The file's mtime is not part of it, so a copy
restored from a backup passes.
"""

from __future__ import annotations

import hashlib
from typing import Any

from rredcot.common.config import DataConfig
from rredcot.common.streams import run_key
from rredcot.tasks.data import DatasetError, Problem, train_and_held_out

DIGEST = "data_digest"  # the run's key: "<rows> rows, sha256 <16 hex digits>"


def rows_digest(problems: list[Problem]) -> str:
    """The rows' number and the first 16 hex digits of a SHA-256 over each row's fields, in order."""
    h = hashlib.sha256()
    for p in problems:
        for text in (p.id, p.problem, p.solution, p.answer):
            raw = text.encode("utf-8")
            h.update(len(raw).to_bytes(8, "little") + raw)
    return f"{len(problems)} rows, sha256 {h.hexdigest()[:16]}"


def hold_data_digest(client: Any, run_id: str, cfg: DataConfig, problems: list[Problem]) -> None:
    """Record the digest of ``problems`` (the rows of ``data.path``) for run ``run_id`` if none is
    recorded; raise ``DatasetError`` in one line if the recorded one differs. Kept with the run's
    keys, so ``run.resume=never`` (which deletes them) records anew. Without ``data.path`` (a task
    that generates its problems) nothing is recorded."""
    if cfg.path is None:
        return
    found = rows_digest(problems)
    name = run_key(client, run_id, DIGEST)
    client.set(name, found, nx=True)
    recorded = client.get(name).decode("utf-8", "replace")
    if recorded != found:
        raise DatasetError(
            f"data.path {cfg.path} changed since run {run_id!r} started: the run recorded {recorded} at its first "
            f"start, the file now gives {found}; a restarted generator would train on the new rows under the old "
            "problem ids -> restore the file, or start a new run with run.resume=never (or another run.name)"
        )


class _Loaded:
    """A task whose problems are already loaded (``train_and_held_out`` splits them as it would the task's)."""

    def __init__(self, problems: list[Problem]) -> None:
        self._problems = problems

    def problems(self, data: DataConfig, seed: int) -> list[Problem]:
        return self._problems


def checked_split(
    client: Any, run_id: str, task: Any, cfg: DataConfig, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """``train_and_held_out`` of ``task`` after ``hold_data_digest`` of the rows it loaded."""
    problems = task.problems(cfg, seed)
    hold_data_digest(client, run_id, cfg, problems)
    return train_and_held_out(_Loaded(problems), cfg, seed)
