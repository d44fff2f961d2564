"""Segment rewards, segment masses and the per-token weights σ (Σσ = 1 for every sample).

r_k = v(s_k) − v(s_{k−1}); m_k from the sign policy and the sign of the advantage A.
Tokens outside every segment (a thinking tag, the answer part with ``answer_part=uniform``) keep
their uniform weight 1/|o|; the S tokens inside the segments share the rest, S/|o|:
σ_j = λ/|o| + (1 − λ) · (S/|o|) · m_{k(j)} / (|seg_k| · Σ m) for tokens in segment k.
σ is uniform when Σ m = 0 (A = 0, every reward 0, or no segment).
"""

from __future__ import annotations

import numpy as np

SIGN_POLICIES = ("relu", "abs", "softmax")


def segment_rewards(values: np.ndarray) -> np.ndarray:
    """r_k = v_k − v_{k−1}; non-finite differences (e.g. −inf − −inf) count as 0."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        r = np.diff(v)
    return np.where(np.isfinite(r), r, 0.0)


def prob_rewards(log_values: np.ndarray) -> np.ndarray:
    """Prob-space segment rewards from log values, scaled by e^{−max log v̂}: the relu and abs masses
    (and so σ) are those of v̂_k − v̂_{k−1}, which underflow to 0 below −745 nats."""
    lv = np.asarray(log_values, dtype=np.float64)
    finite = lv[np.isfinite(lv)]
    top = finite.max() if finite.size else 0.0
    return segment_rewards(np.exp(lv - top))


def uniform_reason(n_segments: int, values: np.ndarray, rewards: np.ndarray, masses: np.ndarray) -> str:
    """Why a sample's σ fell back to uniform over its span ('' when it did not): ``no_segment``,
    ``one_segment`` (one segment takes the span's whole share, whatever its value), ``no_reference``
    (no values), ``underflow`` (no finite non-zero value), ``zero_mass`` (all rewards 0, or none of
    the sign the advantage credits)."""
    if n_segments == 0:
        return "no_segment"
    if n_segments == 1:
        return "one_segment"
    if values.size == 0:
        return "no_reference"
    if not rewards.any() and not (np.isfinite(values) & (values != 0)).any():
        return "underflow"
    if not rewards.any() or not masses.sum() > 0:
        return "zero_mass"
    return ""


def segment_masses(rewards: np.ndarray, advantage: float, sign: str, temperature: float = 1.0) -> np.ndarray:
    """m_k ≥ 0: ``relu`` max(sgn(A)·r_k, 0); ``abs`` |r_k|; ``softmax`` softmax(sgn(A)·r / T).

    A = 0 or all-zero rewards (no reference pair, prob values that underflowed) give all-zero masses,
    hence uniform σ, for every policy: softmax would give each segment 1/K, σ ∝ 1/|seg_k|.
    """
    if sign not in SIGN_POLICIES:
        raise ValueError(f"sign policy {sign!r} not in {SIGN_POLICIES}")
    r = np.asarray(rewards, dtype=np.float64)
    s = float(np.sign(advantage))
    if s == 0 or not r.any():
        return np.zeros_like(r)
    if sign == "relu":
        return np.maximum(s * r, 0.0)
    if sign == "abs":
        return np.abs(r)
    z = s * r / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def token_sigma(n_tokens: int, exit_points: np.ndarray, masses: np.ndarray, uniform_mix: float) -> np.ndarray:
    """σ over ``n_tokens`` completion tokens; segment k is [exit_points[k], exit_points[k+1]).

    Tokens outside every segment keep 1/|o|; the segments redistribute their own share.
    """
    if n_tokens == 0:
        return np.zeros(0, dtype=np.float32)
    m = np.asarray(masses, dtype=np.float64)
    sigma = np.full(n_tokens, 1.0 / n_tokens)
    e = np.asarray(exit_points, dtype=np.int64)
    lens = np.diff(e)
    total = m.sum()
    if m.size == 0 or not np.isfinite(total) or total <= 0:
        return sigma.astype(np.float32)
    inside = lens.sum() / n_tokens  # the segments' share of σ, S/|o|
    per_token = np.zeros(n_tokens)
    for k in np.flatnonzero((m > 0) & (lens > 0)):
        per_token[e[k] : e[k + 1]] = m[k] / (lens[k] * total)
    span = slice(e[0], e[-1])
    sigma[span] = uniform_mix / n_tokens + (1.0 - uniform_mix) * inside * per_token[span]
    return (sigma / sigma.sum()).astype(np.float32)
