"""``rredcot doctor``: one line per check, errors named with their fix, exit code 1 on errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.common.precision import DtypeChoice
from rredcot.launch import doctor as doc
from rredcot.launch.doctor import Check, check_paths, check_services, doctor


def levels(checks: list[Check], topic: str) -> list[str]:
    return [c.level for c in checks if c.topic == topic]


def test_check_line_shows_the_fix() -> None:
    assert Check("error", "redis", "down", "start it").line() == "error   redis     down -> start it"
    assert Check("ok", "cpu", "fine").line() == "ok      cpu       fine"


def test_unreachable_services_are_errors() -> None:
    cfg = load_config("tests", ["redis.url=redis://127.0.0.1:1/0", "cluster.address=127.0.0.1:1"])
    checks = check_services(cfg)
    assert levels(checks, "redis") == ["error"] and levels(checks, "ray") == ["error"]
    assert "launch/ray_head.sh" in next(c.fix for c in checks if c.topic == "ray")


def test_live_redis_is_ok(redis_server) -> None:
    cfg = load_config("tests", [f"redis.url={redis_server.url}"])
    assert levels(check_services(cfg), "redis") == ["ok"]


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
    assert levels(checks, "data") == ["error"] and levels(checks, "disk") in (["ok"], ["warning"])
    (model / "config.json").write_text("{}")
    assert levels(check_paths(cfg), "model") == ["ok"]


def test_bf16_on_a_cpu_without_it_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doc, "cpu_native_bf16", lambda info: (False, "no bf16 here"))
    monkeypatch.setattr(doc, "resolve_dtype", lambda d: DtypeChoice("bfloat16" if d == "bfloat16" else "float32", "r"))
    checks = doc.check_cpu(load_config("tests", ["learner.dtype=bfloat16"]))
    warned = [c for c in checks if c.level == "warning"]
    assert len(warned) == 1 and warned[0].fix == "learner.dtype=auto"


def test_exit_code_follows_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config("tests")
    monkeypatch.setattr(doc, "CHECKS", [lambda c: [Check("ok", "a", "fine")]])
    assert doctor(cfg) == 0
    monkeypatch.setattr(doc, "CHECKS", [lambda c: [Check("ok", "a", "fine"), Check("error", "b", "bad", "fix")]])
    assert doctor(cfg) == 1
    assert "1 error(s), 0 warning(s)" in capsys.readouterr().out
