"""Hybrid keyword–entropy segmentation of the thinking span of a completion.

(a) keyword boundaries from per-token text offsets (newlines; keywords at a line or sentence
start); (b) greedy merging of the adjacent pair with the lowest total entropy (a heap,
O(P log P)); (c) stop at K segments, then merge pieces shorter than the minimum length;
(d) homogenise: re-place the boundaries, only at keyword boundaries, minimising the largest
segment entropy (linear partition). Each step is switchable (``credit.segmentation``).
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rredcot.common.config import SegmentationConfig

SENTENCE_ENDS = ".!?"


@dataclass
class Segmentation:
    """Segments of the thinking span; all indices are completion token indices."""

    span: tuple[int, int]  # thinking span [lo, hi): whole completion without thinking tags
    has_think: bool
    candidates: np.ndarray  # int32, keyword boundaries strictly inside the span
    exit_points: np.ndarray  # int32 [K+1]: e_0 = lo < e_1 < ... < e_K = hi ([lo] if the span is empty)

    @property
    def n_segments(self) -> int:
        return len(self.exit_points) - 1


# each tokenizer's token texts seen so far: a 25k-token Qwen trace takes 38 ms decoded one by one,
# 2-7 ms from here once other traces filled it (Intel Xeon, family 6 model 167)
_TEXTS: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's own text (decoded one by one: offsets without re-tokenising); a token's text is
    decoded once per tokenizer."""
    ids = [int(i) for i in ids]
    try:
        known = _TEXTS.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: decoded each time
        known = {}
    new = list(dict.fromkeys(i for i in ids if i not in known))
    if new:
        known.update(zip(new, tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False), strict=True))
    return [known[i] for i in ids]


def _offsets(texts: Sequence[str]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)


def thinking_span(texts: Sequence[str], think_start: str, think_end: str) -> tuple[int, int, bool]:
    """[lo, hi) between the thinking tags: after ``think_start`` (or 0) up to ``think_end`` (or L)."""
    text, off = "".join(texts), _offsets(texts)
    n = len(texts)
    s, e = text.find(think_start), text.find(think_end)
    lo = int(np.searchsorted(off[:-1], s + len(think_start), side="left")) if s >= 0 else 0
    hi = int(np.searchsorted(off[1:], e, side="right")) if e >= 0 else n
    lo = min(lo, n)
    return lo, max(lo, hi), s >= 0 or e >= 0


def keyword_boundaries(texts: Sequence[str], lo: int, hi: int, keywords: Sequence[str]) -> list[int]:
    """Token indices j in (lo, hi) that start a new line, or start a sentence or line with a keyword."""
    text, off = "".join(texts), _offsets(texts)
    out: list[int] = []
    last_char = ""  # last non-whitespace character seen in the span so far
    newline_since = False  # a newline after that character
    for j in range(lo, hi):
        t = texts[j]
        body = t.lstrip()
        lead = t[: len(t) - len(body)]
        if j > lo and body:
            line_start = newline_since or "\n" in lead
            if line_start or last_char in SENTENCE_ENDS:
                at = off[j] + len(lead)
                if line_start or any(_word_at(text, at, kw) for kw in keywords):
                    out.append(j)
        stripped = t.rstrip()
        if stripped.strip():
            last_char, newline_since = stripped[-1], "\n" in t[len(stripped) :]
        else:
            newline_since = newline_since or "\n" in t
    return out


def _word_at(text: str, at: int, word: str) -> bool:
    end = at + len(word)
    return text.startswith(word, at) and (end >= len(text) or not text[end].isalnum())


class _Pieces:
    """Adjacent pieces as a linked list with versions, for heap-based greedy merging."""

    def __init__(self, ent: np.ndarray, lens: np.ndarray, min_len: int):
        n = len(ent)
        self.ent, self.lens, self.min_len = ent.astype(np.float64), lens.astype(np.int64), min_len
        self.next = list(range(1, n + 1))
        self.prev = list(range(-1, n - 1))
        self.version = [0] * n
        self.alive = [True] * n
        self.count = n
        self.short = int((self.lens < min_len).sum())

    def pairs(self, eligible: Callable[[int, int], bool]) -> list[tuple[float, int, int, int, int]]:
        n = len(self.ent)
        return [self._entry(a) for a in self.starts() if self.next[a] < n and eligible(a, self.next[a])]

    def _entry(self, a: int) -> tuple[float, int, int, int, int]:
        b = self.next[a]
        return (self.ent[a] + self.ent[b], a, self.version[a], b, self.version[b])

    def is_short(self, a: int) -> bool:
        return self.lens[a] < self.min_len

    def merge_until(self, done: Callable[[], bool], eligible: Callable[[int, int], bool]) -> None:
        heap = self.pairs(eligible)
        heapq.heapify(heap)
        while heap and not done():
            _, a, va, b, vb = heapq.heappop(heap)
            if not (self.alive[a] and self.alive[b]) or self.version[a] != va or self.version[b] != vb:
                continue
            self.short -= int(self.is_short(a)) + int(self.is_short(b))
            self.ent[a] += self.ent[b]
            self.lens[a] += self.lens[b]
            self.short += int(self.is_short(a))
            self.alive[b] = False
            self.version[a] += 1
            self.next[a] = self.next[b]
            if self.next[a] < len(self.ent):
                self.prev[self.next[a]] = a
            self.count -= 1
            for left in (self.prev[a], a):
                if left >= 0 and self.next[left] < len(self.ent) and eligible(left, self.next[left]):
                    heapq.heappush(heap, self._entry(left))

    def starts(self) -> list[int]:
        return [i for i, a in enumerate(self.alive) if a]


def greedy_merge(ent: np.ndarray, lens: np.ndarray, k: int | None, min_len: int) -> list[int]:
    """Merge adjacent pieces, lowest total entropy first: while more than ``k`` remain (``k`` None:
    no cap), then while a piece is shorter than ``min_len`` (only pairs holding a short piece).
    Returns the indices of the pieces that start the merged segments."""
    p = _Pieces(ent, lens, min_len)
    if k is not None:
        p.merge_until(lambda: p.count <= k, lambda a, b: True)
    p.merge_until(lambda: p.short == 0 or p.count <= 1, lambda a, b: p.is_short(a) or p.is_short(b))
    return p.starts()


def linear_partition(ent: np.ndarray, k: int) -> list[int]:
    """Split pieces into exactly min(k, P) contiguous groups minimising the largest group entropy.

    Bisection on the threshold with a greedy feasibility check; returns each group's first piece.
    """
    ent = np.asarray(ent, dtype=np.float64)
    n = len(ent)
    k = min(k, n)
    if k <= 0:
        return []
    lo, hi = float(ent.max()), float(ent.sum())
    for _ in range(100):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if len(_greedy_groups(ent, mid, 0)) <= k:
            hi = mid
        else:
            lo = mid
    return _greedy_groups(ent, hi, k)


def _greedy_groups(ent: np.ndarray, threshold: float, k: int) -> list[int]:
    """Left-to-right groups under ``threshold``; with k > 0, cut early when the remaining pieces must
    be singletons to make exactly k groups."""
    n = len(ent)
    limit = threshold + 1e-9 * max(1.0, threshold)  # slack for summation-order rounding
    starts, total = [0], 0.0
    for i, e in enumerate(ent):
        if i and (total + e > limit or n - i == k - len(starts)):
            starts.append(i)
            total = 0.0
        total += e
    return starts


def segment(
    texts: Sequence[str], entropy: np.ndarray, cfg: SegmentationConfig, think_start: str, think_end: str
) -> Segmentation:
    """Segment a completion (per-token ``texts`` and scorer ``entropy``) as configured in ``cfg``.

    Non-finite entropies count as 0.
    """
    lo, hi, has_think = thinking_span(texts, think_start, think_end)
    ent = np.nan_to_num(np.asarray(entropy, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    ent = np.maximum(ent, 0.0)
    if hi <= lo:
        return Segmentation((lo, hi), has_think, np.zeros(0, np.int32), np.array([lo], np.int32))
    every_token = list(range(lo + 1, hi))
    cands = keyword_boundaries(texts, lo, hi, cfg.keywords) if cfg.split_keywords else every_token
    bounds = np.array([lo, *cands, hi], dtype=np.int64)
    csum = np.concatenate([[0.0], np.cumsum(ent)])
    piece_ent, piece_len = csum[bounds[1:]] - csum[bounds[:-1]], np.diff(bounds)
    k_cap = cfg.segments if cfg.stop_at_k else None
    if cfg.merge:
        starts = greedy_merge(piece_ent, piece_len, k_cap, cfg.min_segment_tokens)
    else:
        starts = list(range(len(piece_ent)))
    if cfg.homogenise:
        target = len(starts) if cfg.merge or k_cap is None else min(k_cap, len(starts))
        starts = linear_partition(piece_ent, target)
        # the partition knows no lengths (and cuts singletons when it must reach ``target``):
        # re-merge its groups until each holds ``min_segment_tokens`` again
        keep = greedy_merge(
            np.add.reduceat(piece_ent, starts), np.add.reduceat(piece_len, starts), None, cfg.min_segment_tokens
        )
        starts = [starts[i] for i in keep]
    exits = np.array([*bounds[starts], hi], dtype=np.int32)
    return Segmentation((lo, hi), has_think, np.asarray(cands, np.int32), exits)
