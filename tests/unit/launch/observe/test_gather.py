"""Files of a node without the shared run.dir, streamed in chunks and written back on the head."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from rredcot.launch.observe import gather
from rredcot.launch.observe.gather import Gathered, destination, head_files, node_files, write_message

NODE = "10.0.0.2 (bbbbbbbb)"


def _node_dir(root: Path) -> Path:
    node = root / "node"
    (node / "logs").mkdir(parents=True)
    (node / "traces" / "rollouts").mkdir(parents=True)
    (node / ".probe").mkdir()
    (node / "logs" / "gen1.log").write_bytes(b"generator one\n" * 3)  # 42 bytes: 4 chunks of 12, the last short
    (node / "traces" / "rollouts" / "red1-a.msgpack").write_bytes(bytes(range(24)))  # 2 full chunks, then empty
    (node / "traces" / "empty.msgpack").write_bytes(b"")
    (node / "config.yaml").write_text("the node's own\n")  # the head has one too
    (node / ".probe" / "node-x").write_text("token")  # the head's start checks: never copied
    (node / ".rredcot-run").write_text("marker")
    os.symlink(node / "logs" / "gen1.log", node / "logs" / "link.log")  # a link: never followed
    return node


def test_a_nodes_files_come_back_whole_in_chunks_and_the_heads_own_stay(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gather, "CHUNK_BYTES", 12)
    node = _node_dir(tmp_path)
    messages = [msgpack.unpackb(m) for m in node_files(str(node))]
    assert [(rel, offset, len(data)) for rel, offset, data in messages] == [
        ("config.yaml", 0, 12),
        ("config.yaml", 12, 3),
        ("logs/gen1.log", 0, 12),
        ("logs/gen1.log", 12, 12),
        ("logs/gen1.log", 24, 12),
        ("logs/gen1.log", 36, 6),
        ("traces/empty.msgpack", 0, 0),
        ("traces/rollouts/red1-a.msgpack", 0, 12),
        ("traces/rollouts/red1-a.msgpack", 12, 12),
        ("traces/rollouts/red1-a.msgpack", 24, 0),
    ]

    head = tmp_path / "head"
    (head / "logs").mkdir(parents=True)
    (head / "config.yaml").write_text("the head's\n")
    (head / "logs" / "driver.log").write_text("driver\n")
    had = head_files(head)
    assert had == {"config.yaml", "logs/driver.log"}
    got = Gathered(NODE)
    for m in node_files(str(node)):
        write_message(head, m, had, got)
    assert (got.files, got.bytes, got.moved) == (4, 15 + 42 + 24, 1)
    assert (head / "logs" / "gen1.log").read_bytes() == (node / "logs" / "gen1.log").read_bytes()
    assert (head / "traces" / "rollouts" / "red1-a.msgpack").read_bytes() == bytes(range(24))
    assert (head / "traces" / "empty.msgpack").read_bytes() == b""
    assert (head / "config.yaml").read_text() == "the head's\n"  # the head's own file is kept
    assert (head / "nodes" / "10.0.0.2_bbbbbbbb" / "config.yaml").read_text() == "the node's own\n"
    assert not (head / ".probe").exists() and not (head / ".rredcot-run").exists()
    assert not (head / "logs" / "link.log").exists()


def test_a_path_that_leaves_run_dir_is_refused(tmp_path) -> None:
    for rel in ("../x", "/etc/passwd", "logs/../../x", ""):
        with pytest.raises(ValueError, match="outside run.dir"):
            destination(tmp_path, rel, NODE, set())
    assert destination(tmp_path, "logs/a.log", NODE, set()) == tmp_path / "logs" / "a.log"


def test_a_node_without_the_folder_sends_nothing(tmp_path) -> None:
    assert list(node_files(str(tmp_path / "absent"))) == []
