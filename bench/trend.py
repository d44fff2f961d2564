"""Shared by the memory benchmarks: an RSS peak sampler, a least-squares trend, a mode per child."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import numpy as np
import psutil

MIB = 2**20


class RssPeak:
    """The process's RSS peak since the last ``take()``, sampled every 20 ms by a thread."""

    def __init__(self) -> None:
        self.proc, self.peak = psutil.Process(), 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.02)

    def take(self) -> tuple[float, float]:
        """(peak since the last call, RSS now), in MiB."""
        now = self.proc.memory_info().rss
        peak, self.peak = max(self.peak, now), now
        return peak / MIB, now / MIB


def slope(ys: list[float]) -> float:
    """Least-squares slope per index."""
    return float(np.polyfit(np.arange(len(ys)), ys, 1)[0]) if len(ys) > 1 else float("nan")


def child_rows(cmd: list[str], env: dict[str, str] | None = None) -> list[dict[str, float]]:
    """Run one mode's child process (in ``env``; default: this one's); the JSON rows it printed, one per
    step or round."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def print_results(results: dict[str, dict[str, float]]) -> None:
    """A markdown table, one row per mode (seconds to 2 decimals, the rest to 1), then one JSON line."""
    cols = list(next(iter(results.values())))
    print("| mode | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for mode, r in results.items():
        print(
            f"| {mode} | " + " | ".join(f"{r[c]:.2f}" if c.startswith("s_per") else f"{r[c]:.1f}" for c in cols) + " |"
        )
    print(json.dumps(results))
