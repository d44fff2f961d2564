"""The checks of one config value: ``require`` (a rule, raising ``ConfigError`` that names the key, its
value and what is allowed) and ``validate_fields`` (every ``choice``/``bounded`` field of a dataclass
tree: the run config's sections and an extension's settings)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rredcot.common.config_schema import ConfigError


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise ``ConfigError`` naming ``key``, its ``value`` and what is ``allowed`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key} = {value!r} is not allowed; expected {allowed}")


def validate_fields(node: Any, prefix: str) -> None:
    """Check every declared choice and range of the dataclass ``node`` (and of the dataclasses it
    holds), its keys named ``<prefix><field>``."""
    for f in dataclasses.fields(node):
        key = f"{prefix}{f.name}"
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            validate_fields(value, key + ".")
            continue
        choices = f.metadata.get("choices")
        if choices is not None:
            require(value in choices, key, value, "one of " + ", ".join(map(repr, choices)))
        bounds = f.metadata.get("range")
        if bounds is not None:
            lo, hi = bounds
            lo_open = f.metadata.get("lo_open", False)
            finite = isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
            ok = finite and (lo is None or (value > lo if lo_open else value >= lo)) and (hi is None or value <= hi)
            require(ok, key, value, _range_text(lo, hi, lo_open, "a number" if finite else "a finite number"))


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False, noun: str = "a number") -> str:
    if lo is not None and hi is not None:
        return f"{noun} in {'(' if lo_open else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{noun} {'>' if lo_open else '>='} {lo}"
    return f"{noun} <= {hi}"
