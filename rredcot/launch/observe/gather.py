"""What workers on nodes without the shared ``run.dir`` wrote there, copied to the head's at the end.

A run whose weights go through the collective group needs no shared ``run.dir`` (``cluster_checks``),
but its workers still write their logs, the redistributors' traces and a learner's checkpoints into
``run.dir`` on their own node. Before the report is written, the driver runs a task on each such node
that streams every regular file under that node's ``run.dir`` back (``CHUNK_BYTES`` a message,
msgpack-encoded, never pickled data) and writes it at the same place under the head's ``run.dir``, so
the report, its heatmaps and the final model link see them. A file the head already has at that path
goes to ``nodes/<node>/<path>`` instead. Not copied: Ray's probe folder and the run's marker file,
which are the head's own. A driver that is killed copies nothing: those files stay on their node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import msgpack

log = logging.getLogger(__name__)
CHUNK_BYTES = 8 * 2**20
NOT_COPIED = {".probe", ".rredcot-run"}  # the head's own: the start checks' tokens, the run's marker
STALL_TIMEOUT_S = 120.0  # a node that sends nothing for this long is given up


@dataclass
class Gathered:
    """What came back from one node."""

    node: str
    files: int = 0
    bytes: int = 0
    moved: int = 0  # files the head already had at that path: written under nodes/<node>/


def node_files(run_dir: str) -> Iterator[bytes]:
    """Runs on the node: each regular file under ``run_dir`` (not symlinks, not ``NOT_COPIED``) as
    messages ``[path relative to run_dir, offset, data]``; a file's last message has less than
    ``CHUNK_BYTES`` of data (an empty one ends a file whose size is a multiple of it)."""
    root = Path(run_dir)
    if not root.is_dir():
        return
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_COPIED or path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as f:
            offset = 0
            while True:
                data = f.read(CHUNK_BYTES)
                yield msgpack.packb([rel.as_posix(), offset, data])
                offset += len(data)
                if len(data) < CHUNK_BYTES:
                    break


def destination(run_dir: Path, rel: str, node: str, head_had: set[str]) -> Path:
    """Where a node's file ``rel`` goes on the head: the same path, or ``nodes/<node>/<rel>`` when the
    head had a file there before the gathering started. Raises ValueError for a path that leaves
    ``run_dir``."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"node {node} sent a path outside run.dir: {rel!r}")
    if rel in head_had:
        return run_dir / "nodes" / node.replace(" ", "_").replace("(", "").replace(")", "") / p
    return run_dir / p


def write_message(run_dir: Path, message: bytes, head_had: set[str], got: Gathered) -> None:
    """Write one message of ``node_files`` under the head's ``run_dir`` (``destination``), counted in ``got``."""
    rel, offset, data = msgpack.unpackb(message)
    path = destination(run_dir, rel, got.node, head_had)
    if offset == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        got.files += 1
        got.moved += path != run_dir / rel
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    got.bytes += len(data)


def head_files(run_dir: Path) -> set[str]:
    """The head's files under ``run_dir`` (relative posix paths) before anything is gathered."""
    return {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()} if run_dir.is_dir() else set()


def gather(run_dir: Path, nodes: dict[str, str], stall_s: float = STALL_TIMEOUT_S) -> list[Gathered]:
    """Copy every file under ``run_dir`` on each of ``nodes`` (Ray node id → its label) into the head's
    ``run_dir``; returns what came from each. A node that fails, or sends nothing for ``stall_s``, is
    logged and left (what it sent so far stays)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0, num_returns="streaming")(node_files)
    had = head_files(run_dir)
    out = []
    for node_id, label in nodes.items():
        got = Gathered(label)
        out.append(got)
        stream = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            str(run_dir)
        )
        try:
            while True:
                ready, _ = ray.wait([stream], timeout=stall_s)
                if not ready:
                    raise TimeoutError(f"nothing came for {stall_s:.0f} s")
                try:
                    ref = next(stream)
                except StopIteration:
                    break
                write_message(run_dir, ray.get(ref), had, got)
        except Exception as e:  # noqa: BLE001 - a node gone or slow: the rest of the report still comes
            log.warning("could not copy the files of node %s to the head (%s: %s)", label, type(e).__name__, e)
            ray.cancel(stream, force=True)
            continue
        log.info(
            "copied %d file(s) (%.1f MB) from node %s's run.dir to the head's%s",
            got.files,
            got.bytes / 1e6,
            label,
            f"; {got.moved} the head also had went to nodes/" if got.moved else "",
        )
    return out
