"""Shared by the memory benchmarks: an RSS peak sampler and a least-squares trend."""

from __future__ import annotations

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
