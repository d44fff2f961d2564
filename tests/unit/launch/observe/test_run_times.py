"""The first line's estimate: the last finished run of the same config on this kind of CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.observe.run_times import expected_seconds, record_seconds


def test_round_trip_ignores_name_dir_and_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RREDCOT_CACHE", str(tmp_path))
    cfg = load_config("tests")
    assert expected_seconds(cfg) is None
    record_seconds(cfg, 123.45)
    same = load_config("tests", ["run.name=other", "run.dir=/tmp/elsewhere", "redis.url=redis://127.0.0.1:5/0"])
    assert expected_seconds(same) == pytest.approx(123.4, abs=0.1)
    assert expected_seconds(load_config("tests", ["run.steps=9"])) is None  # another config: no estimate
    (tmp_path / "run_times.json").write_text("not json")
    assert expected_seconds(cfg) is None
    record_seconds(cfg, 10)  # a corrupt file is replaced, not fatal
    assert expected_seconds(cfg) == 10
