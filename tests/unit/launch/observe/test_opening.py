"""The run's opening lines (rredcot/launch/observe/opening.py)."""

from __future__ import annotations

from pathlib import Path

from rredcot.common.config import load_config
from rredcot.launch import services
from rredcot.launch.observe.opening import first_line, opening_lines


def test_the_driver_never_shows_a_redis_password() -> None:
    cfg = load_config("tests", ["redis.url=redis://:s3cret@10.0.0.1:6379/0"])
    assert "Redis at redis://:***@10.0.0.1:6379/0" in first_line(cfg, Path("run"))
    assert services.embedded_redis_line("redis://127.0.0.1:7000/0", None) == "redis://127.0.0.1:7000/0"
    line = services.embedded_redis_line("redis://:gen%2Fpw@10.0.0.1:7000/0", None)
    assert line.startswith("redis://:***@10.0.0.1:7000/0 (password: random") and "gen" not in line[:30]
    assert "(password: redis.password)" in services.embedded_redis_line("redis://:pw@10.0.0.1:7000/0", "pw")


def test_the_demo_says_first_what_it_trains_and_why() -> None:
    about, line = opening_lines(load_config("demo_cpu"), Path("run"))
    assert about.startswith("The demo: SmolLM2-135M learns 3-step arithmetic chains") and "blame" in about
    assert line.startswith("run 'demo_cpu': starting")
    assert [line.split(":")[0] for line in opening_lines(load_config("tests"), Path("run"))] == ["run 'tests'"]
