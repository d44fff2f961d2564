"""One finding of a check: what ``rredcot doctor`` prints, a line each, and the run's pre-start checks raise."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class Check:
    level: str  # ok | warning | error
    topic: str
    found: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.level:<8}{self.topic:<10}{self.found}" + (f" -> {self.fix}" if self.fix else "")
