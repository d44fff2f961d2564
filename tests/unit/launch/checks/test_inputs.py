"""The doctor's checks of what a run reads: model, tokenizer and prover paths, the model's context,
disk room, and a dataset's first rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.checks import Check
from rredcot.launch.checks.inputs import check_data, check_paths


def levels(checks: list[Check], topic: str) -> list[str]:
    return [c.level for c in checks if c.topic == topic]


def test_paths(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    cfg = load_config(
        "tests",
        [
            f"model.path={model}",
            "task.name=math",
            "data.source=jsonl",
            f"data.path={tmp_path / 'no.jsonl'}",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    checks = check_paths(cfg)
    assert levels(checks, "model") == ["error"]  # a directory without config.json
    assert levels(checks, "disk") in (["ok"], ["warning"])
    (model / "config.json").write_text("{}")
    assert levels(check_paths(cfg), "model") == ["ok"]


@pytest.mark.parametrize(
    ("path", "level"),
    [
        ("/nope/model", "error"),
        ("./model", "error"),
        ("a/b/c", "error"),
        ("Qwen/Qwen3-4B", "warning"),
        ("gpt2", "warning"),
    ],
)
def test_a_model_path_is_a_directory_or_a_hub_id(path: str, level: str) -> None:
    assert levels(check_paths(load_config("tests", [f"model.path={path}"])), "model") == [level]


def _math(tmp_path: Path, rows: str, *overrides: str) -> list[Check]:
    data = tmp_path / "data.jsonl"
    data.write_text(rows)
    return check_data(load_config("tests", ["task.name=math", "data.source=jsonl", f"data.path={data}", *overrides]))


def test_the_first_rows_of_a_dataset_are_read_before_a_run_starts(tmp_path: Path) -> None:
    good = "".join(f'{{"problem": "p{i}", "solution": "s", "answer": "{i}"}}\n' for i in range(8))
    assert [c.level for c in _math(tmp_path, good)] == ["ok"]
    bad = good + '{"question": "q", "solution": "s"}\n'
    (check,) = _math(tmp_path, bad)
    assert check.level == "error" and "row 9" in check.found and "'problem'" in check.found
    (check,) = _math(tmp_path, good, "data.eval_size=8")
    assert check.level == "error" and "data.eval_size = 8" in check.found


def test_a_generated_task_needs_no_file() -> None:
    assert [c.level for c in check_data(load_config("tests"))] == ["ok"]


def test_holding_out_every_row_of_a_long_dataset_is_an_error(tmp_path: Path) -> None:
    """Rows are counted whole (not only the first 100 read): jsonl lines, parquet metadata."""
    rows = "".join(f'{{"problem": "p{i}", "solution": "s", "answer": "{i}"}}\n' for i in range(150))
    (check,) = _math(tmp_path, rows, "data.eval_size=150")
    assert check.level == "error" and f"{tmp_path / 'data.jsonl'} has 150 rows and data.eval_size = 150" in check.found
    assert check.fix.startswith("set data.eval_size below 150")
    assert [c.level for c in _math(tmp_path, rows, "data.eval_size=149")] == ["ok"]


def test_a_training_pool_or_training_evaluation_larger_than_the_dataset_is_an_error(tmp_path: Path) -> None:
    """150 rows, 50 held out: 100 to train on; ``data.train_size`` and ``logging.eval_train`` within them."""
    rows = "".join(f'{{"problem": "p{i}", "solution": "s", "answer": "{i}"}}\n' for i in range(150))
    (check,) = _math(tmp_path, rows, "data.eval_size=50", "data.train_size=101")
    assert check.level == "error" and check.found.endswith("has 150 rows, 100 to train on after data.eval_size = 50")
    assert check.found.startswith("data.train_size = 101: ") and check.fix == "set data.train_size to at most 100"
    (check,) = _math(tmp_path, rows, "data.eval_size=50", "data.train_size=10", "logging.eval_train=11")
    assert check.level == "error" and check.found.endswith("of which data.train_size keeps 10")
    assert check.fix == "set logging.eval_train to at most 10"
    assert [
        c.level for c in _math(tmp_path, rows, "data.eval_size=50", "data.train_size=10", "logging.eval_train=10")
    ] == ["ok"]


def test_max_model_len_beyond_the_models_context_is_an_error(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 256}')
    (error,) = [c for c in check_paths(load_config("tests", [f"model.path={model}"])) if c.level == "error"]
    assert error.found.startswith("model.max_model_len = 512 is not allowed; expected <= 256, the context of")
    assert levels(check_paths(load_config("tests", [f"model.path={model}", "model.max_model_len=256"])), "model") == [
        "ok"
    ]
    (model / "config.json").write_text(
        '{"max_position_embeddings": 256, "rope_scaling": {"type": "linear", "factor": 4}}'
    )
    assert levels(check_paths(load_config("tests", [f"model.path={model}"])), "model") == ["ok"]
    big = ["model.max_model_len=8192", "learner.micro_token_budget=8192"]
    assert levels(check_paths(load_config("tests", big)), "model") == ["ok", "error"]  # tiny-qwen3: 4096
    assert levels(check_paths(load_config("tests", [*big, "model.path=org/model"])), "model") == ["warning"]


def test_a_tokenizer_or_prover_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    def found(*overrides: str) -> list[tuple[str, str]]:
        checks = check_paths(load_config("tests", list(overrides)))
        return [(c.topic, c.level) for c in checks if c.topic in ("tokenizer", "prover")]

    tok = tmp_path / "tok"
    tok.mkdir()
    assert found(f"model.tokenizer={tok}") == [("tokenizer", "error")]  # no tokenizer files
    (tok / "tokenizer.json").write_text("{}")
    assert found(f"model.tokenizer={tok}") == [("tokenizer", "ok")]
    assert found(f"model.tokenizer={tmp_path / 'nope'}") == [("tokenizer", "error")]
    assert found("model.tokenizer=org/tok") == [("tokenizer", "warning")]
    progress = ["credit.method=progress"]
    (check,) = [
        c
        for c in check_paths(load_config("tests", [*progress, "credit.settings.progress.prover=polcy"]))
        if c.topic == "prover"
    ]
    assert check.level == "error" and "credit.settings.progress.prover polcy: no such directory" in check.found
    assert "'initial' or 'policy'" in check.fix
    assert found(*progress) == [] and found(*progress, "credit.settings.progress.prover=policy") == []
    assert found(*progress, "credit.settings.progress.prover=tiny-qwen3") == [("prover", "ok")]
    assert found(*progress, "credit.settings.progress.prover=org/prover") == [("prover", "warning")]
    (tmp_path / "prover").mkdir()
    (tmp_path / "prover" / "config.json").write_text("{}")
    assert found(*progress, f"credit.settings.progress.prover={tmp_path / 'prover'}") == [("prover", "ok")]
