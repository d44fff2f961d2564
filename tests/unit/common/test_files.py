from rredcot.common.files import write_text_atomic


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    write_text_atomic(path, "run:\n  name: x\n")
    assert path.read_text() == "run:\n  name: x\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
