"""The command line: parsing, config errors as one line with exit 2, the doctor's exit code."""

from __future__ import annotations

import pytest

from rredcot.launch import cli
from rredcot.launch.cli import build_parser, main


def test_train_takes_overrides_and_verbose() -> None:
    args = build_parser().parse_args(["train", "demo_cpu", "learner.lr=1e-6", "--verbose"])
    assert (args.command, args.config, args.overrides, args.verbose) == ("train", "demo_cpu", ["learner.lr=1e-6"], True)
    assert build_parser().parse_args(["generate", "tests"]).command == "generate"


def test_doctor_defaults_to_the_demo_config() -> None:
    args = build_parser().parse_args(["doctor"])
    assert (args.config, args.overrides) == ("demo_cpu", [])


def test_config_errors_are_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "tests", "model.dtype=float16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.dtype" in err and "'auto'" in err and "'bfloat16'" in err
    assert main(["train", "no-such-config"]) == 2
    assert "bundled configs" in capsys.readouterr().err


def test_config_show_prints_the_resolved_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "demo_cpu", "run.steps=7"]) == 0
    out = capsys.readouterr().out
    assert "steps: 7" in out and "dtype: auto" in out


def test_doctor_exit_code_reaches_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    from rredcot.launch import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda cfg: [doctor.Check("error", "x", "broken", "fix it")])
    assert main(["doctor", "tests"]) == 1
    assert cli.STAGES["train"][0] == "rredcot.launch.driver"
