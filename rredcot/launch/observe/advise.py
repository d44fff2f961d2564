"""``rredcot advise``: which generator : redistributor : learner split to run, and which tier bounds it.

A small model of the pipeline: three tiers in a row, each of ``n`` workers that process samples at
``rate`` samples/s each while busy. With bounded staleness η ≥ 1 the tiers overlap, and the pipeline
runs at the slowest tier's capacity, ``min(n_g·r_g, n_r·r_r, n_l·r_l)``; with η = 0 generation and
training alternate, so their times per sample add (the redistributor overlaps the generators as it
reads their stream). Learner ranks are taken to scale linearly (data parallel), which is optimistic
past a node. Workers that share cores (a CPU box) meet one more bound: every worker's CPU seconds per
trained sample, summed, cannot exceed the cores; more workers there add no compute. The rates come
from a run (its own workers' counters: samples over the seconds they were not waiting for another
tier, ``rredcot/launch/observe/timeline.py``; the generators' counted in trained samples, at the run's yield after
filtering), or from a model size, a completion length and a GPU's peak (``paper_rates``): decoding is
bound by memory bandwidth (weights and the KV cache read once per step of the batch), scoring and
training by compute at a utilisation.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIERS = ("generator", "redistributor", "learner")
CORES = "cores"  # the bound of workers that share cores
COUNTS = {"generator": "samples", "redistributor": "rollouts", "learner": "samples_consumed"}


@dataclass(frozen=True)
class Rates:
    """Samples per second of one unit (a GPU, or a worker on CPU) of each tier while it works."""

    generator: float
    redistributor: float
    learner: float
    overlap: bool = True  # η ≥ 1: the tiers run at once
    cpu_per_sample: float = 0.0  # every worker's CPU seconds per trained sample (0: not measured)
    cores: float = 0.0  # cores all workers share (0: each unit has its own device)

    def of(self, tier: str) -> float:
        return getattr(self, tier)


@dataclass(frozen=True)
class Split:
    generator: int
    redistributor: int
    learner: int

    def of(self, tier: str) -> int:
        return getattr(self, tier)

    def __str__(self) -> str:
        return f"{self.generator}:{self.redistributor}:{self.learner}"


@dataclass(frozen=True)
class Prediction:
    split: Split
    samples_per_s: float
    bound: str  # the tier at its capacity, or ``CORES``
    busy: dict[str, float]  # each tier's share of time at work at that throughput (and the cores')


def predict(split: Split, rates: Rates) -> Prediction:
    """Samples/s of ``split`` under ``rates``; the bound (a tier, or the shared cores) and every
    tier's utilisation."""
    capacity = {t: split.of(t) * rates.of(t) for t in TIERS if split.of(t) > 0}
    if rates.overlap:
        x = min(capacity.values())
    else:  # generation and training take turns; scoring keeps up with generation within its turn
        x = 1.0 / (1.0 / capacity["generator"] + 1.0 / capacity["learner"])
        x = min(x, capacity.get("redistributor", math.inf))
    bound = min(capacity, key=capacity.get)
    if rates.cores and rates.cpu_per_sample:
        capacity[CORES] = rates.cores / rates.cpu_per_sample
        if capacity[CORES] < x:
            x, bound = capacity[CORES], CORES
    return Prediction(split, x, bound, {t: x / c for t, c in capacity.items()})


def splits(total: int, scorer: bool) -> list[Split]:
    """Every split of ``total`` units: at least one generator and one learner, and redistributor units
    only when the credit method computes on them (``scorer``): then at least one. O(total²): for tests
    and small totals; ``advise`` searches without building them."""
    out = []
    for g in range(1, total):
        for r in range(1, total - g) if scorer else [0]:
            if total - g - r >= 1:
                out.append(Split(g, r, total - g - r))
    return out


def moved(split: Split, own: Split | None) -> int:
    """How far ``split`` is from ``own``: the tiers' unit differences, summed (0 without ``own``)."""
    return sum(abs(split.of(t) - own.of(t)) for t in TIERS) if own else 0


def rank_key(p: Prediction, keep: Split | None) -> tuple[float, int, int, int]:
    """The advice's order: more samples/s first; on a tie the split closest to ``keep``, then fewer
    generators, then fewer redistributor units."""
    return (-p.samples_per_s, moved(p.split, keep), p.split.generator, p.split.redistributor)


def advise(total: int, rates: Rates, scorer: bool, top: int = 5, keep: Split | None = None) -> list[Prediction]:
    """The ``top`` splits of ``total`` units by predicted samples/s (``rank_key``): the same as ranking
    every split, without building them (``total`` may be a cluster's 100,000 units)."""
    if not all(math.isfinite(r) and r > 0 for r in (rates.generator, rates.redistributor, rates.learner)):
        raise ValueError(f"every tier's rate must be a positive number: {rates}")
    if not scorer:  # one split per generator count: all of them
        ranked = heapq.nsmallest(
            top, (predict(Split(g, 0, total - g), rates) for g in range(1, total)), key=lambda p: rank_key(p, keep)
        )
        return ranked
    found = _Search(total, rates, keep).best(top)
    return sorted((predict(s, rates) for s in found), key=lambda p: rank_key(p, keep))[:top]


def _first(pred: Callable[[int], bool], lo: int, hi: int, guess: float) -> int:
    """The smallest ``r`` in ``[lo, hi]`` with ``pred(r)`` (false, then true, along it), ``hi + 1`` when
    none: galloping out from ``guess``, then bisecting, so a good guess costs a few calls."""
    if lo > hi:
        return hi + 1
    try:
        at = min(max(int(guess), lo), hi)
    except (ValueError, OverflowError):  # nan, inf
        at = (lo + hi) // 2
    step = 1
    if pred(at):
        yes, no = at, lo - 1
        while at - step >= lo:
            if not pred(at - step):
                no = at - step
                break
            yes, step = at - step, step * 2
    else:
        no, yes = at, hi + 1
        while at + step <= hi:
            if pred(at + step):
                yes = at + step
                break
            no, step = at + step, step * 2
    while yes - no > 1:
        mid = (yes + no) // 2
        if pred(mid):
            yes = mid
        else:
            no = mid
    return yes


class _Search:
    """The best splits with redistributors, by the model's shape. With ``g`` generators fixed, the
    throughput along ``r`` is ``min(inc(r), dec(r), cap)``: ``inc`` (the redistributors' capacity) grows
    with ``r``, ``dec`` (the learner's, or with η = 0 its turn-taking with generation) falls, ``cap``
    (the generators', the cores') is fixed. So each row rises to a peak where ``inc`` meets ``dec`` and
    falls after it (in floating point too: every operation is monotone), and the values at least θ
    make an interval of it. The ``top`` best are then: every split above θ, the ``top``-th best value
    (fewer than ``top`` of them), and the ties at θ closest to the order's tie-break, found row by
    row in that order until no row can beat them. O(total · log total) calls of the row's function."""

    def __init__(self, total: int, rates: Rates, keep: Split | None) -> None:
        self.total, self.keep = total, keep
        self.rg, self.rr, self.rl = rates.generator, rates.redistributor, rates.learner
        self.overlap = rates.overlap
        self.cores = rates.cores / rates.cpu_per_sample if rates.cores and rates.cpu_per_sample else math.inf

    def x(self, g: int, r: int) -> float:
        """``predict(Split(g, r, total - g - r)).samples_per_s``, computed as it computes it."""
        cg, cr, cl = g * self.rg, r * self.rr, (self.total - g - r) * self.rl
        v = min(cg, cr, cl) if self.overlap else min(1.0 / (1.0 / cg + 1.0 / cl), cr)
        return self.cores if self.cores < v else v

    def crossing(self, g: int) -> int:
        """The last ``r`` whose redistributors' capacity is at most the falling term (0: none)."""
        n, rr, rl = self.total - g, self.rr, self.rl
        if self.overlap:
            dec = lambda r: (n - r) * rl  # noqa: E731
            guess = n * rl / (rr + rl)
        else:
            cg = g * self.rg
            dec = lambda r: 1.0 / (1.0 / cg + 1.0 / ((n - r) * rl))  # noqa: E731
            b = rr * rl * n + cg * (rl + rr)  # r·rr = dec(r): the quadratic's smaller root
            guess = (b - math.sqrt(max(b * b - 4 * rr * rl * cg * rl * n, 0.0))) / (2 * rr * rl)
        return _first(lambda r: r * rr > dec(r), 1, n - 1, guess) - 1

    def level(self, g: int, peak: int, theta: float, strict: bool) -> tuple[int, int]:
        """The interval of ``r`` in row ``g`` whose value is above ``theta`` (at least, unless ``strict``);
        empty when the first bound passes the second."""
        n, hi = self.total - g, self.total - g - 1
        above = (lambda r: self.x(g, r) > theta) if strict else (lambda r: self.x(g, r) >= theta)
        try:  # where inc reaches theta, and where the falling term leaves it: guesses, bisection corrects them
            rise = theta / self.rr
            left = theta if self.overlap else 1.0 / (1.0 / theta - 1.0 / (g * self.rg))
            fall = n - left / self.rl
        except (ZeroDivisionError, OverflowError):
            rise = fall = math.nan
        a = _first(above, 1, peak, rise)
        b = _first(lambda r: not above(r), peak + 1, hi, fall) - 1
        if a > peak:
            return (peak + 1, b) if b >= peak + 1 else (1, 0)
        return a, max(b, peak)

    def moved(self, g: int, r: int) -> int:
        k = self.keep
        return abs(g - k.generator) + abs(r - k.redistributor) + abs(self.total - g - r - k.learner) if k else 0

    def best(self, top: int) -> list[Split]:
        t, rows = self.total, range(1, self.total - 1)  # g, with r and l at least 1
        if not rows:
            return []
        crossing = {g: self.crossing(g) for g in rows}
        peaks = {}
        for g, c in crossing.items():
            peaks[g] = max(self.x(g, r) for r in (c, c + 1) if 1 <= r <= t - g - 1)
        if len(peaks) < top:
            theta = -math.inf
        else:  # the top-th best value: among the top values of the rows whose peak reaches the top-th peak
            kth_peak = heapq.nlargest(top, peaks.values())[-1]
            values: list[float] = []
            for g in (g for g in rows if peaks[g] >= kth_peak):
                values += self.row_top(g, crossing[g], top)
            theta = heapq.nlargest(top, values)[-1] if len(values) >= top else -math.inf
        found: list[Split] = []
        for g in (g for g in rows if peaks[g] > theta):  # every split above θ: fewer than top
            a, b = self.level(g, crossing[g], theta, strict=True)
            found += [Split(g, r, t - g - r) for r in range(a, b + 1)]
        # the ties at θ, best first: rows in the order of the least each can score on the tie-break
        need = top - len(found)
        k = self.keep
        bound = lambda g: abs(g - k.generator) + abs(t - g - k.redistributor - k.learner) if k else 0  # noqa: E731
        ties: list[tuple[int, int, int]] = []  # (moved, g, r), a heap of the worst kept first (negated)
        for g in sorted((g for g in rows if peaks[g] >= theta), key=lambda g: (bound(g), g)):
            if need <= 0 or (len(ties) == need and (bound(g), g) > (-ties[0][0], -ties[0][1])):
                break
            a, b = self.level(g, crossing[g], theta, strict=False)
            sa, sb = self.level(g, crossing[g], theta, strict=True) if peaks[g] > theta else (b + 1, b)
            for lo, hi in ((a, min(sa, b + 1) - 1), (max(sb, a - 1) + 1, b)) if sa <= sb else ((a, b),):
                for r in self.closest(g, lo, hi, need):
                    item = (-self.moved(g, r), -g, -r)
                    if len(ties) < need:
                        heapq.heappush(ties, item)
                    elif item > ties[0]:
                        heapq.heapreplace(ties, item)
        return found + [Split(-g, -r, t + g + r) for _, g, r in ties]

    def row_top(self, g: int, c: int, top: int) -> list[float]:
        """The ``top`` best values of row ``g`` (peak after ``c``): out from the peak both ways."""
        left, right, hi, out = c, c + 1, self.total - g - 1, []
        while len(out) < top and (left >= 1 or right <= hi):
            lv = self.x(g, left) if left >= 1 else -math.inf
            rv = self.x(g, right) if right <= hi else -math.inf
            if lv >= rv:
                out.append(lv)
                left -= 1
            else:
                out.append(rv)
                right += 1
        return out

    def closest(self, g: int, lo: int, hi: int, need: int) -> set[int]:
        """Of ``r`` in ``[lo, hi]``, a set holding the ``need`` best by (``moved``, ``r``): ``moved`` falls
        until the ``keep`` split's tiers' counts, is flat between them and rises after, so those lie within
        ``need`` of an end of the range or of one of those two counts."""
        if lo > hi:
            return set()
        k = self.keep
        marks = [lo, hi] + ([k.redistributor, self.total - g - k.learner] if k else [])
        return {r for m in marks for r in range(max(lo, m - need), min(hi, m + need) + 1)}


def measured_rates(
    history: list[dict[str, Any]], cfg: dict[str, Any], cores: float = 0.0
) -> tuple[Rates, Split, float]:
    """Per-unit rates from a run's history (``report/metrics.jsonl``), the run's own split (in units:
    GPUs where the tier has them, else workers) and its measured samples/s (what the learner consumed
    over its observed window). The generators' rate counts the samples that reached the learner (the
    run's yield: groups filtered as uniform or rejected as stale never do); every worker's CPU seconds
    (``cpu_s``, the evaluator's too) per trained sample go with ``cores``, the cores they shared."""
    cluster = cfg["cluster"]
    per_unit = {t: cluster[f"gpus_per_{t}"] or 1.0 for t in TIERS}
    count = {
        "generator": cluster["generators"],
        "redistributor": cluster["redistributors"],
        "learner": cluster["learner_ranks"],
    }
    first: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for p in sorted(history, key=lambda p: p["t"]):  # each worker's first and last report
        first.setdefault(p["worker"], p)
        last[p["worker"]] = p
    done: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    working: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    from rredcot.launch.observe.timeline import WAITS, worker_timelines  # matplotlib: only where a run is read

    timelines = worker_timelines(history)
    for w in timelines:
        key = COUNTS[w.tier]
        done[w.tier] += last[w.worker]["values"].get(key, 0.0) - first[w.worker]["values"].get(key, 0.0)
        working[w.tier] += sum(s for n, s in w.seconds.items() if n not in WAITS[w.tier])
    if not all(working.values()):
        raise ValueError("the run's history has no interval of work for every tier: let it run a few steps")
    if done["generator"] > done["learner"]:  # the generators' samples in trained ones
        done["generator"] = done["learner"]
    rate = {t: done[t] / working[t] / per_unit[t] for t in TIERS}  # per worker-second, then per unit
    if idle := [t for t in TIERS if not rate[t] > 0]:
        raise ValueError(
            f"the run's history counts no work done by its {' and '.join(idle)} tier: let it run a few steps"
        )
    window = max(w.times[-1] - w.times[0] for w in timelines if w.tier == "learner")
    measured = done["learner"] / window if window > 0 else 0.0
    own = Split(*(round(count[t] * per_unit[t]) for t in TIERS))
    cpu = sum(last[w]["values"].get("cpu_s", 0.0) - first[w]["values"].get("cpu_s", 0.0) for w in last)
    rates = Rates(
        rate["generator"],
        rate["redistributor"],
        rate["learner"],
        cfg["staleness"]["eta"] >= 1,
        cpu / done["learner"] if done["learner"] else 0.0,
        cores,
    )
    return rates, own, measured


def run_rates(run_dir: Path, cores: float = 0.0) -> tuple[Rates, Split, float, dict[str, Any]]:
    """``measured_rates`` of the run in ``run_dir`` (its ``report/metrics.jsonl`` and ``config.yaml``),
    its workers sharing ``cores``."""
    from omegaconf import OmegaConf

    from rredcot.launch.observe.report import HISTORY_FILE, read_history

    history_file = run_dir / "report" / HISTORY_FILE
    if not history_file.is_file():
        raise FileNotFoundError(f"{history_file} not found: a run of this version saves it as it goes")
    cfg = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    rates, own, measured = measured_rates(read_history(history_file), cfg, cores)
    return rates, own, measured, cfg


def table(predictions: list[Prediction], own: Prediction | None = None, measured: float | None = None) -> str:
    """A short table of splits, their predicted samples/s, the bounding tier and each tier's use."""
    rows = [("split g:r:l", "samples/s", "bound by", "busy g / r / l")]
    shown = predictions + ([own] if own and own.split not in [p.split for p in predictions] else [])
    for p in shown:
        busy = " / ".join(f"{p.busy[t]:.0%}" if t in p.busy else "-" for t in TIERS)
        mark = " (this run)" if own is not None and p.split == own.split else ""
        rows.append((f"{p.split}{mark}", f"{p.samples_per_s:.3g}", p.bound, busy))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(wd) for c, wd in zip(r, widths)) for r in rows]
    if own is not None and measured is not None:
        lines.append(
            f"this run measured {measured:.3g} samples/s; the model predicts {own.samples_per_s:.3g} for its split"
        )
    return "\n".join(lines)


def as_json(predictions: list[Prediction]) -> str:
    return json.dumps(
        [
            {"split": str(p.split), "samples_per_s": p.samples_per_s, "bound": p.bound, "busy": p.busy}
            for p in predictions
        ]
    )
