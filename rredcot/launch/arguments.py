"""Command-line numbers with their bounds: argparse types that refuse what is out of range or not
finite with argparse's one line (``error: argument --problems: must be an integer in [1, 10000000]
(got 0)``, exit 2), for ``rredcot advise`` and the benchmarks."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _shown(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() and abs(x) < 1e7 else f"{x:g}"


def bounded_int(lo: int, hi: int) -> Callable[[str], int]:
    """An integer in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}] (got {text!r})") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}] (got {text})")
        return value

    parse.__name__ = "int"
    return parse


def bounded_float(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """A finite number in ``[lo, hi]``, or ``(lo, hi]`` when ``lo_open``."""
    allowed = f"{'(' if lo_open else '['}{_shown(lo)}, {_shown(hi)}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a finite number in {allowed} (got {text!r})") from None
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or value > hi:
            raise argparse.ArgumentTypeError(f"must be a finite number in {allowed} (got {text})")
        return value

    parse.__name__ = "float"
    return parse
