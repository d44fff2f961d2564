"""The split advisor: its queueing model, its search and its rates, checked by hand."""

from __future__ import annotations

import itertools
import json
import random
import time

import pytest
import yaml

from rredcot.common.config import load_config, to_dict
from rredcot.launch.cli import main
from rredcot.launch.observe.advise import (
    COUNTS,
    Rates,
    Split,
    advise,
    measured_rates,
    moved,
    predict,
    splits,
)
from tests.unit.launch.observe.test_timeline import pipeline_waiting_for_generation


def test_overlapped_tiers_run_at_the_slowest_capacity_and_alternating_ones_add_their_times():
    rates = Rates(generator=1.0, redistributor=4.0, learner=3.0)
    p = predict(Split(2, 1, 1), rates)  # capacities 2, 4, 3
    assert p.samples_per_s == 2.0 and p.bound == "generator"
    assert p.busy == {"generator": 1.0, "redistributor": 0.5, "learner": pytest.approx(2 / 3)}
    sync = predict(Split(2, 1, 1), Rates(1.0, 4.0, 3.0, overlap=False))
    assert sync.samples_per_s == pytest.approx(1 / (1 / 2 + 1 / 3))  # 1.2 samples/s


def test_every_split_is_searched_and_the_best_is_the_brute_force_best():
    assert splits(3, scorer=True) == [Split(1, 1, 1)]
    assert splits(4, scorer=False) == [Split(1, 0, 3), Split(2, 0, 2), Split(3, 0, 1)]
    rates = Rates(generator=0.5, redistributor=6.0, learner=2.0)
    best = advise(10, rates, scorer=True)[0]
    brute = max(
        (min(g * 0.5, r * 6.0, (10 - g - r) * 2.0), g)
        for g, r in itertools.product(range(1, 10), repeat=2)
        if 10 - g - r >= 1
    )
    assert best.samples_per_s == brute[0] == 3.5 and best.split == Split(7, 1, 2) and best.bound == "generator"


def counted(history: list[dict], counts: list[float], cpu: list[float]) -> list[dict]:
    """``history`` with each report's tier counter and CPU seconds set."""
    for p, count, seconds in zip(history, counts, cpu, strict=True):
        p["values"][COUNTS[p["tier"]]], p["values"]["cpu_s"] = float(count), seconds
    return history


def test_rates_measured_from_a_runs_own_counters():
    """The timeline's pipeline over 10 s: the generator made 8 samples in 10 s of work (never waiting),
    of which 6 reached the learner (a uniform group filtered: 0.6 trained samples/s); the
    redistributor scored 8 in 2 s, the learner consumed 6 in its 4 s of work (10 s less 6 waiting).
    The workers spent 9 + 2 + 4 CPU seconds: 2.5 per trained sample."""
    history = counted(pipeline_waiting_for_generation(), [0, 0, 0, 8, 8, 6], [1.0, 1.0, 1.0, 10.0, 3.0, 5.0])
    cfg = to_dict(load_config("tests", ["staleness.eta=1"]))
    rates, own, measured = measured_rates(history, cfg, cores=2)
    assert rates == Rates(0.6, 4.0, 1.5, overlap=True, cpu_per_sample=2.5, cores=2)
    assert own == Split(1, 1, 1) and measured == pytest.approx(0.6)
    assert predict(own, rates).bound == "generator"


def test_shared_cores_bound_every_split_and_the_advice_keeps_the_run_split():
    """Capacities 2 / 4 / 3 at 2:1:1, but 2 cores at 1.25 CPU s a sample allow 1.6 samples/s: the cores
    bound it. Of 5 units, 2:1:2, 2:2:1 and 3:1:1 all reach the cores' 1.6: the advisor keeps the
    split it was given, or moves the fewest units from it. Without the cores, 3:1:1 (3 / 4 / 3) wins."""
    rates = Rates(generator=1.0, redistributor=4.0, learner=3.0, cpu_per_sample=1.25, cores=2)
    p = predict(Split(2, 1, 1), rates)
    assert p.samples_per_s == pytest.approx(1.6) and p.bound == "cores" and p.busy["cores"] == pytest.approx(1.0)
    assert p.busy["generator"] == pytest.approx(0.8)
    ranked = advise(5, rates, scorer=True, keep=Split(2, 1, 2))
    assert [p.split for p in ranked[:3]] == [Split(2, 1, 2), Split(2, 2, 1), Split(3, 1, 1)]
    assert all(p.samples_per_s == pytest.approx(1.6) and p.bound == "cores" for p in ranked[:3])
    assert advise(5, rates, scorer=True, keep=Split(1, 1, 3))[0].split == Split(2, 1, 2)  # one unit moved
    assert advise(5, Rates(1.0, 4.0, 3.0), scorer=True)[0].split == Split(3, 1, 1)


def test_advise_command_on_a_run_and_on_paper(tmp_path, capsys):
    (tmp_path / "report").mkdir()
    history = counted(pipeline_waiting_for_generation(), [0, 0, 0, 8, 8, 6], [1.0, 1.0, 1.0, 10.0, 3.0, 5.0])
    (tmp_path / "report" / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in history))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config("tests"))))
    assert main(["advise", str(tmp_path), "--total", "5", "--cores", "0"]) == 0
    out = capsys.readouterr().out
    assert "generator 0.6, redistributor 4, learner 1.5" in out and "shared cores" not in out
    assert out.splitlines()[2].startswith("3:1:1 ") and "1:1:1 (this run)" in out
    assert "this run measured 0.6 samples/s; the model predicts 0.6 for its split" in out
    assert main(["advise", str(tmp_path), "--total", "5", "--cores", "2"]) == 0
    out = capsys.readouterr().out
    assert "shared cores: 2, at 2.5 CPU s per trained sample (every worker): at most 0.8 samples/s" in out
    assert out.splitlines()[3].startswith("2:1:2 ") and " cores " in out.splitlines()[3]  # 0.8: the cores bind
    assert (
        main(["advise", "--params", "4e9", "--layers", "36", "--heads", "32", "--kv-heads", "8", "--total", "8"]) == 0
    )
    assert "per GPU samples/s" in capsys.readouterr().out
    assert main(["advise", str(tmp_path / "nothing")]) == 2


def exhaustive(total: int, rates: Rates, scorer: bool, top: int = 5, keep: Split | None = None) -> list:
    """Every split predicted and ranked (what ``advise`` did before it searched by the model's shape)."""
    key = lambda p: (-p.samples_per_s, moved(p.split, keep), p.split.generator, p.split.redistributor)  # noqa: E731
    return sorted((predict(s, rates) for s in splits(total, scorer)), key=key)[:top]


def test_the_search_finds_what_ranking_every_split_finds():
    """Random rates (round ones, so that ties are common; the cores' bound ties whole regions),
    overlapped or alternating tiers, with and without a split to keep: the same splits, in the same
    order. Below 10 units the order is also the old one (which broke ties by the split's text)."""
    rng = random.Random(62)
    for _ in range(400):
        total = rng.choice([3, 4, 5, 6, 7, 9, 10, 13, 24, 50, 97])
        pick = (
            (lambda: rng.choice([0.25, 0.5, 1.0, 2.0, 3.0, 6.0]))
            if rng.random() < 0.5
            else lambda: rng.uniform(0.01, 9)
        )
        cores = rng.choice([0, 0, 2, 5])
        rates = Rates(pick(), pick(), pick(), rng.random() < 0.6, rng.choice([0.5, 1.25]) if cores else 0.0, cores)
        keep = Split(rng.randint(1, 8), rng.randint(0, 8), rng.randint(1, 8)) if rng.random() < 0.4 else None
        top, scorer = rng.choice([1, 3, 5, 8]), rng.random() < 0.85
        got = advise(total, rates, scorer, top=top, keep=keep)
        assert got == exhaustive(total, rates, scorer, top, keep), (total, rates, scorer, top, keep)
        if total < 10:
            old = sorted(
                (predict(s, rates) for s in splits(total, scorer)),
                key=lambda p: (-p.samples_per_s, moved(p.split, keep), str(p.split)),
            )
            assert got == old[:top]


def test_a_clusters_total_is_advised_in_seconds():
    """``--total 100000`` used to build every split (5·10⁹) until memory ran out."""
    for rates in (Rates(0.5, 6.0, 2.0), Rates(0.5, 6.0, 2.0, overlap=False), Rates(1.0, 4.0, 3.0, True, 1.25, 2)):
        start = time.monotonic()
        best = advise(100_000, rates, scorer=True, keep=Split(2, 1, 2))
        assert time.monotonic() - start < 20 and len(best) == 5
    assert [str(p.split) for p in advise(100_000, Rates(0.5, 6.0, 2.0), scorer=True)][:1] == ["75000:6250:18750"]
    assert len(advise(100_000, Rates(0.5, 6.0, 2.0), scorer=False)) == 5


PAPER = ["--params", "4e9", "--layers", "36", "--heads", "32", "--kv-heads", "8", "--total", "8"]


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("--params", "-4e9", "a finite number in (0, 1e+15]"),
        ("--params", "nan", "a finite number in (0, 1e+15]"),
        ("--params", "inf", "a finite number in (0, 1e+15]"),
        ("--layers", "-1", "an integer in [1, 100000]"),
        ("--heads", "0", "an integer in [1, 100000]"),
        ("--kv-heads", "0", "an integer in [1, 100000]"),
        ("--head-dim", "0", "an integer in [1, 65536]"),
        ("--prompt", "0", "an integer in [1, 100000000]"),
        ("--completion", "0", "an integer in [1, 100000000]"),
        ("--scored", "-5", "a finite number in [0, 1e+12]"),
        ("--scored", "nan", "a finite number in [0, 1e+12]"),
        ("--cores", "-2", "a finite number in [0, 1e+07]"),
        ("--total", "1", "an integer in [2, 100000]"),
        ("--total", "100001", "an integer in [2, 100000]"),
        ("--total", "many", "an integer in [2, 100000]"),
    ],
)
def test_advise_refuses_an_argument_out_of_its_range_in_one_line(flag, value, allowed, capsys):
    """``--params=-4e9`` printed -35 samples/s, ``nan`` a table of NaN, ``--completion 0`` a ZeroDivisionError."""
    with pytest.raises(SystemExit) as exit:
        main(["advise", *PAPER, f"{flag}={value}"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit.value.code == 2
    assert err.endswith(f"error: argument {flag}: must be {allowed} (got {value if value != 'many' else repr(value)})")


def test_advise_refuses_a_split_that_cannot_hold_every_tier(capsys):
    assert main(["advise", *PAPER[:-1], "2", "--scored", "5"]) == 2
    assert capsys.readouterr().err.strip() == (
        "rredcot: error: advise: --total 2 cannot hold a generator, a redistributor and a learner: "
        "give --total 3 or more"
    )
    assert main(["advise", *PAPER[:-1], "2"]) == 0  # GRPO: a generator and a learner
    assert main(["advise", *PAPER[:7], "64", *PAPER[8:]]) == 2  # more key-value heads than heads
    assert "--kv-heads 64 is more than --heads 32" in capsys.readouterr().err
