from rredcot.common.files import files_digest, write_text_atomic


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    write_text_atomic(path, "run:\n  name: x\n")
    assert path.read_text() == "run:\n  name: x\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_files_digest_sees_a_changed_byte_and_a_renamed_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x = 1\n")
    b.write_bytes(b"y = 2\n")
    first = files_digest([a, b])
    assert files_digest([a, b]) == first
    a.write_bytes(b"x = 2\n")
    assert files_digest([a, b]) != first
    a.write_bytes(b"x = 1\n")
    a.rename(tmp_path / "c")
    assert files_digest([tmp_path / "c", b]) != first
