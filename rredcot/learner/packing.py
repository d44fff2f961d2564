"""Token-budget micro-batches: several samples packed per row with per-sample position ids.

A packed micro-batch is ONE row: its samples (prompt + completion each) back to back, no padding,
``position_ids`` restarting at 0 for every sample, and ``sample_bounds`` (where each sample starts,
then the row's end). The learner's varlen attention (``attention.py``) runs causal attention
within each sample and never across, at Σ Lᵢ² cost. The padded layout (one sample per row, right
padding, micro-batches in the order the samples came) is kept as the reference and the benchmark
baseline: right padding needs no attention mask, since no real token attends to a later position.

The shared layout packs a group's samples behind ONE copy of their common prompt:
``[prompt, c_1, …, c_G]`` with a 4D mask in which each completion sees the prompt and itself only,
and positions that continue the prompt's. A prompt's activations do not depend on what follows
it, so loss and gradients equal the packed layout's exactly, while the prompt is computed once
per group instead of G times — with short completions after long prompts (the CPU demo:
~120-token prompts, ~15-token answers, G = 8) that removes most of the learner's work. The mask
is [W, W], so this layout suits micro-batches of a few thousand tokens, not 25k-token rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rredcot.common.records import WeightedGroup

LAYOUTS = ("packed", "padded", "shared")


class BudgetError(ValueError):
    """A sample that cannot fit into one micro-batch of ``learner.micro_token_budget`` tokens."""


@dataclass(frozen=True)
class TrainSample:
    """One completion as the learner trains it (prompt + completion token ids and per-token data)."""

    id: str
    prompt_ids: np.ndarray  # int [P]
    completion_ids: np.ndarray  # int [L]
    behaviour_logprobs: np.ndarray  # float32 [L]
    sigma: np.ndarray  # float32 [L]
    versions: np.ndarray  # int32 [L], policy version of each completion token
    advantage: float
    reward: float = 0.0
    scorer_version: int = 0  # the policy version of the scorer that computed σ

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def samples_from_group(group: WeightedGroup) -> list[TrainSample]:
    return [
        TrainSample(
            id=s.rollout.id,
            prompt_ids=group.prompt_ids,
            completion_ids=s.rollout.completion_ids,
            behaviour_logprobs=s.rollout.behaviour_logprobs,
            sigma=s.sigma,
            versions=s.rollout.token_versions(),
            advantage=float(s.advantage),
            reward=float(s.rollout.reward),
            scorer_version=group.scorer_version,
        )
        for s in group.samples
    ]


@dataclass
class MicroBatch:
    """Model inputs plus flat per-completion-token tensors (T tokens over S samples)."""

    input_ids: torch.Tensor  # long [R, W]
    position_ids: torch.Tensor  # long [R, W]
    attention_mask: torch.Tensor | None  # bool [1, 1, W, W] in the shared layout, else None
    sample_bounds: tuple[int, ...] | None  # row offsets where samples (packed) or units (shared) start, then W
    token_index: torch.Tensor  # long [T]: flat index into [R*W] of the logits predicting each token
    targets: torch.Tensor  # long [T]
    behaviour_logprobs: torch.Tensor  # float32 [T]
    sigma: torch.Tensor  # float32 [T]
    advantages: torch.Tensor  # float32 [T]
    versions: torch.Tensor  # long [T]
    sample_of_token: torch.Tensor  # long [T], local sample index
    completion_lengths: torch.Tensor  # long [S]
    sample_ids: list[str]
    n_tokens: int  # real (non-padding) input tokens

    @property
    def n_samples(self) -> int:
        return len(self.sample_ids)

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in vars(self).items()}
        return MicroBatch(**moved)


def plan_micro_batches(samples: list[TrainSample], budget: int, layout: str = "packed") -> list[list[int]]:
    """Group sample indices into micro-batches of at most ``budget`` input tokens (deterministic).

    packed: first-fit decreasing into rows of ``budget`` tokens, one row per micro-batch.
    padded: in the order given, one sample per row, as many rows as fit ``rows × longest ≤ budget``.
    shared: a prompt with its completions as one unit, first-fit decreasing into ``budget`` tokens.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} not in {LAYOUTS}")
    for s in samples:
        if s.length > budget:
            raise BudgetError(
                f"sample {s.id} has {s.length} tokens (prompt {len(s.prompt_ids)} + completion "
                f"{len(s.completion_ids)}), more than learner.micro_token_budget={budget}; "
                f"raise the budget to at least {s.length}"
            )
    if layout == "shared":
        return _first_fit_decreasing(_shared_units(samples, budget), budget)
    if layout == "packed":
        return _first_fit_decreasing([(s.length, [i]) for i, s in enumerate(samples)], budget)
    bins: list[list[int]] = []
    longest = 0
    for i, s in enumerate(samples):
        if bins and max(longest, s.length) * (len(bins[-1]) + 1) <= budget:
            bins[-1].append(i)
            longest = max(longest, s.length)
        else:
            bins.append([i])
            longest = s.length
    return bins


def _first_fit_decreasing(units: list[tuple[int, list[int]]], budget: int) -> list[list[int]]:
    """Bins of at most ``budget`` tokens from (tokens, sample indices) units, largest unit first
    (ties by the indices, so the plan is deterministic); each bin lists its samples unit by unit."""
    bins: list[list[int]] = []
    free: list[int] = []
    for size, unit in sorted(units, key=lambda u: (-u[0], u[1])):
        j = next((b for b, f in enumerate(free) if f >= size), None)
        if j is None:
            bins.append([])
            free.append(budget)
            j = len(bins) - 1
        bins[j] += unit
        free[j] -= size
    return bins


def _shared_units(samples: list[TrainSample], budget: int) -> list[tuple[int, list[int]]]:
    """A prompt and its samples' completions as (tokens, sample indices), split where one unit
    would exceed the budget."""
    by_prompt: dict[bytes, list[int]] = {}
    for i in sorted(range(len(samples)), key=lambda i: samples[i].id):
        by_prompt.setdefault(samples[i].prompt_ids.astype(np.int64).tobytes(), []).append(i)
    units: list[tuple[int, list[int]]] = []
    for members in by_prompt.values():
        prompt_len = len(samples[members[0]].prompt_ids)
        size, unit = prompt_len, []
        for i in members:
            n = len(samples[i].completion_ids)
            if unit and size + n > budget:
                units.append((size, unit))
                size, unit = prompt_len, []
            size, unit = size + n, unit + [i]
        units.append((size, unit))
    return units


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def _collate_shared(samples: list[TrainSample], pad_id: int) -> MicroBatch:
    """One row: each run of samples with the same prompt shares one copy of it (4D mask)."""
    units: list[list[TrainSample]] = []
    for s in samples:
        if units and np.array_equal(units[-1][0].prompt_ids, s.prompt_ids):
            units[-1].append(s)
        else:
            units.append([s])
    width = sum(len(u[0].prompt_ids) + sum(len(s.completion_ids) for s in u) for u in units)
    ids = np.full(width, pad_id, dtype=np.int64)
    pos = np.zeros(width, dtype=np.int64)
    mask = torch.zeros((width, width), dtype=torch.bool)
    token_index: list[np.ndarray] = []
    offset = 0
    bounds = [0]  # where each unit starts, then the row's end: the mask is block-diagonal over units
    for unit in units:
        prompt_len = len(unit[0].prompt_ids)
        ids[offset : offset + prompt_len] = unit[0].prompt_ids
        pos[offset : offset + prompt_len] = np.arange(prompt_len)
        mask[offset : offset + prompt_len, offset : offset + prompt_len] = _causal(prompt_len)
        start = offset + prompt_len
        for s in unit:
            n = len(s.completion_ids)
            ids[start : start + n] = s.completion_ids
            pos[start : start + n] = prompt_len + np.arange(n)
            mask[start : start + n, offset : offset + prompt_len] = True
            mask[start : start + n, start : start + n] = _causal(n)
            # the first completion token is predicted from the prompt's last position
            token_index.append(np.concatenate([[offset + prompt_len - 1], np.arange(start, start + n - 1)]))
            start += n
        offset = start
        bounds.append(offset)
    return _micro_batch(
        samples,
        torch.from_numpy(ids)[None],
        torch.from_numpy(pos)[None],
        mask[None, None],
        np.concatenate(token_index),
        n_tokens=width,
        sample_bounds=tuple(bounds),
    )


def collate(samples: list[TrainSample], layout: str = "packed", pad_id: int = 0) -> MicroBatch:
    """Tensors of one micro-batch: one packed row, one right-padded row per sample, or one
    shared-prompt row. Samples keep their order in the per-token tensors (``token_index`` points
    into the rows)."""
    if layout == "shared":
        return _collate_shared(samples, pad_id)
    packed = layout == "packed"
    lengths = [s.length for s in samples]
    starts = np.cumsum([0, *lengths]) if packed else np.arange(len(samples) + 1) * max(lengths)
    input_ids = np.full(starts[-1], pad_id, dtype=np.int64)
    position_ids = np.zeros(starts[-1], dtype=np.int64)
    token_index = []
    for s, start in zip(samples, starts, strict=False):
        input_ids[start : start + s.length] = np.concatenate([s.prompt_ids, s.completion_ids])
        position_ids[start : start + s.length] = np.arange(s.length)
        token_index.append(np.arange(len(s.completion_ids)) + start + len(s.prompt_ids) - 1)
    shape = (1, -1) if packed else (len(samples), -1)
    return _micro_batch(
        samples,
        torch.from_numpy(input_ids).view(shape),
        torch.from_numpy(position_ids).view(shape),
        None,
        np.concatenate(token_index),
        n_tokens=sum(lengths),
        sample_bounds=tuple(int(x) for x in starts) if packed else None,
    )


def _micro_batch(
    samples: list[TrainSample],
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    mask: torch.Tensor | None,
    token_index: np.ndarray,
    n_tokens: int,
    sample_bounds: tuple[int, ...] | None = None,
) -> MicroBatch:
    lengths = [len(s.completion_ids) for s in samples]

    def cat(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([getattr(s, name) for s in samples])).to(dtype)

    return MicroBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        sample_bounds=sample_bounds,
        token_index=torch.from_numpy(token_index).long(),
        targets=cat("completion_ids", torch.long),
        behaviour_logprobs=cat("behaviour_logprobs", torch.float32),
        sigma=cat("sigma", torch.float32),
        advantages=torch.repeat_interleave(
            torch.tensor([s.advantage for s in samples], dtype=torch.float32), torch.tensor(lengths)
        ),
        versions=cat("versions", torch.long),
        sample_of_token=torch.repeat_interleave(torch.arange(len(samples)), torch.tensor(lengths)),
        completion_lengths=torch.tensor(lengths, dtype=torch.long),
        sample_ids=[s.id for s in samples],
        n_tokens=n_tokens,
    )


def micro_batches(samples: list[TrainSample], budget: int, layout: str = "packed", pad_id: int = 0) -> list[MicroBatch]:
    """Plan and collate: the micro-batches of one rank's share of a global batch."""
    return [collate([samples[i] for i in b], layout, pad_id) for b in plan_micro_batches(samples, budget, layout)]
