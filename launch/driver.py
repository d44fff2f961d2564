"""``rredcot train``: start services, place the three tiers on Ray, watch the run, write the report.

Order: the doctor's checks (``launch.doctor.preflight``: paths, the dataset's first rows, Redis and
Ray reachable, cores) → one line saying what starts (services, dtype, expected duration) → Ray (local unless
``cluster.address``) and the resource plan check (before any actor starts) → Redis (embedded when
``redis.url`` is unset) → placement group, one bundle per worker (and the evaluator's, when it has
GPUs) → held-out evaluation of the
starting model → generator, redistributor and learner actors → progress until the learner has
taken ``run.steps`` steps → stop flag → final evaluation → report (``summary.md`` and
``summary.json``). On SIGTERM or Ctrl-C the workers are asked to stop, the learner checkpoints,
and the report is written, all within ``STOP_GRACE_S`` + a few seconds. Every exit path removes
what this run started and nothing else: its actors, its placement group, Ray only if it started
it, its Redis server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rredcot.common.config import Config, ConfigError, redact_url, redacted, to_dict, to_yaml
from rredcot.common.control import RunControl
from rredcot.common.files import write_text_atomic
from rredcot.common.ledger import balance_now
from rredcot.common.precision import cpu_info, dtype_settings, planned_dtype
from rredcot.common.streams import BATCHES, ROLLOUTS, connect, key, registered_keys
from rredcot.common.weight_group import group_key
from rredcot.common.weight_slots import host_slots_left
from rredcot.launch.doctor import preflight
from rredcot.launch.interrupts import (
    catch_interrupts,
    hurried,
    raise_if_interrupted,
    raise_interrupt,
    received,
    stopping,
)
from rredcot.launch.leftovers import end_leftovers, record_session
from rredcot.launch.logs import (
    WorkerFailed,
    headline,
    route_library_loggers,
    route_ray_errors_to_log,
    setup_driver_logging,
    tail,
)
from rredcot.launch.monitor import Monitor, Phases, Progress, fmt_duration
from rredcot.launch.plan import Tier, bundles, check_plan, evaluator_tier, local_cores, local_ray_cpus
from rredcot.launch.report import RunOutcome, write_report
from rredcot.launch.run_lock import hold as hold_run_lock
from rredcot.launch.run_times import expected_seconds, record_seconds
from rredcot.launch.services import EmbeddedRedis
from rredcot.launch.stages import WORKER_PREFIX
from rredcot.launch.supervisor import StageActors

log = logging.getLogger(__name__)

STOP_GRACE_S = 18.0  # on SIGTERM / Ctrl-C: how long the learner gets to finish its step and checkpoint


def _with_redis_url(cfg: Config, url: str) -> Config:
    return dataclasses.replace(cfg, redis=dataclasses.replace(cfg.redis, url=url))


# what ``run.resume=never`` clears in a run directory that carries this run's marker
RUN_DIR_OUTPUTS = ("logs", "redis", "checkpoints", "weights", "traces", "tensorboard", "report", "placement.json")
RUN_MARKER = ".rredcot-run"  # written by rredcot into each run directory it creates: the run's name


class RunDirError(ConfigError):
    """A run directory this run may not clear: it holds files rredcot did not write for this run."""


def claim_run_dir(run_dir: Path, name: str, resume: str) -> None:
    """Create ``run_dir`` with this run's marker, or find the marker there.

    ``run.resume=never`` on a directory that has content but no marker naming ``name`` raises
    ``RunDirError`` (nothing is deleted); ``auto`` resumes from such a directory without marking it.
    """
    marker = run_dir / RUN_MARKER
    if marker.is_file() and marker.read_text().strip() == name:
        return
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        if resume == "never":
            raise RunDirError(
                f"run.dir {run_dir} is not empty and has no {RUN_MARKER} file naming run {name!r}, so "
                "run.resume=never will not clear it: pick another run.dir or run.name, or continue it "
                "with run.resume=auto"
            )
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(name + "\n")


def _clear_run_dir(run_dir: Path, keep: Path) -> None:
    """``run.resume=never`` starts afresh: list, then remove, what an earlier run of this name left
    in its (marked) directory; ``keep`` is the driver's new log file."""
    doomed: list[Path] = []
    for path in (run_dir / name for name in RUN_DIR_OUTPUTS):
        if path == keep.parent and path.is_dir() and not path.is_symlink():
            doomed += [p for p in sorted(path.iterdir()) if p != keep]
        elif path.exists() or path.is_symlink():
            doomed.append(path)
    if doomed:
        log.info("run.resume=never: deleting the earlier run's %s", ", ".join(map(str, doomed)))
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _clear_run_keys(client: Any, run_id: str) -> None:
    """``run.resume=never`` on a shared server: list, then delete, the keys an earlier run of this
    name registered (its streams, counters, metrics); nothing else."""
    names = registered_keys(client, run_id)
    if client.exists(names[-1]):  # the registry: an earlier run of this name wrote keys here
        log.info("run.resume=never: deleting the earlier run's Redis keys %s", ", ".join(names))
        client.delete(*names)


def local_ray_env(cfg: Config) -> None:
    """Before ``import ray``: a local Ray (no ``cluster.address``) listens on 127.0.0.1 only."""
    if not cfg.cluster.address:
        # Ray reads this when it is imported: with clusters "disabled" every Ray server of a local
        # instance (GCS, raylet, agents, workers) binds 127.0.0.1 instead of the node's network IP.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # If the local GCS dies first (a signal sent to the whole process group), give up on it in
        # seconds rather than Ray's default minute, so that a stop still ends within 30 s.
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "5")


def _init_ray(cfg: Config, stack: contextlib.ExitStack) -> None:
    """Connect to ``cluster.address``, or start a local Ray that listens on 127.0.0.1 only."""
    local_ray_env(cfg)
    import ray

    if ray.is_initialized():
        return
    route_library_loggers("ray")
    route_ray_errors_to_log()
    stack.callback(ray.shutdown)  # before init: a Ctrl-C during it still stops what it started
    if cfg.cluster.address:
        ray.init(address=cfg.cluster.address, log_to_driver=False)
    else:
        num_cpus = local_ray_cpus(cfg, local_cores())  # fails first if the plan cannot fit this machine
        if not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
            raise RuntimeError(
                "a local Ray would listen on this machine's network address because ray was imported "
                "before rredcot could set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: set it in the environment, "
                "or set cluster.address to a Ray cluster you started"
            )
        ray.init(
            address="local",  # a Ray of its own even when another instance runs here (the doctor warns)
            num_cpus=num_cpus,
            include_dashboard=cfg.cluster.dashboard,
            dashboard_host=cfg.cluster.dashboard_host,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )


def embedded_redis(cfg: Config, run_dir: Path, nodes: int) -> EmbeddedRedis:
    """The run's own Redis (``redis.url`` unset): on 127.0.0.1 on one node; on a cluster of ``nodes``
    > 1, on this node's address; always with a password (``redis.password``, or a random one per run)."""
    import ray

    host = "127.0.0.1" if nodes <= 1 else ray.util.get_node_ip_address()
    return EmbeddedRedis(run_dir / "redis", host=host, password=cfg.redis.password, server=cfg.redis.server)


def embedded_redis_line(url: str, password: str | None) -> str:
    """The embedded server's URL as the driver logs it: the password as ``***``, and where it is."""
    if "@" not in url:
        return url
    where = "redis.password" if password else "random for this run, not saved: set redis.password to reach it"
    return f"{redact_url(url)} (password: {where})"


def _write_placement(pg: Any, plan: list[tuple[str, int, dict[str, float]]], out: Path) -> None:
    """Which node holds each worker's bundle (``placement.json`` in the run dir)."""
    import json

    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg)["bundles_to_node_id"]
    names = ["eval" if t == "evaluator" else f"{WORKER_PREFIX[t]}{r}" for t, r, _ in plan]
    out.write_text(json.dumps({name: nodes[i] for i, name in enumerate(names)}, indent=1))


def _evaluator_options(pg: Any, index: int, tier: Tier | None) -> dict[str, Any]:
    """Ray options of the evaluator: bundle ``index`` of ``pg`` when the plan gives it one
    (``cluster.gpus_per_evaluator``), else no resources (it runs while the tiers wait)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if tier is None:
        return {"num_cpus": 0}
    return {
        "num_cpus": tier.cpus,
        "num_gpus": tier.gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
    }


def first_line(cfg: Config, run_dir: Path) -> str:
    """What starts, with which dtype, and how long it is expected to take."""
    choice, learner = (planned_dtype(requested, on_gpu) for _, requested, on_gpu in dtype_settings(cfg))
    dtype = choice.dtype if learner.dtype == choice.dtype else f"{choice.dtype} (learner {learner.dtype})"
    redis = f"Redis at {redact_url(cfg.redis.url)}" if cfg.redis.url else "an embedded Redis"
    ray = f"Ray at {cfg.cluster.address}" if cfg.cluster.address else "a local Ray"
    c = cfg.cluster
    expected = expected_seconds(cfg)
    when = (
        f"expected ~{fmt_duration(expected)} (the last run of this config here)"
        if expected
        else "an ETA follows the first training step"
    )
    return (
        f"run {cfg.run.name!r}: starting {redis}, {ray}, {c.generators} generator(s) + {c.redistributors} "
        f"redistributor(s) + {c.learner_ranks} learner rank(s) for {cfg.run.steps} steps; dtype {dtype} on "
        f"{cpu_info().describe()}: {choice.reason}; {when}; logs in {run_dir / 'logs'}"
    )


def train(cfg: Config, verbose: bool = False) -> Path:
    """Run the whole pipeline; returns the report directory."""
    run_dir = Path(cfg.run.dir).resolve()
    warnings = preflight(cfg)  # paths, data, services, cores: a PreflightError before anything starts
    claim_run_dir(run_dir, cfg.run.name, cfg.run.resume)
    phases = Phases()
    outcome = RunOutcome(status="failed", phases=phases)
    received.clear()
    with contextlib.ExitStack() as stack:
        stack.callback(hold_run_lock(run_dir, cfg.run.name))  # before anything in run_dir is touched
        fresh = cfg.run.resume == "never"  # an earlier run's driver.log is overwritten
        stack.callback(setup_driver_logging(run_dir / "logs" / "driver.log", verbose, append=not fresh))
        log.info(first_line(cfg, run_dir))
        end_leftovers(run_dir)  # the Ray processes of an earlier driver of this run that was killed
        for warning in warnings:
            log.warning(warning.line())
        try:
            _run(cfg, run_dir, phases, outcome, stack)
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
    return run_dir / "report"


def _finish(cfg: Config, run_dir: Path, outcome: RunOutcome, phases: Phases) -> None:
    """Close the ledger and write the report, whatever ended the run."""
    if outcome.control is not None:
        _close_ledger(outcome)
    if outcome.monitor is None:  # stopped before anything ran
        return
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


def _run(cfg: Config, run_dir: Path, phases: Phases, outcome: RunOutcome, stack: contextlib.ExitStack) -> None:
    local_ray_env(cfg)  # before the first import of ray
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from rredcot.launch.evaluate import Evaluator

    # Ctrl-C while ray.init starts the local Ray can be swallowed inside it (seen under load: the
    # run went on to the end); ours records the signal, so that the run stops as soon as it returns
    catch_interrupts(stack)
    stack.callback(_say_slots_left, cfg.run.name)  # after Ray's shutdown: what a failed learner left in /dev/shm
    stack.callback(end_leftovers, run_dir)  # after Ray's shutdown: any of its processes that outlived it
    _init_ray(cfg, stack)
    raise_if_interrupted()
    # after ray.init, which installs its own SIGTERM handler: ours tears the run down cleanly
    stack.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, raise_interrupt))
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    check_plan(cfg, ray.cluster_resources(), nodes=len(nodes))  # fails before any actor starts
    if cfg.run.resume == "never":
        _clear_run_dir(run_dir, keep=run_dir / "logs" / "driver.log")
    if not cfg.cluster.address:  # a local Ray of the run's own: a later start ends what a killed driver left
        record_session(run_dir, ray._private.worker._global_node.get_session_dir_path())
    (run_dir / "report").mkdir(parents=True, exist_ok=True)
    server = None
    if not cfg.redis.url:
        server = stack.enter_context(embedded_redis(cfg, run_dir, len(nodes)))
        raise_if_interrupted()  # a signal while redis-server was forked
        cfg = _with_redis_url(cfg, server.url)
        log.info("embedded Redis at %s", embedded_redis_line(server.url, cfg.redis.password))
    outcome.cfg = cfg
    write_text_atomic(run_dir / "config.yaml", to_yaml(redacted(cfg)))  # polled for by tools and tests
    client = connect(cfg.redis.url)
    if cfg.run.resume == "never":
        _clear_run_keys(client, cfg.run.name)
    control = outcome.control = RunControl(client, cfg.run.name)
    control.clear_stop()
    monitor = outcome.monitor = Monitor(cfg, control, run_dir / "tensorboard", to_dict(redacted(cfg)))
    stack.callback(monitor.close)
    progress = Progress(cfg, phases)
    stack.callback(progress.close)
    watch = Watch(cfg, monitor, progress, client, server)

    plan, eval_tier = bundles(cfg), evaluator_tier(cfg)
    extra = [eval_tier.bundle()] if eval_tier else []
    pg = placement_group([b for _, _, b in plan] + extra, strategy=cfg.cluster.placement.upper())
    ray.get(pg.ready(), timeout=300)
    stack.callback(remove_placement_group, pg)
    _write_placement(pg, plan + [("evaluator", 0, b) for b in extra], run_dir / "placement.json")
    cfg_dict = to_dict(cfg)

    # The workers start (imports, model loading, engine and DeepSpeed set-up: a minute or more on a
    # small CPU) while the starting model is evaluated; their run() is only called after it.
    client.delete(group_key(cfg.run.name))  # generators must not join an earlier learner's weight group
    actors = StageActors(cfg, pg, plan, control, stack, outcome.refs)
    actors.start()

    evaluator = None
    if cfg.data.eval_size:
        evaluator = ray.remote(Evaluator).options(**_evaluator_options(pg, len(plan), eval_tier)).remote(cfg_dict)
        stack.callback(ray.kill, evaluator)
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
    ray.wait(list(outcome.refs), num_returns=len(outcome.refs), timeout=60)
    monitor.poll()
    if evaluator is not None and monitor.evals[-1]["step"] != monitor.step:
        phases.enter("final evaluation")
        monitor.add_eval(watch.wait(evaluator.evaluate_latest.remote(), evals_left=0), monitor.step)
    outcome.status = "finished"


class Watch:
    """The driver's waiting: polls metrics, shows progress, and surfaces any actor's failure at once."""

    def __init__(
        self, cfg: Config, monitor: Monitor, progress: Progress, client: Any, server: EmbeddedRedis | None
    ) -> None:
        self.cfg, self.monitor, self.progress, self.client, self.server = cfg, monitor, progress, client, server
        self.redis_restarts = 0

    def tick(self, evals_left: int) -> None:
        raise_if_interrupted()
        self._keep_redis()
        self.monitor.poll()
        depths = {s: self.client.xlen(key(self.cfg.run.name, s)) for s in (ROLLOUTS, BATCHES)}
        self.progress.update(self.monitor, depths, evals_left)

    def _keep_redis(self) -> None:
        """Restart the embedded Redis if it died: same port, its append-only file replayed (every
        acknowledged write survives a killed process), so the workers' clients, which retry with
        back-off, carry on; at most ``cluster.max_restarts`` times."""
        if self.server is None or self.server.alive():
            return
        code = self.server.proc.returncode if self.server.proc is not None else None
        if self.redis_restarts >= self.cfg.cluster.max_restarts:
            raise RuntimeError(
                f"the embedded Redis server died (exit {code}) after {self.redis_restarts} restart(s); "
                "resume the run with run.resume=auto"
            )
        self.redis_restarts += 1
        log.warning(
            "the embedded Redis server died (exit %s); restarting it on port %d from its append-only file (%d/%d)",
            code,
            self.server.port,
            self.redis_restarts,
            self.cfg.cluster.max_restarts,
        )
        self.server.start()
        self.monitor.control.publish_metrics("driver", "driver", {"redis_restarts": float(self.redis_restarts)})

    def wait(self, ref: Any, evals_left: int) -> Any:
        """The result of ``ref`` (an evaluation), with progress while it runs."""
        import ray

        while not ray.wait([ref], timeout=1.0)[0]:
            self.tick(evals_left)
        self.tick(evals_left)
        return ray.get(ref)

    def training(self, actors: StageActors, next_eval: int, evaluate: Any) -> None:
        """Until every learner rank returns (a lost learner tier is restarted on the way);
        evaluations every ``next_eval`` steps when set."""
        import ray

        every = next_eval
        next_eval = next_eval_step(self.monitor.step, every) if every else 0  # a resumed run: after its step
        final_eval = int(evaluate is not None)
        while actors.learning():
            done, _ = ray.wait(actors.pending(), num_returns=1, timeout=1.0)
            for r in done:
                actors.collect(r)  # raises a worker's failure (the error path tears everything down)
            self.tick(final_eval)
            if next_eval and self.monitor.step >= next_eval and actors.learning():
                self.monitor.add_eval(self.wait(evaluate(), final_eval), self.monitor.step)
                next_eval = next_eval_step(self.monitor.step, every)


def _say_slots_left(run_id: str) -> None:
    """Say that a killed or failed learner's ``ipc`` slots stay in ``/dev/shm``, and how to free them."""
    if left := host_slots_left(run_id):
        mib = sum(p.stat().st_size for p in left) / 2**20
        log.warning(
            "the learner's weight slots stay in /dev/shm (%.0f MiB) for run.resume=auto, whose generators start "
            "from them; free them with: rm %s",
            mib,
            " ".join(map(str, left)),
        )


def next_eval_step(step: int, every: int) -> int:
    """The step of the next periodic evaluation after one at ``step``: the next multiple of ``every``
    (a resumed run far past ``every`` evaluates once, not once per multiple it skipped)."""
    return (step // every + 1) * every


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
