"""Progress for a person: phases, ETA, the plain progress line, and where it goes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rredcot.common.config import load_config
from rredcot.launch.observe import monitor as mon
from rredcot.launch.observe.monitor import Phases, Progress, eta_s, eval_progress, fmt_duration, progress_line


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(mon.time, "monotonic", c)
    return c


def test_phases_add_up_to_the_elapsed_time(clock: Clock) -> None:
    phases = Phases()
    clock.now += 30
    phases.enter("evaluation (before training)")
    clock.now += 60
    phases.enter("training")
    clock.now += 100
    assert phases.closed() == {"start-up": 30, "evaluation (before training)": 60, "training": 100}
    assert phases.elapsed() == 190 and phases.in_phase() == 100
    assert phases.seconds == {"start-up": 30, "evaluation (before training)": 60}  # closed() changes nothing


def test_eta_hand_computed(clock: Clock) -> None:
    phases = Phases()
    phases.enter("training")
    clock.now += 90  # the workers' start-up and the first step: not the rate
    phases.first_step_at, phases.first_step = clock.now, 1
    clock.now += 75  # steps 2, 3, 4 in 75 s → 16 × 25 s left, then one 60 s evaluation
    assert eta_s(phases, 4, 20, None, evals_left=1, eval_s=60.0) == pytest.approx(16 * 25 + 60)
    assert eta_s(phases, 4, 20, None, evals_left=0, eval_s=None) == pytest.approx(400)
    assert eta_s(phases, 1, 20, None, evals_left=1, eval_s=60.0) is None  # no rate yet
    assert eta_s(phases, 4, 20, None, evals_left=1, eval_s=None) is None  # the final evaluation's length unknown


def test_eta_after_a_resume_counts_only_the_steps_trained_since(clock: Clock) -> None:
    """Resumed at step 600 of 1000: 10 steps in 600 s since is 60 s a step, not 600 s ÷ 609 steps."""
    phases = Phases()
    phases.enter("training")
    phases.first_step_at, phases.first_step = clock.now, 600
    clock.now += 600
    assert eta_s(phases, 610, 1000, None, evals_left=0, eval_s=None) == pytest.approx(390 * 60)
    assert eta_s(phases, 600, 1000, None, evals_left=0, eval_s=None) is None  # no step trained since yet


def test_the_rate_starts_in_training_at_the_step_then_seen(clock: Clock) -> None:
    """A resumed run's learner hash says step 600 during the evaluation before training: the clock
    starts only in training, at the step seen then."""
    cfg = load_config("tests", ["logging.progress=false"])
    phases = Phases()
    progress = Progress(cfg, phases, tty=False)
    seen = type("M", (), {"last": {}, "step": 600, "evals": []})()
    phases.enter("evaluation (before training)")
    progress.update(seen, {}, evals_left=1)
    assert phases.first_step_at is None
    phases.enter("training")
    seen.step = 601
    progress.update(seen, {}, evals_left=1)
    assert phases.first_step == 601 and phases.first_step_at == clock.now


def test_eta_during_the_final_evaluation(clock: Clock) -> None:
    phases = Phases()
    phases.enter("final evaluation")
    clock.now += 30  # 96 of 288 samples in 30 s → 60 s left
    assert eta_s(phases, 20, 20, (96, 288), evals_left=0, eval_s=None) == pytest.approx(60)
    assert eta_s(phases, 20, 20, (0, 288), evals_left=0, eval_s=None) is None


@pytest.mark.parametrize(("seconds", "text"), [(None, "?"), (59.6, "1m00s"), (754, "12m34s"), (7260, "2h01m")])
def test_fmt_duration(seconds: float | None, text: str) -> None:
    assert fmt_duration(seconds) == text


SNAPS = {
    "gen0": {"tier": "generator", "tokens_per_s": 150.4},
    "red0": {"tier": "redistributor", "rollouts_per_s": 2.5},
    "learner0": {"tier": "learner", "step": 3.0, "reward_mean": 0.625, "step_time_s": 21.04},
    "eval": {"tier": "evaluator", "samples_done": 96.0, "samples_total": 288.0},
}


def test_progress_line_has_every_tier_the_queues_and_the_eta() -> None:
    line = progress_line("training", 125, SNAPS, {"rollouts": 2, "batches": 1}, 3, 20, 600)
    assert line == (
        "[2m05s] training step 3/20 | reward 0.62 | learner 21.0 s/step | gen 150 tok/s | "
        "red 2.50 samples/s | queues 2/1 | ETA 10m00s"
    )
    evaluating = progress_line("final evaluation", 10, SNAPS, {}, 20, 20, None)
    assert evaluating.startswith("[0m10s] final evaluation 96/288 samples") and evaluating.endswith("ETA ?")
    assert eval_progress({}) is None and eval_progress(SNAPS) == (96, 288)
    # a first run whose workers wait on a warm start says what is being built, not only "evaluation"
    waiting = progress_line("evaluation (before training)", 700, {}, {}, 0, 20, None, [("smollm2-135m-chain-a1", 650)])
    assert waiting.endswith("ETA ? | building smollm2-135m-chain-a1 (first use here, once): 10m50s so far")


def test_progress_line_shows_the_slowest_learner_rank() -> None:
    """The step shown is the slowest rank's (``Monitor.step``): its reward and step time go with it."""
    ranks = {
        "learner1": {"tier": "learner", "step": 5.0, "reward_mean": 0.9, "step_time_s": 10.0},
        "learner0": {"tier": "learner", "step": 4.0, "reward_mean": 0.25, "step_time_s": 30.0},
    }
    assert progress_line("training", 60, ranks, {}, 4, 20, None).startswith(
        "[1m00s] training step 4/20 | reward 0.25 | learner 30.0 s/step"
    )


def test_plain_lines_every_interval_to_the_log(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config("tests", ["logging.progress_every_s=15"])

    class FakeMonitor:
        last, step, evals = SNAPS, 3, []

    progress = Progress(cfg, Phases(), tty=False)
    caplog.set_level(logging.INFO, logger="rredcot.progress")
    for _ in range(4):  # 0, 5, 10, 15 s: lines at 0 and 15
        progress.update(FakeMonitor(), {}, evals_left=1)
        clock.now += 5
    lines = [r for r in caplog.records if r.name == "rredcot.progress"]
    assert len(lines) == 2 and "step 3/20" not in lines[0].getMessage()
    assert all(r.console for r in lines)  # no terminal: the console gets the plain lines
    assert Progress(cfg, Phases(), tty=True).live is None  # tests.yaml has logging.progress=false


def test_the_monitor_writes_every_workers_numbers_as_tensorboard_scalars(tmp_path: Path) -> None:
    """TensorBoard's own writer (the driver imports no torch): each worker's numbers, one scalar series
    each, read back as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rredcot.launch.observe.monitor import Monitor

    class Control:
        n = 0

        def all_metrics(self) -> dict:
            self.n += 1
            return {"learner0": {"tier": "learner", "step": float(self.n), "loss": 0.5 / self.n}}

    monitor = Monitor(load_config("tests"), Control(), tmp_path / "tb", {})
    for _ in range(3):
        monitor.poll()
    monitor.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    loss = [(e.step, float(e.tensor_proto.float_val[0])) for e in events.Tensors("learner/learner0/loss")]
    assert loss == [(1, 0.5), (2, 0.25), (3, pytest.approx(0.5 / 3))]
