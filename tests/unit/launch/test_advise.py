"""The split advisor: its queueing model, its search and its rates, checked by hand."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from rredcot.common.config import load_config, to_dict
from rredcot.launch.advise import Gpu, Rates, Split, Workload, advise, measured_rates, paper_rates, predict, splits
from rredcot.launch.cli import main
from tests.unit.launch.test_timeline import pipeline_waiting_for_generation


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


def test_rates_measured_from_a_runs_own_counters():
    """The timeline's pipeline over 10 s: the generator made 8 samples in 10 s of work (never waiting),
    the redistributor scored 8 in 2 s, the learner consumed 6 in its 4 s of work (10 s less 6 waiting)."""
    history = pipeline_waiting_for_generation()
    for p, count in zip(history, [0, 0, 0, 8, 8, 6]):
        key = {"generator": "samples", "redistributor": "rollouts", "learner": "samples_consumed"}[p["tier"]]
        p["values"][key] = float(count)
    cfg = to_dict(load_config("tests", ["staleness.eta=1"]))
    rates, own, measured = measured_rates(history, cfg)
    assert rates == Rates(generator=0.8, redistributor=4.0, learner=1.5, overlap=True)
    assert own == Split(1, 1, 1) and measured == pytest.approx(0.6)
    assert predict(own, rates).bound == "generator"


def test_paper_rates_by_hand():
    """1e9 parameters, 2 layers, 4 heads of 2 (1 KV head), 100 + 100 tokens, on a toy GPU."""
    gpu = Gpu(flops=1e15, bandwidth=1e12, memory=10e9, train_mfu=0.5, prefill_mfu=0.5, decode_efficiency=1.0)
    r = paper_rates(Workload(1e9, 2, 4, 1, 2, 100, 100, scored_tokens=200), gpu)
    kv = 2 * 2 * 1 * 2 * 2  # bytes a token
    batch = (9e9 - 2e9) / (kv * 200)
    step = (2e9 + batch * kv * 150) / 1e12
    forward = 2e9 + 4 * 2 * 4 * 2 * 100  # FLOPs a token
    assert r.generator == pytest.approx(batch / step / 100)
    assert r.redistributor == pytest.approx(0.5e15 / (forward * 400))
    assert r.learner == pytest.approx(0.5e15 / (3 * forward * 200))


def test_advise_command_on_a_run_and_on_paper(tmp_path, capsys):
    (tmp_path / "report").mkdir()
    history = pipeline_waiting_for_generation()
    for p, count in zip(history, [0, 0, 0, 8, 8, 6]):
        key = {"generator": "samples", "redistributor": "rollouts", "learner": "samples_consumed"}[p["tier"]]
        p["values"][key] = float(count)
    (tmp_path / "report" / "metrics.jsonl").write_text("".join(json.dumps(p) + "\n" for p in history))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(load_config("tests"))))
    assert main(["advise", str(tmp_path), "--total", "5"]) == 0
    out = capsys.readouterr().out
    assert "generator 0.8, redistributor 4, learner 1.5" in out
    assert out.splitlines()[2].startswith("2:1:2 ") and "1:1:1 (this run)" in out
    assert "this run measured 0.6 samples/s; the model predicts 0.8 for its split" in out
    assert (
        main(["advise", "--params", "4e9", "--layers", "36", "--heads", "32", "--kv-heads", "8", "--total", "8"]) == 0
    )
    assert "per GPU samples/s" in capsys.readouterr().out
    assert main(["advise", str(tmp_path / "nothing")]) == 2
