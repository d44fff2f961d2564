"""How long a config took the last time it finished on this machine (for the first line's estimate).

Kept in ``<cache>/run_times.json``, keyed by the config (run name, run dir and Redis URL aside) and
the CPU model, so that an estimate is only ever one this kind of machine measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from rredcot.common.config import Config, to_yaml
from rredcot.common.precision import cpu_info
from rredcot.models.store import cache_dir


def _key(cfg: Config) -> str:
    neutral = dataclasses.replace(
        cfg,
        run=dataclasses.replace(cfg.run, name="", dir=""),
        redis=dataclasses.replace(cfg.redis, url=None, password=None),
    )
    return hashlib.sha256((to_yaml(neutral) + cpu_info().model).encode()).hexdigest()[:16]


def _path() -> Path:
    return cache_dir() / "run_times.json"


def expected_seconds(cfg: Config) -> float | None:
    try:
        return float(json.loads(_path().read_text())[_key(cfg)])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_seconds(cfg: Config, seconds: float) -> None:
    path = _path()
    try:
        times = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        times = {}
    times[_key(cfg)] = round(seconds, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(times, indent=1))
