"""Watching a run: worker metrics → history, TensorBoard/W&B, and the progress a person sees.

``Monitor`` polls every worker's metrics hash and keeps the history the report plots. ``Progress``
shows where the run is: on a terminal a live table (with the ETA and the evaluation's progress),
elsewhere (a log file, CI, ``nohup``) one plain line every ``logging.progress_every_s`` seconds; the plain line
also goes to the run's log file in both cases.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rredcot.common.config import Config
from rredcot.common.control import RunControl
from rredcot.common.ledger import Balance
from rredcot.common.streams import BATCHES, ROLLOUTS
from rredcot.launch.observe.logs import WriteFailures
from rredcot.models.store import builds_under_way

log = logging.getLogger("rredcot.progress")


class Monitor:
    """Polls worker metrics and queue depths; keeps history; logs to TensorBoard / W&B."""

    def __init__(
        self,
        cfg: Config,
        control: RunControl,
        tb_dir: Path,
        wandb_config: dict[str, Any],
        history_file: Path | None = None,
    ) -> None:
        self.control = control
        self.history: list[dict[str, Any]] = []
        # every history point, as it comes, one JSON object a line: `rredcot report RUN` redraws from it
        self._history_file = None if history_file is None else open(history_file, "a", buffering=1)  # noqa: SIM115
        self._history_path, self._tb_dir = history_file, tb_dir
        self.write_failures = WriteFailures(logging.getLogger("rredcot").warning)  # a full disk: one line each
        self.evals: list[dict[str, Any]] = []
        self.last: dict[str, dict[str, Any]] = {}  # the latest snapshot of every worker
        self._last_step: dict[str, float] = {}
        self.step = 0  # the slowest learner rank's step at the last poll
        self.version = 0  # and the weights version it trained to
        self.writer = self.wandb = None
        if cfg.logging.tensorboard:
            from tensorboard.summary import Writer  # TensorBoard's own: the driver needs no torch

            self.writer = Writer(str(tb_dir))
        if cfg.logging.wandb:
            import wandb

            self.wandb = wandb.init(
                project=cfg.logging.wandb_project, name=cfg.run.name, dir=str(tb_dir.parent), config=wandb_config
            )

    def poll(self) -> dict[str, dict[str, Any]]:
        snaps = self.control.all_metrics()
        self.last = snaps
        learners = [v for v in snaps.values() if v.get("tier") == "learner"]
        step = self.step = int(min((v.get("step", 0.0) for v in learners), default=0))
        self.version = int(min((v.get("version", 0.0) for v in learners), default=0))  # its newest weights
        now = time.time()
        for worker, values in snaps.items():
            nums = {k: v for k, v in values.items() if isinstance(v, float)}
            marker = nums.get("step", nums.get("groups", nums.get("finished_groups", nums.get("samples_done", 0.0))))
            if self._last_step.get(worker) == marker:
                continue
            self._last_step[worker] = marker
            point = {"t": now, "tier": values.get("tier", "?"), "worker": worker, "step": step, "values": nums}
            self.history.append(point)
            if self._history_file is not None:
                try:
                    self._history_file.write(json.dumps(point) + "\n")
                except OSError as e:  # the history stays in memory for the report
                    self.write_failures.failed(self._history_path, e)
                else:
                    self.write_failures.succeeded(self._history_path)
            self._log({f"{values.get('tier', '?')}/{worker}/{k}": v for k, v in nums.items()}, step)
        return snaps

    def _log(self, scalars: dict[str, float], step: int) -> None:
        if self.writer is not None:
            try:
                for name, v in scalars.items():
                    self.writer.add_scalar(name, v, step)
            except OSError as e:
                self.write_failures.failed(self._tb_dir, e)
            else:
                self.write_failures.succeeded(self._tb_dir)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def add_eval(self, result: dict[str, Any], step: int) -> None:
        result = {**result, "step": step}
        self.evals.append(result)
        scalars = {f"eval/{name}_accuracy": result[name] for name in ("sampled", "greedy")}
        train = result.get("train")
        if train:
            scalars |= {f"eval/train_{name}_accuracy": train[name] for name in ("sampled", "greedy")}
        self._log(scalars, step)
        logging.getLogger("rredcot").info(
            "eval at step %d: sampled %.3f [%.3f, %.3f], greedy %.3f%s (%.0f s)",
            step,
            result["sampled"],
            result["sampled_low"],
            result["sampled_high"],
            result["greedy"],
            f"; training problems sampled {train['sampled']:.3f}, greedy {train['greedy']:.3f}" if train else "",
            result["seconds"] + (train["seconds"] if train else 0.0),
        )

    def add_ledger(self, balance: Balance) -> None:
        """The run's ledger at its end: outcome counts, and each outcome's groups per length bucket."""
        counts = {o: getattr(balance, o) for o in ("admitted", "trained", "dead", "rejected", "in_flight")}
        per_length = {f"{o}_{b}": n for o, buckets in balance.by_length.items() for b, n in buckets.items()}
        self._log(
            {f"ledger/{k}": float(v) for k, v in (counts | per_length | {"missing": len(balance.missing)}).items()},
            self.step,
        )

    def close(self) -> None:
        if self._history_file is not None:
            self._history_file.close()
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


@dataclass
class Phases:
    """Wall seconds per phase of the run (start-up, evaluations, training, report), in order."""

    current: str = "start-up"
    seconds: dict[str, float] = field(default_factory=dict)
    first_step_at: float | None = None  # when training was first seen past a step (the rate's start)
    first_step: int = 0  # that step: a resumed run starts past its checkpoint's
    _since: float = field(default_factory=lambda: time.monotonic())
    _started: float = field(default_factory=lambda: time.monotonic())

    def enter(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[self.current] = self.seconds.get(self.current, 0.0) + now - self._since
        self.current, self._since = phase, now

    def in_phase(self) -> float:
        return time.monotonic() - self._since

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def closed(self) -> dict[str, float]:
        """Every phase's seconds, the current one counted up to now."""
        out = dict(self.seconds)
        out[self.current] = out.get(self.current, 0.0) + self.in_phase()
        return out


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def eval_progress(snaps: dict[str, dict[str, Any]]) -> tuple[int, int] | None:
    ev = snaps.get("eval")
    if not ev or not ev.get("samples_total"):
        return None
    return int(ev.get("samples_done", 0)), int(ev["samples_total"])


def eta_s(
    phases: Phases, step: int, steps: int, evaluating: tuple[int, int] | None, evals_left: int, eval_s: float | None
) -> float | None:
    """Seconds left: the rest of this evaluation, the remaining steps at the rate so far, and the
    evaluations still to come (each as long as the first); None until there is a rate to go by."""
    left = 0.0
    if evaluating is not None:
        done, total = evaluating
        if done == 0:
            return None
        left += phases.in_phase() * (total - done) / done
    if step < steps:
        if phases.first_step_at is None or step <= phases.first_step:
            return None
        # the rate since the first step seen in training: the workers' start-up (and on a resume the
        # steps before it) are behind us, not ahead
        left += (steps - step) * (time.monotonic() - phases.first_step_at) / (step - phases.first_step)
    if evals_left:
        if eval_s is None:
            return None
        left += evals_left * eval_s
    return left


def progress_line(
    phase: str,
    elapsed: float,
    snaps: dict[str, dict[str, Any]],
    depths: dict[str, int],
    step: int,
    steps: int,
    eta: float | None,
    building: Sequence[tuple[str, float]] = (),
) -> str:
    """One plain line: phase, step, reward, throughput per tier, queue depths, ETA; and the builtin
    models being built on this machine (``building``: name, seconds so far), which the workers wait on."""
    parts = [f"[{fmt_duration(elapsed)}] {phase}"]
    evaluating = eval_progress(snaps) if "evaluation" in phase else None
    if evaluating is not None:
        parts[0] += f" {evaluating[0]}/{evaluating[1]} samples"
    else:
        parts[0] += f" step {step}/{steps}"
    tiers: dict[str, list[dict[str, Any]]] = {}
    for v in snaps.values():
        tiers.setdefault(str(v.get("tier", "?")), []).append(v)
    if learners := tiers.get("learner", []):
        lr = min(learners, key=lambda v: v.get("step", 0.0))  # the slowest rank, whose step the line shows
        parts.append(f"reward {lr.get('reward_mean', float('nan')):.2f}")
        parts.append(f"learner {lr.get('step_time_s', float('nan')):.1f} s/step")
    if tiers.get("generator"):
        parts.append(f"gen {sum(v.get('tokens_per_s', 0.0) for v in tiers['generator']):.0f} tok/s")
    if tiers.get("redistributor"):
        parts.append(f"red {sum(v.get('rollouts_per_s', 0.0) for v in tiers['redistributor']):.2f} samples/s")
    if depths:
        parts.append(f"queues {depths.get(ROLLOUTS, 0)}/{depths.get(BATCHES, 0)}")
    parts.append(f"ETA {fmt_duration(eta)}")
    parts += [f"building {name} (first use here, once): {fmt_duration(s)} so far" for name, s in building]
    return " | ".join(parts)


def display_table(
    snaps: dict[str, dict[str, Any]], depths: dict[str, int], evals: list[dict[str, Any]], steps: int, status: str
) -> Any:
    """The live table of every worker (terminal only); ``status`` is the caption's first line."""
    from rich.table import Table

    table = Table(title="rredcot", expand=False)
    for col in ("worker", "tier", "progress", "rate", "reward / loss", "waiting"):
        table.add_column(col)
    for worker, v in sorted(snaps.items()):
        tier = v.get("tier", "?")
        if tier == "learner":
            progress = f"step {v.get('step', 0):.0f}/{steps} v{v.get('version', 0):.0f}"
            rate = f"{v.get('tokens_per_s', 0):.0f} tok/s"
            quality = f"R {v.get('reward_mean', float('nan')):.3f}  loss {v.get('loss', float('nan')):.4f}"
            waiting = f"idle {v.get('idle_frac', 0):.0%}"
        elif tier == "generator":
            progress = f"{v.get('finished_groups', 0):.0f} groups v{v.get('version', 0):.0f}"
            rate = f"{v.get('tokens_per_s', 0):.0f} tok/s"
            quality = f"R {v.get('reward_mean', float('nan')):.3f}"
            waiting = f"stale {v.get('blocked_staleness_s', 0):.0f}s  bp {v.get('blocked_backpressure_s', 0):.0f}s"
        elif tier == "evaluator":
            progress = f"{v.get('samples_done', 0):.0f}/{v.get('samples_total', 0):.0f} samples"
            rate = quality = waiting = ""
        else:
            progress = f"{v.get('groups', 0):.0f} groups"
            rate = f"{v.get('rollouts_per_s', 0):.2f} samples/s"
            quality = f"dead {v.get('dead_letters', 0):.0f}"
            waiting = f"lag {v.get('queue_lag_s', 0):.1f}s"
        table.add_row(worker, str(tier), progress, rate, quality, waiting)
    ev = f"held-out sampled acc {evals[-1]['sampled']:.3f} (step {evals[-1]['step']})" if evals else "no eval yet"
    table.caption = f"{status}\nqueues: rollouts {depths.get(ROLLOUTS, 0)}, batches {depths.get(BATCHES, 0)}  |  {ev}"
    return table


class Progress:
    """The run's progress for a person: a live table on a terminal, plain lines elsewhere."""

    def __init__(self, cfg: Config, phases: Phases, tty: bool | None = None) -> None:
        self.cfg, self.phases, self.interval_s = cfg, phases, cfg.logging.progress_every_s
        self.tty = sys.stdout.isatty() if tty is None else tty
        self.live: Any = None
        self._last_line = 0.0
        if self.tty and cfg.logging.progress:
            from rich.live import Live

            self.live = Live(refresh_per_second=2, transient=False)
            self.live.start()

    def update(self, monitor: Monitor, depths: dict[str, int], evals_left: int, force: bool = False) -> None:
        snaps, steps = monitor.last, self.cfg.run.steps
        if monitor.step >= 1 and self.phases.first_step_at is None and self.phases.current == "training":
            self.phases.first_step_at, self.phases.first_step = time.monotonic(), monitor.step
        evaluating = eval_progress(snaps) if "evaluation" in self.phases.current else None
        first_eval = monitor.evals[0]["seconds"] if monitor.evals else None
        eta = eta_s(self.phases, monitor.step, steps, evaluating, evals_left, first_eval)
        # a builtin model is built as the workers start: its locks are probed only before the first step
        building = builds_under_way() if monitor.step == 0 else []
        phase, elapsed = self.phases.current, self.phases.elapsed()
        line = progress_line(phase, elapsed, snaps, depths, monitor.step, steps, eta, building)
        now = time.monotonic()
        if force or now - self._last_line >= self.interval_s:
            self._last_line = now
            # plain lines: the console when it is no terminal (else the live table), the log file always
            log.info(line, extra={"console": not self.tty})
        if self.live is not None:
            self.live.update(display_table(snaps, depths, monitor.evals, steps, line))

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
