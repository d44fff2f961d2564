"""σ-weighted clipped policy loss with staleness correction, and its metrics.

Per completion token j of sample i (behaviour log-prob μ_j, token version v_j, learner version V):

- fresh token (v_j = V): ρ_j = π_θ/μ_j, w_j = 1 (PPO/GRPO ratio against the behaviour policy);
- stale token (v_j ≠ V: older, or newer after a learner restore renumbered versions):
  ρ_j = π_θ/sg(π_θ) (= 1, gradient ∇log π_θ) and a truncated importance weight
  w_j = min(sg(π_θ)/μ_j, tis_cap) — decoupled PPO with the current learner policy as the proximal
  policy, so tokens from old versions are corrected instead of being clipped away;
- ℓ_j = −w_j · s_j + β · KL_j with the clipped surrogate s_j = min(ρ_j A_i, clip(ρ_j, 1−ε_low,
  1+ε_high) A_i), bounded for A_i < 0 by the dual clip s_j ← max(s_j, c·A_i) (c = ``dual_clip``;
  Ye et al. 2020), so a fresh token whose ratio exploded cannot dominate the step; and the k3
  estimator KL_j = exp(r_j) − r_j − 1, r_j = log π_ref − log π_θ;
- sample loss L_i = Σ_j sg(σ_j) ℓ_j; batch loss Σ_i c_i L_i with c_i = 1/N_samples (``sample``)
  or |o_i|/N_tokens (``token``), both counted over the whole global batch (all ranks).

With σ = 1/|o|, no staleness and ``sample`` this is the GRPO loss; with ``token`` it is the
token-mean (DAPO) loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rredcot.common.config import LearnerConfig
from rredcot.learner.packing import MicroBatch

# metric name -> (numerator key, denominator key) once summed over micro-batches and ranks
MEANS = {
    "loss": ("loss", None),
    "clip_frac": ("clipped", "tokens"),
    "dual_clip_frac": ("dual_clipped", "tokens"),
    "ratio_mean": ("ratio", "tokens"),
    "logp_gap": ("abs_gap", "tokens"),
    "stale_frac": ("stale", "tokens"),
    "is_weight_mean": ("is_weight", "stale"),
    "is_truncated_frac": ("truncated", "stale"),
    "kl": ("kl", "tokens"),
    "sigma_entropy": ("sigma_entropy", "samples"),
    "sigma_entropy_norm": ("sigma_entropy_norm", "samples"),
    "sigma_max_scaled_mean": ("sigma_max_scaled", "samples"),
    "sigma_sum_mean": ("sigma_sum", "samples"),
    "sigma_zero_frac": ("sigma_zero", "tokens"),
}
SUM_KEYS = tuple(sorted({k for pair in MEANS.values() for k in pair if k} | {"samples", "tokens"}))
MAX_KEYS = ("ratio_max", "is_weight_max", "sigma_max_scaled_max")


@dataclass(frozen=True)
class LossSettings:
    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    loss_agg: str = "sample"
    dual_clip: float = 3.0

    @classmethod
    def from_config(cls, c: LearnerConfig) -> LossSettings:
        return cls(c.eps_low, c.eps_high, c.tis_cap, c.kl_coef, c.loss_agg, c.dual_clip)


class Stats:
    """Sums and maxima of loss statistics, mergeable over micro-batches and ranks."""

    def __init__(self) -> None:
        self.sums = dict.fromkeys(SUM_KEYS, 0.0)
        self.maxes = dict.fromkeys(MAX_KEYS, 0.0)

    def add(self, sums: dict[str, float], maxes: dict[str, float]) -> None:
        for k, v in sums.items():
            self.sums[k] += v
        for k, v in maxes.items():
            self.maxes[k] = max(self.maxes[k], v)

    def as_tensors(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """(sums, maxima) as float64 tensors on ``device`` (the collective backend's device)."""
        return (
            torch.tensor([self.sums[k] for k in SUM_KEYS], dtype=torch.float64, device=device),
            torch.tensor([self.maxes[k] for k in MAX_KEYS], dtype=torch.float64, device=device),
        )

    def load_tensors(self, sums: torch.Tensor, maxes: torch.Tensor) -> None:
        self.sums = dict(zip(SUM_KEYS, sums.tolist(), strict=True))
        self.maxes = dict(zip(MAX_KEYS, maxes.tolist(), strict=True))

    def result(self) -> dict[str, float]:
        out = {
            name: self.sums[num] / (self.sums[den] if den else 1.0)
            for name, (num, den) in MEANS.items()
            if den is None or self.sums[den] > 0
        }
        return out | dict(self.maxes) | {"samples": self.sums["samples"], "tokens": self.sums["tokens"]}


def sample_coefficients(mb: MicroBatch, agg: str, denominator: float) -> torch.Tensor:
    """c_i per sample of ``mb``: 1/N_samples (``sample``) or |o_i|/N_tokens (``token``)."""
    if agg == "sample":
        return torch.full((mb.n_samples,), 1.0 / denominator, device=mb.sigma.device)
    if agg == "token":
        return mb.completion_lengths.double().div(denominator).float()
    raise ValueError(f"learner.loss_agg={agg!r} is not one of 'sample', 'token'")


def policy_loss(
    logp: torch.Tensor,
    mb: MicroBatch,
    version: int,
    coef: torch.Tensor,
    settings: LossSettings,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stats]:
    """Loss of one micro-batch (its share of the global batch loss) and its statistics."""
    mu = mb.behaviour_logprobs
    adv = mb.advantages
    # tokens of another policy version: older (stale), or newer than a learner restored from a
    # checkpoint; both are corrected by the truncated importance weight
    stale = mb.versions != version
    lp = logp.float()
    lp_d = lp.detach()
    ratio = torch.exp(lp - torch.where(stale, lp_d, mu))
    raw_ratio = torch.exp(lp_d - mu)
    is_w = torch.where(stale, raw_ratio.clamp(max=settings.tis_cap), torch.ones_like(mu))
    clipped_ratio = ratio.clamp(1 - settings.eps_low, 1 + settings.eps_high)
    surrogate = torch.minimum(ratio * adv, clipped_ratio * adv)
    if settings.dual_clip > 0:  # with A < 0 the clipped objective alone is unbounded as ρ grows
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, settings.dual_clip * adv), surrogate)
    tok = -is_w * surrogate
    kl = torch.zeros_like(mu)
    if ref_logp is not None and settings.kl_coef > 0:
        r = ref_logp.float() - lp
        kl = torch.exp(r) - r - 1
        tok = tok + settings.kl_coef * kl
    per_sample = tok.new_zeros(mb.n_samples).index_add(0, mb.sample_of_token, mb.sigma * tok)
    loss = (per_sample * coef).sum()
    return loss, _stats(loss, mb, ratio.detach(), raw_ratio, adv, stale, is_w, kl.detach(), settings)


def _stats(
    loss: torch.Tensor,
    mb: MicroBatch,
    ratio: torch.Tensor,
    raw_ratio: torch.Tensor,
    adv: torch.Tensor,
    stale: torch.Tensor,
    is_w: torch.Tensor,
    kl: torch.Tensor,
    settings: LossSettings,
) -> Stats:
    clipped = ((ratio > 1 + settings.eps_high) & (adv > 0)) | ((ratio < 1 - settings.eps_low) & (adv < 0))
    sig = mb.sigma.double()
    sig_sum = sig.new_zeros(mb.n_samples).index_add(0, mb.sample_of_token, sig)
    p = sig / sig_sum[mb.sample_of_token].clamp(min=1e-30)
    plogp = torch.where(p > 0, p * p.clamp(min=1e-30).log(), torch.zeros_like(p))
    ent = -torch.zeros_like(sig_sum).index_add(0, mb.sample_of_token, plogp)
    n = mb.completion_lengths.double()
    max_sig = torch.zeros_like(sig_sum).scatter_reduce(0, mb.sample_of_token, sig, "amax")
    sums = {
        "loss": loss.detach(),
        "clipped": clipped.sum(),
        "dual_clipped": ((adv < 0) & (ratio > settings.dual_clip) & (settings.dual_clip > 0)).sum(),
        "ratio": raw_ratio.sum(),
        "abs_gap": raw_ratio.log().abs().sum(),
        "stale": stale.sum(),
        "is_weight": is_w[stale].sum(),
        "truncated": (stale & (raw_ratio > settings.tis_cap)).sum(),
        "kl": kl.sum(),
        "sigma_entropy": ent.sum(),
        "sigma_entropy_norm": torch.where(n > 1, ent / n.clamp(min=2).log(), 1.0).sum(),
        "sigma_max_scaled": (max_sig * n).sum(),
        "sigma_sum": sig_sum.sum(),
        "sigma_zero": (sig == 0).sum(),  # tokens σ gives no gradient
    }
    zero = raw_ratio.new_zeros(())
    maxes = {
        "ratio_max": raw_ratio.max() if len(raw_ratio) else zero,
        "is_weight_max": torch.where(stale, is_w, 0.0).max() if len(raw_ratio) else zero,  # weights are ≥ 0
        "sigma_max_scaled_max": (max_sig * n).max() if mb.n_samples else zero,
    }
    # one device-to-host copy for all statistics (a GPU learner syncs once per micro-batch, not per value)
    host = torch.stack([t.double() for t in (*sums.values(), *maxes.values())]).tolist()
    stats = Stats()
    counts = {"tokens": float(len(raw_ratio)), "samples": float(mb.n_samples)}
    stats.add(
        dict(zip(sums, host[: len(sums)], strict=True)) | counts, dict(zip(maxes, host[len(sums) :], strict=True))
    )
    return stats
