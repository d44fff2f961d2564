"""``credit.method=progress``: RREDCoT's segments credited by a prover's progress, on entropy weights.

Segment k's progress is p_k = v_prover(s_k) − v_prover(s_(k−1)), the change in a prover policy's
success probability across the segment, from M continuations per exit point (``mc_values``, the
``mc`` machinery) at RREDCoT's exit points. Per token j (segment k(j); p = 0 outside every segment):

    σ_j ∝ w_j · max(0, 1 + α · sgn(A) · p_k(j)),   Σ_j σ_j = 1,

w_j the ``entropy`` method's weights. The learner's per-token signal σ_j·A is then
w_j·(A + α·|A|·p_k(j)) up to the sample's normaliser: PAV's outcome-plus-progress advantage with the
progress in units of |A| (docs/credit.md). The prover is whatever ``ctx.sampler`` holds; launch and
the worker build it from the method's declared prover, ``settings.prover`` (``methods.py``).
"""

from __future__ import annotations

import time

import numpy as np

from rredcot.redistributor.credit import entropy_weights, scored_traces, uniform_sigma
from rredcot.redistributor.methods import ProgressSettings
from rredcot.redistributor.registry import CreditContext, SampleCredit
from rredcot.redistributor.sigma import segment_rewards
from rredcot.redistributor.value_credit import exit_points, mc_exit_values


def progress_sigma(
    weights: np.ndarray, exits: np.ndarray, progress: np.ndarray, advantage: float, alpha: float
) -> tuple[np.ndarray, str]:
    """(σ, fallback): σ_j ∝ w_j·max(0, 1 + α·sgn(A)·p_k(j)) over segments [e_k, e_(k+1)), factor 1
    outside them; the entropy σ (w/Σw) with fallback ``zero_mass`` when every weighted token's factor is 0."""
    factor = np.ones(len(weights))
    for k, p in enumerate(np.asarray(progress, dtype=np.float64)):
        factor[exits[k] : exits[k + 1]] = max(0.0, 1.0 + alpha * float(np.sign(advantage)) * p)
    z = weights * factor
    if z.sum() > 0:
        return (z / z.sum()).astype(np.float32), ""
    return (weights / weights.sum()).astype(np.float32), "zero_mass" if weights.size else ""


def progress(ctx: CreditContext) -> list[SampleCredit]:
    """Entropy → segments → the prover's MC values at the exits → progress → σ (``progress_sigma``)."""
    settings: ProgressSettings = ctx.settings
    out: list[SampleCredit] = [SampleCredit(uniform_sigma(0))] * len(ctx.group.samples)
    for i, s, trace, t_entropy in scored_traces(ctx, keep_cache=False):
        t1 = time.perf_counter()
        exits = exit_points(ctx, s, trace)
        t2 = time.perf_counter()
        # seeds apart from the ``mc`` method's: the study compares the two on one engine
        exits, est = mc_exit_values(ctx, s, exits, settings.samples, f"prover:{s.id}")
        t3 = time.perf_counter()
        rewards = segment_rewards(est.values)
        sigma, fallback = progress_sigma(
            entropy_weights(trace), exits, rewards, float(ctx.advantages[i]), settings.alpha
        )
        out[i] = SampleCredit(
            sigma,
            exits.astype(np.int32),
            est.values.astype(np.float32),
            rewards.astype(np.float32),
            {"entropy": t_entropy, "segment": t2 - t1, "values": t3 - t2, "sigma": time.perf_counter() - t3},
            fallback,
            est.stderr.astype(np.float32),
            ctx.sampler.version if settings.prover == "policy" and ctx.sampler else -1,
        )
    return out
