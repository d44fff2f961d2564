"""``shuffled``: a localisation control for RREDCoT. Its own segment masses (the same exit values,
group baseline and sign as ``rredcot``, from ``credit.settings.rredcot``), permuted across the
trace's segments before σ spreads them: the same sparsity and peak mass, placed without regard to
where the value changed. A permutation is fixed per sample (seeded by the sample's id)."""

from __future__ import annotations

import numpy as np

from rredcot.common.records import RolloutRecord
from rredcot.common.sampling import seed_of
from rredcot.redistributor.registry import CreditContext, SampleCredit
from rredcot.redistributor.value_credit import rredcot


def permuted(sample: RolloutRecord, masses: np.ndarray) -> np.ndarray:
    """``masses`` in an order drawn from the sample's id (stable across processes and runs)."""
    return np.random.default_rng(seed_of("shuffled", sample.id)).permutation(masses)


def shuffled(ctx: CreditContext) -> list[SampleCredit]:
    """RREDCoT's σ with each sample's segment masses ``permuted``."""
    return rredcot(ctx, permuted)
