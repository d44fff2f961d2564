import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rredcot.common.config import DataConfig, TaskConfig
from rredcot.tasks.data import (
    DatasetError,
    ProblemOrder,
    count_rows,
    last_boxed,
    load_rows,
    split_eval,
    train_and_held_out,
)
from rredcot.tasks.task import build_task


def _jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_last_boxed_balances_braces():
    assert last_boxed(r"so \boxed{1} and finally \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{unclosed") is None


def test_jsonl_numina_convention_answer_from_boxed(tmp_path):
    f = _jsonl(
        tmp_path / "n.jsonl",
        [
            {"problem": "1+1?", "solution": r"It is \boxed{2}."},
            {"problem": "2*3?", "solution": "6", "answer": "6"},
        ],
    )
    probs = load_rows(DataConfig(source="jsonl", path=str(f)))
    assert [(p.problem, p.answer) for p in probs] == [("1+1?", "2"), ("2*3?", "6")]


def test_bad_row_names_file_and_row(tmp_path):
    f = _jsonl(
        tmp_path / "bad.jsonl",
        [
            {"problem": "a", "solution": r"\boxed{1}"},
            {"problem": "b", "solution": r"\boxed{2}"},
            {"question": "c", "solution": r"\boxed{3}"},
        ],
    )
    with pytest.raises(DatasetError) as e:
        load_rows(DataConfig(source="jsonl", path=str(f)))
    assert f"{f}: row 3" in str(e.value) and "'problem'" in str(e.value) and "question" in str(e.value)


def test_a_bad_row_after_blank_lines_names_its_line(tmp_path):
    """Blank lines are skipped, but the row number an error names is the file's line, as an editor shows it."""
    f = tmp_path / "gaps.jsonl"
    f.write_text('{"problem": "a", "solution": "\\\\boxed{1}"}\n\n\n{"solution": "\\\\boxed{2}"}\n')
    with pytest.raises(DatasetError, match=f"{f.name}: row 4: column 'problem' is missing"):
        load_rows(DataConfig(source="jsonl", path=str(f)))


def test_invalid_json_names_row(tmp_path):
    f = _jsonl(tmp_path / "broken.jsonl", [{"problem": "a", "solution": "x", "answer": "1"}, "{oops"])
    with pytest.raises(DatasetError, match="broken.jsonl: row 2: invalid JSON"):
        load_rows(DataConfig(source="jsonl", path=str(f)))


def test_missing_answer_everywhere(tmp_path):
    f = _jsonl(tmp_path / "na.jsonl", [{"problem": "a", "solution": "no box here"}])
    with pytest.raises(DatasetError, match=r"row 1: no 'answer' column and no \\boxed"):
        load_rows(DataConfig(source="jsonl", path=str(f)))


def test_parquet_and_column_mapping(tmp_path):
    f = tmp_path / "openrs.parquet"
    pq.write_table(pa.table({"question": ["q1", "q2"], "sol": ["s1", "s2"], "ans": ["1", "2"]}), f)
    cfg = DataConfig(
        source="parquet", path=str(f), problem_column="question", solution_column="sol", answer_column="ans"
    )
    assert [p.answer for p in load_rows(cfg)] == ["1", "2"]


def test_hf_dataset_from_disk(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"problem": ["p"], "solution": [r"\boxed{7}"]}).save_to_disk(str(tmp_path / "ds"))
    probs = load_rows(DataConfig(source="hf", path=str(tmp_path / "ds")))
    assert probs[0].answer == "7"


def test_order_is_deterministic_resumable_and_covers_each_epoch():
    probs = build_task(TaskConfig("arith", {"size": 50})).problems(DataConfig(), 0)
    a, b = ProblemOrder(probs, seed=3), ProblemOrder(probs, seed=3)
    first_epoch = [a.at(n).id for n in range(50)]
    assert sorted(first_epoch) == sorted(p.id for p in probs)  # each problem once per epoch
    assert [b.at(n).id for n in range(120)][17:] == [a.at(n).id for n in range(17, 120)]  # random access
    assert [a.at(n).id for n in range(50, 100)] != first_epoch  # reshuffled per epoch
    assert [ProblemOrder(probs, seed=4).at(n).id for n in range(50)] != first_epoch


def test_split_eval_is_disjoint_and_deterministic():
    probs = build_task(TaskConfig("arith", {"size": 100, "operand_max": 30})).problems(DataConfig(), 0)
    assert len(probs) == 100
    train, held = split_eval(probs, 10, seed=1)
    assert len(held) == 10 and len(train) == 90
    assert not {p.problem for p in train} & {p.problem for p in held}
    assert split_eval(probs, 10, seed=1) == (train, held)


def test_a_row_that_is_not_utf8_names_its_row(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"problem": "a", "solution": "s", "answer": "1"}\n{"problem": "caf\xe9", "solution": "s"}\n')
    with pytest.raises(DatasetError, match=r"latin1.jsonl: row 2: not UTF-8 \(byte 0xe9 at column 17\)"):
        load_rows(DataConfig(source="jsonl", path=str(f)))


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_a_missing_or_unreadable_path_names_data_path(tmp_path, source):
    with pytest.raises(DatasetError, match=r"data.path .*nope: no such file or directory; fix data.path"):
        load_rows(DataConfig(source=source, path=str(tmp_path / "nope")))
    with pytest.raises(DatasetError, match="is a directory"):
        load_rows(DataConfig(source=source, path=str(tmp_path)))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    f = tmp_path / "rows.parquet"
    f.write_text('{"problem": "a"}\n')
    with pytest.raises(DatasetError, match="rows.parquet: not a readable parquet file"):
        load_rows(DataConfig(source="parquet", path=str(f)))


def test_the_first_rows_are_read_without_the_rest(tmp_path):
    rows = [{"problem": f"p{i}", "solution": "s", "answer": str(i)} for i in range(5)]
    f = _jsonl(tmp_path / "d.jsonl", [*rows, "{oops"])
    assert [p.answer for p in load_rows(DataConfig(source="jsonl", path=str(f)), limit=3)] == ["0", "1", "2"]
    with pytest.raises(DatasetError, match="row 6"):
        load_rows(DataConfig(source="jsonl", path=str(f)))
    pq.write_table(pa.table({k: [r[k] for r in rows] for k in rows[0]}), tmp_path / "d.parquet")
    cfg = DataConfig(source="parquet", path=str(tmp_path / "d.parquet"))
    assert [p.problem for p in load_rows(cfg, limit=2)] == ["p0", "p1"] and len(load_rows(cfg)) == 5


@pytest.mark.parametrize(("name", "looks"), [("rows.jsonl", "jsonl"), ("rows.parquet", "parquet"), ("rows.txt", None)])
def test_hf_source_on_a_file_names_data_source(tmp_path, name, looks):
    f = tmp_path / name
    if looks == "parquet":
        pq.write_table(pa.table({"problem": ["p"], "solution": [r"\boxed{1}"]}), f)
    else:
        f.write_text('{"problem": "p", "solution": "\\\\boxed{1}"}\n' if looks else "p\n")
    with pytest.raises(DatasetError) as e:
        load_rows(DataConfig(source="hf", path=str(f)))
    msg = str(e.value)
    assert f"data.source = 'hf' is not allowed for the file {f}; expected one of 'hf' (" in msg and "'parquet'" in msg
    assert (f"the file looks like {looks}, set data.source={looks}" in msg) == bool(looks), msg


def test_a_missing_hf_split_or_a_directory_without_a_dataset_is_named(tmp_path):
    import datasets

    rows = datasets.Dataset.from_dict({"problem": ["p"], "solution": [r"\boxed{7}"]})
    datasets.DatasetDict({"train": rows, "validation": rows}).save_to_disk(str(tmp_path / "dd"))
    assert load_rows(DataConfig(source="hf", path=str(tmp_path / "dd")))[0].answer == "7"
    with pytest.raises(
        DatasetError, match=r"data.split = 'test' is not allowed; expected one of 'train', 'validation'"
    ):
        load_rows(DataConfig(source="hf", path=str(tmp_path / "dd"), split="test"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"data.path .*empty: .*; fix data.path \(data.source=hf\)"):
        load_rows(DataConfig(source="hf", path=str(tmp_path / "empty")))


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ("[1, 2]", "column 'answer' must be a string or number, got list"),
        ("true", "column 'answer' must be a string or number, got bool"),
        ('{"a": 1}', "column 'answer' must be a string or number, got dict"),
        ("NaN", "column 'answer' must be a string or finite number, got nan"),
        ("Infinity", "column 'answer' must be a string or finite number, got inf"),
    ],
)
def test_an_answer_that_is_no_string_or_number_names_file_and_row(tmp_path, answer, says):
    f = tmp_path / "a.jsonl"
    f.write_text(
        f'{{"problem": "p", "solution": "s", "answer": "1"}}\n{{"problem": "q", "solution": "s", "answer": {answer}}}\n'
    )
    with pytest.raises(DatasetError, match=f"a.jsonl: row 2: {re.escape(says)}"):
        load_rows(DataConfig(source="jsonl", path=str(f)))


def test_an_empty_answer_is_refused_and_numbers_are_answers(tmp_path):
    f = _jsonl(tmp_path / "e.jsonl", [{"problem": "p", "solution": r"so \boxed{ }"}])
    with pytest.raises(DatasetError, match="e.jsonl: row 1: answer is empty"):
        load_rows(DataConfig(source="jsonl", path=str(f)))
    f = _jsonl(
        tmp_path / "n.jsonl",
        [{"problem": "p", "solution": "s", "answer": 12}, {"problem": "q", "solution": r"\boxed{3}", "answer": " "}],
    )
    assert [p.answer for p in load_rows(DataConfig(source="jsonl", path=str(f)))] == ["12", "3"]


def test_a_lone_surrogate_names_file_row_and_column(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text('{"problem": "p", "solution": "s", "answer": "1"}\n{"problem": "x\\ud800y", "solution": "s"}\n')
    with pytest.raises(
        DatasetError, match=r"s.jsonl: row 2: column 'problem' holds invalid Unicode \(a lone surrogate"
    ):
        load_rows(DataConfig(source="jsonl", path=str(f)))


def test_rows_are_counted_without_reading_them(tmp_path):
    import datasets

    rows = [{"problem": f"p{i}", "solution": "s", "answer": str(i)} for i in range(150)]
    f = _jsonl(tmp_path / "d.jsonl", [*rows[:70], "", "   ", *rows[70:]])
    assert count_rows(DataConfig(source="jsonl", path=str(f))) == 150
    pq.write_table(pa.table({k: [r[k] for r in rows] for k in rows[0]}), tmp_path / "d.parquet")
    assert count_rows(DataConfig(source="parquet", path=str(tmp_path / "d.parquet"))) == 150
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    assert count_rows(DataConfig(source="hf", path=str(tmp_path / "ds"))) == 150
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        count_rows(DataConfig(source="parquet", path=str(f)))


def test_holding_out_every_problem_names_data_eval_size_and_the_file(tmp_path):
    f = _jsonl(tmp_path / "two.jsonl", [{"problem": f"p{i}", "solution": "s", "answer": "1"} for i in range(2)])
    task = build_task(TaskConfig("math"))
    data = DataConfig(source="jsonl", path=str(f), eval_size=2)
    with pytest.raises(DatasetError, match=f"{f} has 2 problems and data.eval_size = 2 holds them all out"):
        train_and_held_out(task, data, 0)
    data.eval_size = 1
    assert [len(part) for part in train_and_held_out(task, data, 0)] == [1, 1]
    data.train_size = 2  # a dataset's count is known only once it is read: named then, with the file
    with pytest.raises(DatasetError, match=f"data.train_size = 2: {f} leaves 1 problems to train on"):
        train_and_held_out(task, data, 0)


@pytest.mark.timeout(30)  # opening a FIFO without a writer blocks: this would hang, not fail
@pytest.mark.parametrize("source", ["jsonl", "parquet", "hf"])
def test_a_fifo_or_a_device_is_refused_without_being_opened(tmp_path, source):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, r"a FIFO \(named pipe\)"), ("/dev/zero", "a character device")):
        cfg = DataConfig(source=source, path=str(path))
        with pytest.raises(DatasetError, match=rf"data.path {path}: is {kind}, not a regular file"):
            load_rows(cfg)
        if source != "hf":
            with pytest.raises(DatasetError, match=rf"is {kind}"):
                count_rows(cfg)


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_a_file_over_data_max_file_bytes_is_refused(tmp_path, source):
    rows = [{"problem": "1+1?", "solution": "2", "answer": "2"}] * 20
    path = tmp_path / f"rows.{source}"
    _jsonl(path, rows) if source == "jsonl" else pq.write_table(pa.Table.from_pylist(rows), path)
    size = path.stat().st_size
    with pytest.raises(DatasetError, match=rf"is {size:,} bytes, over the bound of 100; raise data.max_file_bytes"):
        load_rows(DataConfig(source=source, path=str(path), max_file_bytes=100))
    assert len(load_rows(DataConfig(source=source, path=str(path), max_file_bytes=size))) == 20


def test_a_row_over_data_max_row_bytes_names_file_and_row(tmp_path):
    """A row with a 10 MB answer made a generator grow to 4 GB without a word."""
    small = {"problem": "1+1?", "solution": "2", "answer": "2"}
    path = _jsonl(tmp_path / "rows.jsonl", [small, small, {**small, "answer": "9" * 200}])
    with pytest.raises(DatasetError, match=rf"{path}: row 3: 205 bytes of problem, solution and answer, over "):
        load_rows(DataConfig(source="jsonl", path=str(path), max_row_bytes=100))
    assert len(load_rows(DataConfig(source="jsonl", path=str(path), max_row_bytes=205))) == 3
