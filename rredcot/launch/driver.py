"""``rredcot train``: start services, place the three tiers on Ray, watch the run, write the report.

Order: the doctor's checks (``launch.checks.doctor.preflight``: paths, the dataset's first rows, Redis and
Ray reachable, cores) → one line saying what starts (services, dtype, expected duration) → Ray (local unless
``cluster.address``) and the resource plan check (before any actor starts) → Redis (embedded when
``redis.url`` is unset) → placement group, one bundle per worker (and the evaluator's, when it has
GPUs) → held-out evaluation of the starting model → generator, redistributor and learner actors →
progress until the learner has taken ``run.steps`` steps → stop flag → final evaluation → report
(``summary.md`` and ``summary.json``). On SIGTERM or Ctrl-C the workers are asked to stop, the
learner checkpoints, and the report is written, all within ``STOP_GRACE_S`` + a few seconds. Every
exit path removes what this run started and nothing else: its actors, its placement group, Ray only
if it started it, its Redis server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rredcot.common.config import Config, redacted, to_dict, to_yaml
from rredcot.common.control import RunControl
from rredcot.common.files import write_text_atomic
from rredcot.common.ledger import Balance, balance_now
from rredcot.common.run_uid import dir_uid, publish_uid
from rredcot.common.streams import connect
from rredcot.launch.checks.cluster import check_nodes, wait_for_placement
from rredcot.launch.checks.doctor import preflight
from rredcot.launch.interrupts import (
    catch_interrupts,
    hurried,
    raise_if_interrupted,
    raise_interrupt,
    received,
    stopping,
)
from rredcot.launch.leftovers import end_leftovers, record_session
from rredcot.launch.local_ray import init_ray, local_ray_env
from rredcot.launch.observe.gather import gather
from rredcot.launch.observe.logs import WorkerFailed, headline, setup_driver_logging, tail
from rredcot.launch.observe.monitor import Monitor, Phases, Progress, fmt_duration
from rredcot.launch.observe.opening import opening_lines
from rredcot.launch.observe.report import HISTORY_FILE, RunOutcome, write_report
from rredcot.launch.observe.run_times import record_seconds
from rredcot.launch.plan import Tier, bundles, evaluator_options, evaluator_tier, write_placement
from rredcot.launch.run_dir import claim_run_dir, clear_run_dir, clear_run_keys
from rredcot.launch.run_lock import NameLease, hold_name
from rredcot.launch.run_lock import hold as hold_run_lock
from rredcot.launch.services import EmbeddedRedis, embedded_redis, embedded_redis_line
from rredcot.launch.stages import stage_env
from rredcot.launch.supervisor import StageActors
from rredcot.launch.watch import Watch
from rredcot.transports import deployment

log = logging.getLogger(__name__)

UNTRAINED = "failed: ledger: "  # the status of a run that took all its steps without training every group
STOP_GRACE_S = 18.0  # on SIGTERM / Ctrl-C: how long the learner gets to finish its step and checkpoint


def _with_redis_url(cfg: Config, url: str) -> Config:
    return dataclasses.replace(cfg, redis=dataclasses.replace(cfg.redis, url=url))


def train(cfg: Config, verbose: bool = False) -> Path:
    """Run the whole pipeline; returns the report directory."""
    run_dir = Path(cfg.run.dir).resolve()
    warnings = preflight(cfg)  # paths, data, services, cores: a PreflightError before anything starts
    phases = Phases()
    outcome = RunOutcome(status="failed", phases=phases)
    received.clear()
    with contextlib.ExitStack() as stack:
        # a live run of this name in the same Redis, whatever its run.dir: refused before anything is touched
        lease = stack.enter_context(hold_name(cfg.redis.url, cfg.run.name, run_dir)) if cfg.redis.url else None
        claim_run_dir(run_dir, cfg.run.name, cfg.run.resume)
        stack.callback(hold_run_lock(run_dir, cfg.run.name))  # before anything in run_dir is touched
        uid = dir_uid(run_dir)  # names what the run holds on a machine (its /dev/shm slots)
        fresh = cfg.run.resume == "never"  # an earlier run's driver.log is overwritten
        stack.callback(setup_driver_logging(run_dir / "logs" / "driver.log", verbose, append=not fresh))
        for line in opening_lines(cfg, run_dir):
            log.info(line)
        end_leftovers(run_dir)  # the Ray processes of an earlier driver of this run that was killed
        for warning in warnings:
            log.warning(warning.line())
        try:
            _run(cfg, run_dir, phases, outcome, stack, uid, lease)
        except KeyboardInterrupt as e:
            outcome.status = f"interrupted ({received[-1] if received else str(e) or 'SIGINT'})"
            log.warning("stopping: %s; the learner checkpoints and the report is written", outcome.status)
            with stopping():
                _stop(outcome)
            raise  # after the report and the teardown: the command exits with 130
        except BaseException as e:
            # one line: a failed worker names itself and its log; any other error its type and first line
            outcome.status = (
                f"failed: {e}" if isinstance(e, WorkerFailed) else f"failed: {type(e).__name__}: {headline(e)}"
            )
            log.error("the run failed", exc_info=True, extra={"console": False})  # the traceback, in driver.log
            with stopping():
                _stop(outcome)
            raise
        finally:
            with stopping():
                _finish(cfg, run_dir, outcome, phases)
    if outcome.status == "finished":
        record_seconds(cfg, phases.elapsed())
    elif outcome.status.startswith(UNTRAINED):  # after the report, which says the same: exit 1 with the line
        raise LedgerError(outcome.status.removeprefix("failed: "))
    return run_dir / "report"


def _finish(cfg: Config, run_dir: Path, outcome: RunOutcome, phases: Phases) -> None:
    """Close the ledger and write the report, whatever ended the run."""
    if outcome.control is not None:
        _close_ledger(outcome)
        if (status := final_status(outcome.status, outcome.ledger)) != outcome.status:
            log.error("the run took all its steps, but not every admitted group: %s", outcome.ledger.untrained())
            outcome.status = status
    if outcome.monitor is None:  # stopped before anything ran
        return
    if outcome.apart:  # what workers wrote on nodes without the shared run.dir: the report reads it
        phases.enter("copying files from nodes")
        try:
            gather(run_dir, outcome.apart)
        except Exception:  # noqa: BLE001 - Ray gone with a failed run: the report still comes
            log.exception("could not copy the files of nodes without the shared run.dir to the head")
    phases.enter("report")
    try:
        artefacts = write_report(outcome.cfg or cfg, run_dir, outcome)
    except Exception:  # noqa: BLE001 - never hide the run's own outcome behind a report error
        log.exception("could not write the report")
        artefacts = {}
    word, _, why = outcome.status.partition(": ")  # "failed: gen0: …" -> failed (gen0: …)
    log.info(
        "run %s after %s%s: report in %s (%s)",
        word,
        fmt_duration(phases.elapsed()),
        f" ({why})" if why else "",
        run_dir / "report",
        ", ".join(artefacts),
    )


def final_status(status: str, ledger: Balance | None) -> str:
    """A run that took all its steps is ``finished`` only if every group it admitted ended trained,
    dead-lettered or rejected, once: one still in flight at its end (a resumed run that trained a
    copy in its place), missing, or in two outcomes makes it a failure that says what is left."""
    if status != "finished" or ledger is None or not (why := ledger.untrained()):
        return status
    return f"{UNTRAINED}{why}: every admitted group must be trained once (docs/reliability.md, The ledger)"


class LedgerError(RuntimeError):
    """The run took all its steps but did not train every group it admitted (``final_status``)."""


def _close_ledger(outcome: RunOutcome) -> None:
    """The run's ledger at its end: logged (a warning naming the missing groups if it does not
    balance), on TensorBoard and in the report."""
    try:
        outcome.ledger = balance_now(outcome.control.client, outcome.control.run_id)
    except Exception as e:  # noqa: BLE001 - e.g. Redis gone with a failed run: the report says the rest
        log.warning("no ledger: %s: %s", type(e).__name__, e)
        return
    (log.info if outcome.ledger.balanced else log.warning)("ledger: %s", outcome.ledger.line())
    if outcome.monitor is not None:
        outcome.monitor.add_ledger(outcome.ledger)


def lead_own_process_group(cfg: Config) -> None:
    """``rredcot train`` not run from a terminal: lead a process group of its own, so that a signal
    aimed at the launcher's group (``timeout``, ``kill -- -PGID``) reaches the driver but not the
    local Ray's daemons, which then stay up while the driver stops the run in order. On a terminal
    nothing changes, so that Ctrl-C still reaches the driver."""
    if not sys.stdin.isatty() and not cfg.cluster.address:
        with contextlib.suppress(OSError):
            os.setpgrp()


def _run(
    cfg: Config,
    run_dir: Path,
    phases: Phases,
    outcome: RunOutcome,
    stack: contextlib.ExitStack,
    uid: str,
    lease: NameLease | None,
) -> None:
    """The run's story: Ray up and its nodes checked, the run's folder and Redis ready, the workers
    placed and started, the starting model evaluated while they load, training to the learner's last
    step, the final evaluation. Whatever is started is undone by ``stack`` in reverse order."""
    _start_ray(cfg, run_dir, stack, uid)
    nodes = _check_nodes(cfg, run_dir, outcome)
    cfg, server = _start_services(cfg, run_dir, nodes, stack)
    outcome.cfg = cfg
    client = connect(cfg.redis.url)
    control = outcome.control = _fresh_control(cfg, client, uid)
    monitor = outcome.monitor = Monitor(
        cfg, control, run_dir / "tensorboard", to_dict(redacted(cfg)), run_dir / "report" / HISTORY_FILE
    )
    stack.callback(monitor.close)
    progress = Progress(cfg, phases)
    stack.callback(progress.close)
    watch = Watch(cfg, monitor, progress, client, server, lease)
    pg, plan, eval_tier = _place(cfg, run_dir, stack)

    # The workers start (imports, model loading, engine and DeepSpeed set-up: a minute or more on a
    # small CPU) while the starting model is evaluated; their run() is only called after it.
    deployment(cfg).reset(client, cfg.run.name)  # e.g. generators must not join an earlier learner's weight group
    actors = StageActors(cfg, pg, plan, control, stack, outcome.refs)
    actors.start()
    evaluator = _start_evaluator(cfg, pg, len(plan), eval_tier, stack)
    if evaluator is not None:
        phases.enter("evaluation (before training)")
        before = watch.wait(evaluator.evaluate_latest.remote(), evals_left=1)
        monitor.add_eval(before, monitor.step)  # 0, or the step a resumed run restarts from
    actors.run()
    phases.enter("training")
    watch.training(
        actors,
        next_eval=cfg.logging.eval_every if evaluator is not None else 0,
        evaluate=None if evaluator is None else evaluator.evaluate_latest.remote,
    )

    control.request_stop("learner finished")
    _wait_for_workers(outcome)
    monitor.poll()
    if evaluator is not None and monitor.evals[-1]["step"] != monitor.step:
        phases.enter("final evaluation")
        monitor.add_eval(watch.wait(evaluator.evaluate_latest.remote(monitor.version), evals_left=0), monitor.step)
    outcome.status = "finished"


def _start_ray(cfg: Config, run_dir: Path, stack: contextlib.ExitStack, uid: str) -> None:
    """Ray up (a local one unless ``cluster.address``), with what must outlive its shutdown."""
    local_ray_env(cfg)  # before the first import of ray
    # Ctrl-C while ray.init starts the local Ray can be swallowed inside it (seen under load: the
    # run went on to the end); ours records the signal, so that the run stops as soon as it returns
    catch_interrupts(stack)
    stack.callback(_say_left_behind, cfg, uid)  # after Ray's shutdown: what a failed learner left (ipc: /dev/shm)
    stack.callback(end_leftovers, run_dir, after_own_stop=True)  # after Ray's shutdown: what outlived it
    session = init_ray(cfg, stack)
    raise_if_interrupted()
    # after ray.init, which installs its own SIGTERM handler: ours tears the run down cleanly
    stack.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, raise_interrupt))
    if session is not None:  # a local Ray of the run's own: a later start ends what a killed driver left
        record_session(run_dir, session)


def _check_nodes(cfg: Config, run_dir: Path, outcome: RunOutcome) -> int:
    """The plan against the cluster and each node's free resources; on several nodes run.dir, the
    code, the network and /dev/shm on each: fails before any actor starts. Returns how many nodes are up."""
    found = check_nodes(cfg, run_dir)
    outcome.apart = found.apart  # nodes without the shared run.dir: the report gathers their files
    for warning in found.checks:
        log.warning("%s -> %s", warning.found, warning.fix)
    return found.nodes


def _start_services(
    cfg: Config, run_dir: Path, nodes: int, stack: contextlib.ExitStack
) -> tuple[Config, EmbeddedRedis | None]:
    """The run's folder (emptied for a fresh run) and its Redis (embedded when ``redis.url`` is
    unset); returns the config naming its Redis, as written to ``config.yaml``, and the embedded server."""
    server = None
    if cfg.run.resume == "never":
        clear_run_dir(run_dir, keep=run_dir / "logs" / "driver.log")
    (run_dir / "report").mkdir(parents=True, exist_ok=True)
    if not cfg.redis.url:
        server = stack.enter_context(embedded_redis(cfg, run_dir, nodes))
        raise_if_interrupted()  # a signal while redis-server was forked
        cfg = _with_redis_url(cfg, server.url)
        log.info("embedded Redis at %s", embedded_redis_line(server.url, cfg.redis.password))
    write_text_atomic(run_dir / "config.yaml", to_yaml(redacted(cfg)))  # polled for by tools and tests
    return cfg, server


def _fresh_control(cfg: Config, client: Any, uid: str) -> RunControl:
    """The run's control in Redis: a fresh run's keys cleared, its uid published (the learner names
    its /dev/shm slots by it), no stop flag left from an earlier start."""
    if cfg.run.resume == "never":
        clear_run_keys(client, cfg.run.name)
    publish_uid(client, cfg.run.name, uid)
    control = RunControl(client, cfg.run.name)
    control.clear_stop()
    return control


def _place(
    cfg: Config, run_dir: Path, stack: contextlib.ExitStack
) -> tuple[Any, list[tuple[str, int, dict[str, float]]], Tier | None]:
    """One placement-group bundle per worker (and the evaluator's, when it has its own resources),
    placed or failing with what is missing; where each landed in ``placement.json``. Returns the
    group, the workers' plan and the evaluator's tier."""
    from ray.util.placement_group import placement_group, remove_placement_group

    plan, eval_tier = bundles(cfg), evaluator_tier(cfg)
    extra = [eval_tier.bundle()] if eval_tier else []
    pg = placement_group([b for _, _, b in plan] + extra, strategy=cfg.cluster.placement.upper())
    wait_for_placement(cfg, pg)
    stack.callback(remove_placement_group, pg)
    write_placement(pg, plan + [("evaluator", 0, b) for b in extra], run_dir / "placement.json")
    return pg, plan, eval_tier


def _start_evaluator(cfg: Config, pg: Any, index: int, tier: Tier | None, stack: contextlib.ExitStack) -> Any:
    """The held-out evaluator's actor (bundle ``index`` when it has one), or None without ``data.eval_size``."""
    if not cfg.data.eval_size:
        return None
    import ray

    from rredcot.launch.evaluate import Evaluator

    options = evaluator_options(cfg, pg, index, tier)
    evaluator = ray.remote(Evaluator).options(**options).remote(to_dict(cfg), stage_env(cfg, "evaluator"))
    stack.callback(ray.kill, evaluator)
    return evaluator


def _wait_for_workers(outcome: RunOutcome) -> None:
    """Up to a minute for every worker's run() to return after the stop flag."""
    import ray

    ray.wait(list(outcome.refs), num_returns=len(outcome.refs), timeout=60)


def _say_left_behind(cfg: Config, uid: str) -> None:
    """Say what a killed or failed learner's weight transport left on this node outside ``run.dir``
    (``ipc``: its slots in ``/dev/shm``), kept for a resumed run, and how to free it."""
    if left := deployment(cfg).left_behind(cfg.run.name, uid):
        mib = sum(p.stat().st_size for p in left) / 2**20
        log.warning(
            "the learner's weights stay in %s (%.0f MiB) for run.resume=auto, whose generators start from them; "
            "free them with: rm %s",
            ", ".join(sorted({str(p.parent) for p in left})),
            mib,
            " ".join(map(str, left)),
        )


def _stop(outcome: RunOutcome) -> None:
    """Ask every worker to stop and give the learner ``STOP_GRACE_S`` to checkpoint; say where a
    failed worker's log is."""
    import ray

    if outcome.control is None:
        return
    try:
        outcome.control.request_stop(outcome.status)
        learners = [r for r, (tier, _) in outcome.refs.items() if tier == "learner"]
        done: list[Any] = []
        deadline = time.monotonic() + STOP_GRACE_S
        while learners and len(done) < len(learners) and time.monotonic() < deadline and not hurried.is_set():
            done, _ = ray.wait(learners, num_returns=len(learners), timeout=0.5)  # a second Ctrl-C: stop waiting
        outcome.learner_stopped = bool(learners) and len(done) == len(learners)
        for r in done:
            with contextlib.suppress(Exception):
                ray.get(r, timeout=1)
        if outcome.monitor is not None:
            outcome.monitor.poll()
    except Exception as e:  # noqa: BLE001 - Redis or Ray already gone: report what the driver has
        log.warning("could not stop the workers in order (%s: %s)", type(e).__name__, e)
    if outcome.status.startswith("failed") and outcome.cfg is not None:
        logs = Path(outcome.cfg.run.dir).resolve() / "logs"
        for path in sorted(logs.glob("*.log")):
            if path.name != "driver.log" and "Error" in (end := tail(path, 15)):
                log.error("%s ended with an error: see its end in %s", path.stem, logs / "driver.log")
                log.error("the end of %s:\n%s", path, end, extra={"console": False})
