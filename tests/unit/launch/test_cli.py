"""The command line: parsing, config errors as one line with exit 2, the doctor's exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rredcot.common.errors import UserError
from rredcot.launch import cli, driver
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
    from rredcot.launch.checks import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda cfg: [doctor.Check("error", "x", "broken", "fix it")])
    assert main(["doctor", "tests"]) == 1
    assert cli.STAGES["train"][0] == "rredcot.launch.driver"


ROW = '{"problem": "What is 2 * 3?", "solution": "2 * 3 = 6.", "answer": "6"}\n'


def _file(name: str, content: str | bytes) -> Callable[[Path], list[str]]:
    """Overrides for a math task reading ``content`` from ``name`` (jsonl unless it ends .parquet)."""

    def make(tmp: Path) -> list[str]:
        f = tmp / name
        f.write_bytes(content if isinstance(content, bytes) else content.encode())
        source = "parquet" if name.endswith(".parquet") else "jsonl"
        return ["task.name=math", f"data.source={source}", f"data.path={f}", "data.eval_size=1"]

    return make


def _dir_without_config(tmp: Path) -> list[str]:
    (tmp / "model").mkdir()
    return [f"model.path={tmp / 'model'}"]


# (case, overrides of rredcot/configs/tests.yaml or a function of tmp_path giving them, what the line must say)
BAD_TRAIN_INPUT: list[tuple[str, list[str] | Callable[[Path], list[str]], str]] = [
    ("unknown key", ["learner.lrr=1"], "learner.lrr"),
    ("wrong type", ["learner.lr=fast"], "'learner.lr'"),
    ("bad choice", ["credit.method=magic"], "credit.method = 'magic'"),
    ("out of range", ["generation.group_size=0"], "generation.group_size"),
    ("override without =", ["learner.lr"], "must look like key=value"),
    ("cross-field rule", ["generation.max_tokens=600"], "generation.max_tokens"),
    ("unknown task", ["task.name=nope"], "task.name = 'nope'"),
    ("run.name escapes", ["run.name=../.."], "run.name = '../..'"),
    ("malformed redis.url", ["redis.url=redis://"], "redis.url"),
    ("empty exit string", ["credit.scorer.exit_string=''"], "credit.scorer.exit_string"),
    ("more workers than cores", ["cluster.generators=50"], "lower cluster.generators"),
    ("data file missing", lambda t: [*_file("d.jsonl", ROW)(t)[:2], f"data.path={t / 'nope.jsonl'}"], "no such file"),
    ("data path is a directory", lambda t: [*_file("d.jsonl", ROW)(t)[:2], f"data.path={t}"], "is a directory"),
    ("empty data file", _file("d.jsonl", ""), "d.jsonl: no rows"),
    ("wrong columns", _file("d.jsonl", '{"question": "q", "solution": "s"}\n'), "row 1: column 'problem'"),
    ("invalid JSON", _file("d.jsonl", ROW + "{oops\n"), "row 2: invalid JSON"),
    ("non-UTF-8", _file("d.jsonl", ROW.encode() + b'{"problem": "caf\xe9"}\n'), "row 2: not UTF-8"),
    ("no answer", _file("d.jsonl", '{"problem": "p", "solution": "no box"}\n'), "row 1: no 'answer' column"),
    ("row not an object", _file("d.jsonl", ROW + "[1, 2]\n"), "row 2: expected an object"),
    ("not parquet", _file("d.parquet", ROW), "not a readable parquet file"),
    ("eval set takes every row", lambda t: [*_file("d.jsonl", ROW)(t), "data.eval_size=1"], "data.eval_size = 1"),
    ("model path missing", ["model.path=/nope/model"], "model.path /nope/model: no such directory"),
    ("model dir without config.json", _dir_without_config, "has no config.json"),
    ("Redis unreachable", ["redis.url=redis://127.0.0.1:1/0"], "redis.url does not answer"),
    ("Ray address unreachable", ["cluster.address=127.0.0.1:1"], "127.0.0.1:1 unreachable"),
]


@pytest.mark.parametrize(("case", "overrides", "says"), BAD_TRAIN_INPUT, ids=[c[0] for c in BAD_TRAIN_INPUT])
def test_bad_input_is_one_line_before_anything_starts(
    case: str,
    overrides: list[str] | Callable[[Path], list[str]],
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each case: exit 2, one line on stderr naming the key/file/row, no traceback, and no run
    directory, Ray or Redis started (the checks run before any service)."""
    monkeypatch.setattr(driver, "lead_own_process_group", lambda cfg: None)  # keep pytest's process group
    given = overrides(tmp_path) if callable(overrides) else overrides
    assert main(["train", "tests", f"run.dir={tmp_path / 'run'}", *given]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: ") and "\n" not in err and "Traceback" not in err, err
    assert says in err, err
    assert not (tmp_path / "run").exists()


def test_a_wrong_redis_password_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rredcot.launch.services import EmbeddedRedis

    with EmbeddedRedis(tmp_path / "redis", password="right") as server:
        url = server.url.replace("right", "wrong")
        assert main(["config", "show", "tests", f"redis.url={url}", "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert "redis.url does not answer" in err and "wrong" not in err and "\n" not in err, err


def test_ray_address_in_the_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert main(["config", "show", "tests", "--check"]) == 2
    assert "set cluster.address=10.0.0.1:6379" in capsys.readouterr().err


def test_yaml_that_does_not_parse_names_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (bad := tmp_path / "bad.yaml").write_text("run:\n  name: x\n  steps: [1,\nmodel: {\n")
    assert main(["config", "show", str(bad)]) == 2
    assert f"config file {bad}, line " in capsys.readouterr().err
    (listed := tmp_path / "list.yaml").write_text("- run\n")
    assert main(["config", "show", str(listed)]) == 2
    assert "expected a mapping" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["inspect", "r.msgpack"], ["doctor", "tests"], ["bench", "queue", "--records", "1"]]
)
def test_other_errors_are_one_line_unless_debug(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure that is no user error: its type and first line, exit 1, and the hint to rerun with
    ``--debug``, which every command takes, also at its end; then it raises with its traceback."""
    from rredcot.launch.checks import doctor
    from rredcot.redistributor import heatmap

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(heatmap, "load_group", boom)
    monkeypatch.setattr(doctor, "doctor", boom)
    monkeypatch.setattr(cli.runpy, "run_path", boom)
    monkeypatch.setattr(sys, "argv", sys.argv)  # _run_bench sets the script's
    assert main(command) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: failed: RuntimeError: disk on fire") and "--debug" in err and "\n" not in err
    with pytest.raises(RuntimeError, match="disk on fire"):
        main([*command, "--debug"])
    with pytest.raises(RuntimeError, match="disk on fire"):
        main(["--debug", *command])


def test_a_failed_worker_is_one_line_naming_it_and_a_user_error_in_it_exits_2() -> None:
    from rredcot.actors.prompt_fit import NoPromptFits
    from rredcot.launch.observe.logs import WorkerFailed

    crashed = WorkerFailed("gen0", RuntimeError("engine gone\ntraceback ..."), Path("/r/logs/gen0.log"))
    assert cli.one_line(crashed) == "failed: gen0: RuntimeError: engine gone; its log: /r/logs/gen0.log"
    too_long = WorkerFailed("gen0", NoPromptFits("no training prompt fits"), Path("/r/logs/gen0.log"))
    assert cli.one_line(too_long) == "error: gen0: no training prompt fits; its log: /r/logs/gen0.log"
    assert isinstance(cli.shown_error(too_long), UserError)  # exit 2, a mistake in the input


def _parse(argv: list[str]) -> tuple[object, ...]:
    args = cli.parse_args(argv)
    return args.config, args.overrides


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "tests", "--verbose", "run.steps=1"],
        ["config", "show", "tests", "--check", "run.steps=1"],
        ["study", "credit", "tests", "--problems", "4", "run.steps=1"],
        ["study", "compare", "tests", "--seeds", "2", "run.steps=1"],
        ["generate", "tests", "--index", "2", "run.steps=1"],
        ["redistribute", "tests", "--debug", "run.steps=1"],
        ["learn", "--debug", "tests", "run.steps=1"],
        ["doctor", "tests", "--debug", "run.steps=1"],
    ],
)
def test_overrides_may_follow_flags(argv: list[str]) -> None:
    assert _parse(argv) == ("tests", ["run.steps=1"])
    assert _parse([*argv, "learner.lr=1e-6"])[1] == ["run.steps=1", "learner.lr=1e-6"]
    at = argv.index("tests") + 1  # one before the flags too: the order stays the command line's
    assert _parse([*argv[:at], "learner.lr=1e-6", *argv[at:]])[1] == ["learner.lr=1e-6", "run.steps=1"]


def test_unknown_flags_and_stray_arguments_are_still_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["train", "tests", "--bogus", "run.steps=1"], ["inspect", "a.msgpack", "b"], ["config", "list", "x"]):
        with pytest.raises(SystemExit) as exit:
            cli.parse_args(argv)
        assert exit.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["train"], ["config", "show"], ["study", "credit"]])
def test_only_the_config_is_required(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(argv)
    err = capsys.readouterr().err
    assert err.strip().endswith("the following arguments are required: config"), err


def test_config_show_hides_the_redis_password(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["config", "show", "tests", "redis.password=hunter2", "redis.url=redis://u:s3cret@10.0.0.1:6379/0"]) == 0
    )
    out = capsys.readouterr().out
    assert "hunter2" not in out and "s3cret" not in out
    assert "url: redis://u:***@10.0.0.1:6379/0" in out and "password: '***'" in out


def test_a_stage_run_by_hand_takes_its_index(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--index N``: worker gen<N> / red<N> of rank N, so that it never takes the driver's worker's name."""
    from rredcot.actors import generator
    from rredcot.learner import trainer
    from rredcot.redistributor import worker

    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(
        generator, "Generator", lambda cfg, name, rank: calls.append((name, rank)) or pytest.fail("stop")
    )
    monkeypatch.setattr(worker, "Redistributor", lambda cfg, name, rank, credit: calls.append((name, rank)) or 1 / 0)
    with pytest.raises(pytest.fail.Exception):
        main(["--debug", "generate", "tests", "--index", "3"])
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "redistribute", "tests", "--index", "2"])
    monkeypatch.setattr(trainer, "Trainer", lambda cfg, name, rank: calls.append((name, rank)) or 1 / 0)
    monkeypatch.setenv("RANK", "1")  # a learner rank launched by hand: its rank from the environment
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "learn", "tests"])
    assert calls == [("gen3", 3), ("red2", 2), ("learner1", 1)]
    assert main(["generate", "tests", "--index", "-1"]) == 2
    assert "--index must be >= 0 (got -1)" in capsys.readouterr().err
    # the collective weight group is sized at the start for cluster.generators: no room for more
    assert main(["generate", "tests", "--index", "1", "generation.weight_transport=collective"]) == 2
    room = "--index 1: the collective transport's weight group, sized when the run started, has room for --index 0..0"
    assert room in capsys.readouterr().err


def test_bench_lists_runnable_benchmarks_only(capsys: pytest.CaptureFixture[str]) -> None:
    found = cli.benchmarks()
    assert {"queue", "pipeline", "soak", "weight_transports", "lm_head"} <= set(found)
    assert not {"stream_queue", "trend"} & set(found)  # helper modules, no entry point
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rredcot: error: no benchmark 'nope' (found: {', '.join(found)})"
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    bench_help = " ".join(capsys.readouterr().out.split())
    assert " | ".join(found) in bench_help and "stream_queue" not in bench_help


INSPECT_MISTAKES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("missing file", lambda t: [str(t / "nope.msgpack")], "nope.msgpack: no such file or directory"),
    ("not a record", lambda t: [str(_write(t / "r.msgpack", b"\xc1junk"))], "r.msgpack is not a saved record"),
    ("a directory", lambda t: [str(t)], "is a directory, not a file"),
    ("--out folder missing", lambda t: [str(t / "r.msgpack"), "--out", str(t / "no" / "h")], "no folder"),
    ("Redis without --run", lambda t: ["redis://127.0.0.1:1/0"], "reading from Redis needs --run"),
]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("case", "argv", "says"), INSPECT_MISTAKES, ids=[c[0] for c in INSPECT_MISTAKES])
def test_inspect_mistakes_are_user_errors(
    case: str, argv: Callable[[Path], list[str]], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", *argv(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: error: ") and says in err and "\n" not in err and "--debug" not in err, err


@pytest.mark.parametrize("stage", ["generate", "learn"])
def test_a_stage_alone_says_at_once_that_its_redis_does_not_answer(
    stage: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 62: ``rredcot generate/redistribute/learn`` retried an unreachable redis.url for 27-34 s
    in silence. Now the first line comes at once (naming redis.url, its password hidden, and until
    when it keeps trying), and the last one gives up with the fix (the wait shortened here)."""
    monkeypatch.setattr(cli, "REDIS_WAIT_S", 1.5)
    start = time.monotonic()
    assert main([stage, "tests", "redis.url=redis://:secret@127.0.0.1:1/0"]) == 2
    assert time.monotonic() - start < 6
    first, last = capsys.readouterr().err.strip().splitlines()
    assert first.startswith("rredcot: Redis at redis://:***@127.0.0.1:1/0 (redis.url) does not answer (ConnectionError")
    assert first.endswith("trying until 1.5 s, then stopping")
    assert last.startswith("rredcot: cannot start: redis.url redis://:***@127.0.0.1:1/0 does not answer after 1.5 s")
    assert last.endswith("-> start the server, or fix host, port and password in redis.url")
    assert "secret" not in first + last


def test_waiting_for_redis_says_so_within_a_second_and_gives_up_at_its_time() -> None:
    from rredcot.common.streams import RedisUnreachable, wait_for_redis

    said: list[tuple[float, str]] = []
    start = time.monotonic()
    with pytest.raises(RedisUnreachable, match=r"does not answer after 2 s \(ConnectionError"):
        wait_for_redis("redis://127.0.0.1:1/0", 2.0, lambda line: said.append((time.monotonic() - start, line)))
    assert 2.0 <= time.monotonic() - start < 4.5
    ((when, line),) = said  # one line, however many probes
    assert when < 1.0 and "trying until 2 s" in line


def test_inspect_of_a_redis_that_does_not_answer_fails_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    """It retried for half a minute before its one line; now one probe."""
    start = time.monotonic()
    assert main(["inspect", "redis://:secret@127.0.0.1:1/0", "--run", "x"]) == 2
    assert time.monotonic() - start < 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("rredcot: error: the source redis://:***@127.0.0.1:1/0 does not answer (ConnectionError")
    assert "\n" not in err and "secret" not in err and "-> start the server" in err


def test_doctor_takes_an_override_without_a_config_and_debug_on_command_groups() -> None:
    """``doctor run.steps=1`` checks the default config with the override (the optional config must
    not swallow it); ``--debug`` is accepted right after ``config`` and ``study`` too."""
    args = cli.parse_args(["doctor", "run.steps=1", "--debug"])
    assert (args.config, args.overrides, args.debug) == ("demo_cpu", ["run.steps=1"], True)
    assert cli.parse_args(["config", "--debug", "show", "tests"]).debug
    assert cli.parse_args(["study", "--debug", "credit", "tests"]).debug


BENCH_MISTAKES = [
    (["lm_head", "--tokens", "0"], "lm_head.py: error: argument --tokens: must be an integer in [1, 10000000] (got 0)"),
    (["pipeline", "--repeat", "0"], "pipeline.py: error: argument --repeat: must be an integer in [1, 10000] (got 0)"),
    (
        ["soak", "--minutes", "nan"],
        "soak.py: error: argument --minutes: must be a finite number in (0, 100000] (got nan)",
    ),
    (["learner", "--min-len", "100", "--max-len", "10"], "learner.py: error: --min-len 100 is more than --max-len 10"),
    (
        ["redistribution", "--segments=-1"],
        "redistribution.py: error: argument --segments: must be an integer in [1, 1000000] (got -1)",
    ),
    (
        ["weight_transports", "--layers", "many"],
        "weight_transports.py: error: argument --layers: must be an integer in [1, 10000] (got 'many')",
    ),
    (
        ["startup_gc", "--repeats", "0"],
        "startup_gc.py: error: argument --repeats: must be an integer in [1, 50] (got 0)",
    ),
]


def bench_refusal(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The last line ``rredcot bench ARGV`` writes when argparse refuses it (exit 2), run in this process:
    a subprocess per case spent 4-12 s importing what the benchmark would have run (the scripts' imports
    come before their parsing), and one subprocess case below checks the real process's exit."""
    monkeypatch.setattr(sys, "argv", sys.argv)  # _run_bench sets the script's
    monkeypatch.setattr(sys, "path", list(sys.path))  # and scripts put bench/ or the repository first
    with pytest.raises(SystemExit) as stop:
        main(["bench", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err[-2000:]
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "says"), BENCH_MISTAKES, ids=[" ".join(a) for a, _ in BENCH_MISTAKES])
def test_a_bench_number_out_of_its_range_is_argparses_one_line(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 62: the benchmarks took any number (``--tokens 0``, ``--minutes nan``) and failed late, in
    a traceback, or ran forever; now argparse's usage error, exit 2, before the benchmark runs."""
    assert bench_refusal(argv, capsys, monkeypatch) == says


def test_a_refused_bench_exits_2_from_its_own_process() -> None:
    """The command line's process, not only ``main``: exit 2 and argparse's line, no traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "rredcot.launch.cli", "bench", *BENCH_MISTAKES[2][0]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == BENCH_MISTAKES[2][1], out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_bench_queue_refuses_zero_records_with_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rredcot bench queue --records 0`` ended in a ZeroDivisionError after the benchmark ran."""
    assert "--records must be >= 1 (got 0)" in bench_refusal(["queue", "--records", "0"], capsys, monkeypatch)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--problems", "0"], "argument --problems: must be an integer in [1, 1000000] (got 0)"),
        (["--problems", "-1"], "argument --problems: must be an integer in [1, 1000000] (got -1)"),
        (["--sampled", "-1"], "argument --sampled: must be an integer in [0, 1000000] (got -1)"),
        (["--problems", "50", "--sampled", "0"], "--problems 50 is more than the 10 training problems of config tests"),
    ],
)
def test_bench_credit_quality_refuses_a_count_out_of_range_in_one_line(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--problems 0`` ended in an IndexError after the scorer loaded; ``--problems -1`` meant "all
    but one", silently."""
    argv = ["credit_quality", "--config", "tests", *args]
    assert bench_refusal(argv, capsys, monkeypatch) == f"credit_quality.py: error: {said}"


def test_study_credit_with_a_checkpoint_that_does_not_exist_names_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to show Hugging Face's "Repo id must be in the form ..." once the engine loaded."""
    import rredcot.launch.study.command as command

    started: list[str] = []
    monkeypatch.setattr(command, "credit_study", lambda cfg, name, checkpoint, *a: started.append(checkpoint))
    assert main(["study", "credit", "tests", "--checkpoint", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    nope = tmp_path / "nope"
    assert started == [] and err == (
        f"rredcot: error: --checkpoint {nope}: no such directory -> point --checkpoint at a model directory"
    )
    assert main(["study", "credit", "tests", f"model.path={tmp_path / 'nope'}"]) == 2
    assert f"model.path {tmp_path / 'nope'}: no such directory" in capsys.readouterr().err and started == []


def test_a_compare_arm_with_a_bad_value_stops_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    arms = "grpo,rredcot@credit.settings.rredcot.uniform_mix=2"
    assert main(["study", "compare", "tests", "--methods", arms, "--out", str(out)]) == 2
    assert "credit.settings.rredcot.uniform_mix" in capsys.readouterr().err and not out.exists()  # no run started


def test_eval_power_reads_the_runs_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench eval_power``: two runs' first and last evaluations (2 problems, 2 samples: changes 0.5
    and 0, all of it noise; then 0 and 0.5) pooled; a run without two evaluations is named, exit 2."""
    monkeypatch.setattr(sys, "argv", sys.argv)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name, before, after in (("a", [0.0, 1.0], [0.5, 1.0]), ("b", [1.0, 0.0], [1.0, 0.5])):
        evaluations = [{"samples_per_problem": 2, "sampled_per_problem": p} for p in (before, after)]
        (tmp_path / name / "report").mkdir(parents=True)
        (tmp_path / name / "report" / "summary.json").write_text(json.dumps({"evaluations": evaluations}))
    main(["bench", "eval_power", str(tmp_path / "a"), str(tmp_path / "b"), "--splits", "2x2"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["pooled"] == pytest.approx(
        {"change": 0.25, "total": 0.125, "noise": 0.125, "samples": 2, "problems": 0}
    )
    assert result["splits"][0]["half_width"] == pytest.approx(1.96 * 0.25)
    (tmp_path / "a" / "report" / "summary.json").write_text(json.dumps({"evaluations": []}))
    with pytest.raises(SystemExit, match="needs two held-out evaluations"):
        main(["bench", "eval_power", str(tmp_path / "a")])


def test_eval_draws_names_a_run_without_its_final_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench eval_draws`` needs a finished run: one without ``report/final_model`` is named, exit 2."""
    monkeypatch.setattr(sys, "argv", sys.argv)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "config.yaml").write_text("run:\n  name: unfinished\ntask:\n  name: arith\n")
    with pytest.raises(SystemExit, match=r"final_model: no final model \(is .* a finished run\?\)"):
        main(["bench", "eval_draws", str(tmp_path)])
