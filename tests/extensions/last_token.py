"""A credit method from outside rredcot (``credit.method: tests.extensions.last_token``).

All of σ on the last ``settings.tail`` tokens of each completion: a crude outcome-only baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rredcot.redistributor.registry import CreditContext, SampleCredit, register


@dataclass
class LastTokenSettings:
    tail: int = 1  # tokens sharing σ at the end of each completion


@register("last_token", return_equivalent=True, settings=LastTokenSettings)
def last_token(ctx: CreditContext) -> list[SampleCredit]:
    out = []
    for s in ctx.group.samples:
        n = len(s.completion_ids)
        k = min(ctx.settings.tail, n)
        sigma = np.zeros(n, np.float32)
        sigma[n - k :] = 1.0 / k
        out.append(SampleCredit(sigma))
    return out
