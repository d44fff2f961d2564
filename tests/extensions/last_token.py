"""A credit method from outside rredcot (``credit.method: tests.extensions.last_token``).

All of σ on the last ``settings.tail`` tokens of each completion: a crude outcome-only baseline. Its
settings are ``credit.settings.last_token`` (or ``credit.settings.tests.extensions.last_token`` in
YAML); its ``check`` runs while the config is loaded; it samples no continuations (no ``prover``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rredcot.common.config import COUNT_MAX, Config, bounded, require
from rredcot.redistributor.registry import CreditContext, SampleCredit, register


@dataclass
class LastTokenSettings:
    tail: int = bounded(1, 1, COUNT_MAX)  # tokens sharing σ at the end of each completion


def check(cfg: Config, settings: LastTokenSettings) -> None:
    """The tail fits in a completion's budget."""
    require(
        settings.tail <= cfg.generation.max_tokens,
        "credit.settings.last_token.tail",
        settings.tail,
        f"<= generation.max_tokens ({cfg.generation.max_tokens})",
    )


@register("last_token", return_equivalent=True, settings=LastTokenSettings, check=check)
def last_token(ctx: CreditContext) -> list[SampleCredit]:
    out = []
    for s in ctx.group.samples:
        n = len(s.completion_ids)
        k = min(ctx.settings.tail, n)
        sigma = np.zeros(n, np.float32)
        sigma[n - k :] = 1.0 / k
        out.append(SampleCredit(sigma))
    return out
