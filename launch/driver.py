"""``rredcot train``: start services, place the three tiers on Ray, watch the run, write the report.

Order: validate the config and the resource plan (before anything starts) → Redis (embedded when
``redis.url`` is unset) → Ray (local unless ``cluster.address``) → placement group, one bundle
per worker → held-out evaluation of the starting model → generator, redistributor and learner
actors → live display until the learner has taken ``run.steps`` steps → stop flag → final
evaluation → report. Every exit path (end, error, Ctrl-C, SIGTERM) removes what this run started
and nothing else: its actors, its placement group, Ray only if it started it, its Redis server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from rredcot.common.config import Config, to_dict, to_yaml
from rredcot.common.control import RunControl
from rredcot.common.streams import BATCHES, ROLLOUTS, connect, key
from rredcot.common.weight_group import group_key
from rredcot.launch.plan import bundles, check_plan
from rredcot.launch.services import EmbeddedRedis

log = logging.getLogger(__name__)

# tier -> (module, class): the class takes (cfg: Config, name: str) (learner, generator: also rank=) and
# has run(), which returns when the run's work is done or its stop flag is raised
STAGE_CLASSES = {
    "generator": ("rredcot.actors.generator", "Generator"),
    "redistributor": ("rredcot.redistributor.worker", "Redistributor"),
    "learner": ("rredcot.learner.trainer", "Trainer"),
}
WORKER_PREFIX = {"generator": "gen", "redistributor": "red", "learner": "learner"}


class StageWorker:
    """Ray actor body for any tier: builds the stage object from a plain-dict config and runs it."""

    def __init__(self, tier: str, cfg: dict[str, Any], rank: int, env: dict[str, str]) -> None:
        os.environ.update(env)
        import torch

        torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
        from rredcot.common.config import from_dict

        module, cls = STAGE_CLASSES[tier]
        stage_cls = getattr(importlib.import_module(module), cls)
        name = f"{WORKER_PREFIX[tier]}{rank}"
        ranked = tier in ("learner", "generator")
        self.stage = stage_cls(from_dict(cfg), name, rank=rank) if ranked else stage_cls(from_dict(cfg), name)

    def run(self) -> dict[str, float]:
        result = self.stage.run()
        return result.snapshot() if hasattr(result, "snapshot") else result


def _with_redis_url(cfg: Config, url: str) -> Config:
    return dataclasses.replace(cfg, redis=dataclasses.replace(cfg.redis, url=url))


RUN_DIR_OUTPUTS = ("redis", "checkpoints", "weights", "traces", "tensorboard", "report", "placement.json")


def _clear_run_dir(run_dir: Path) -> None:
    """``run.resume=never`` starts afresh: remove what an earlier run of this name left in its dir."""
    found = [run_dir / name for name in RUN_DIR_OUTPUTS if (run_dir / name).exists()]
    for path in found:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if found:
        log.info("run.resume=never: cleared the previous run's %s in %s", ", ".join(p.name for p in found), run_dir)


def _clear_run_keys(client: Any, run_id: str) -> None:
    """``run.resume=never`` on a shared server: drop the run's old streams, counters and metrics."""
    old = list(client.scan_iter(match=key(run_id, "*"), count=1000))
    if old:
        client.delete(*old)
        log.info("run.resume=never: deleted %d keys of an earlier run %r", len(old), run_id)


def _redacted(cfg: Config) -> Config:
    """The config without secrets (for ``config.yaml`` and the report)."""
    url = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", cfg.redis.url or "") or None
    return dataclasses.replace(cfg, redis=dataclasses.replace(
        cfg.redis, url=url, password="***" if cfg.redis.password else None))


def _threads(cpus: float) -> str:
    return str(max(1, int(cpus)))


def _stage_env(cfg: Config, tier: str, rank: int, master: tuple[str, int]) -> dict[str, str]:
    cpus = {"generator": cfg.cluster.cpus_per_generator, "redistributor": cfg.cluster.cpus_per_redistributor,
            "learner": cfg.cluster.cpus_per_learner}[tier]
    env = {"OMP_NUM_THREADS": _threads(cpus), "TOKENIZERS_PARALLELISM": "false",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CACHE_ROOT": str(Path(cfg.run.dir).resolve() / "vllm_cache")}
    if tier == "learner":
        env.update(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(cfg.cluster.learner_ranks),
                   MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
    import torch

    if not torch.cuda.is_available():
        env["DS_ACCELERATOR"] = "cpu"
    return env


def _init_ray(cfg: Config, stack: contextlib.ExitStack) -> None:
    import ray

    if ray.is_initialized():
        return
    if cfg.cluster.address:
        ray.init(address=cfg.cluster.address)
    else:
        # One machine: keep every Ray address on loopback (Ray otherwise binds the node's network IP).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        need = sum(b.get("CPU", 0.0) for _, _, b in bundles(cfg))
        ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999) + 1), include_dashboard=cfg.cluster.dashboard,
                 dashboard_host=cfg.cluster.dashboard_host, log_to_driver=True)
    stack.callback(ray.shutdown)


def _write_placement(pg: Any, plan: list[tuple[str, int, dict[str, float]]], out: Path) -> None:
    """Which node holds each worker's bundle (``placement.json`` in the run dir)."""
    import json

    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg)["bundles_to_node_id"]
    out.write_text(json.dumps({f"{WORKER_PREFIX[t]}{r}": nodes[i] for i, (t, r, _) in enumerate(plan)}, indent=1))


def _learner_master(pg: Any, bundle_index: int, port: int) -> tuple[str, int]:
    """Address of the node holding learner rank 0's bundle (the torch.distributed rendezvous)."""
    import ray
    from ray.util.placement_group import placement_group_table

    node_id = placement_group_table(pg)["bundles_to_node_id"][bundle_index]
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    if len(nodes) == 1:
        return "127.0.0.1", port
    return nodes[node_id], port


class Monitor:
    """Polls worker metrics and queue depths; keeps history; drives the live display and TensorBoard."""

    def __init__(self, cfg: Config, control: RunControl, tb_dir: Path) -> None:
        self.cfg, self.control = cfg, control
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._last_step: dict[str, float] = {}
        self.step = 0  # the slowest learner rank's step at the last poll
        self.writer = self.wandb = None
        if cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(tb_dir))
        if cfg.logging.wandb:
            import wandb

            self.wandb = wandb.init(project=cfg.logging.wandb_project, name=cfg.run.name, dir=str(tb_dir.parent),
                                    config=to_dict(_redacted(cfg)))

    def poll(self) -> dict[str, dict[str, Any]]:
        snaps = self.control.all_metrics()
        step = self.step = int(min((v.get("step", 0.0) for v in snaps.values() if v.get("tier") == "learner"),
                                   default=0))
        now = time.time()
        for worker, values in snaps.items():
            nums = {k: v for k, v in values.items() if isinstance(v, float)}
            marker = nums.get("step", nums.get("groups", nums.get("finished_groups", 0.0)))
            if self._last_step.get(worker) == marker:
                continue
            self._last_step[worker] = marker
            self.history.append({"t": now, "tier": values.get("tier", "?"), "worker": worker, "step": step,
                                 "values": nums})
            self._log({f"{values.get('tier', '?')}/{worker}/{k}": v for k, v in nums.items()}, step)
        return snaps

    def _log(self, scalars: dict[str, float], step: int) -> None:
        if self.writer is not None:
            for name, v in scalars.items():
                self.writer.add_scalar(name, v, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def add_eval(self, result: dict[str, Any], step: int) -> None:
        result = {**result, "step": step}
        self.evals.append(result)
        self._log({f"eval/{name}_accuracy": result[name] for name in ("sampled", "greedy")}, step)
        log.info("eval at step %d: sampled %.3f [%.3f, %.3f], greedy %.3f", step, result["sampled"],
                 result["sampled_low"], result["sampled_high"], result["greedy"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _display_table(snaps: dict[str, dict[str, Any]], depths: dict[str, int], evals: list[dict[str, Any]],
                   steps: int) -> Any:
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
        else:
            progress = f"{v.get('groups', 0):.0f} groups"
            rate = f"{v.get('rollouts_per_s', 0):.2f} samples/s"
            quality = f"dead {v.get('dead_letters', 0):.0f}"
            waiting = f"lag {v.get('queue_lag_s', 0):.1f}s"
        table.add_row(worker, str(tier), progress, rate, quality, waiting)
    ev = f"held-out sampled acc {evals[-1]['sampled']:.3f} (step {evals[-1]['step']})" if evals else "no eval yet"
    table.caption = f"queues: rollouts {depths[ROLLOUTS]}, batches {depths[BATCHES]}  |  {ev}"
    return table


def train(cfg: Config) -> Path:
    """Run the whole pipeline; returns the report directory."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rredcot.launch.evaluate import Evaluator
    from rredcot.launch.services import free_port

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    run_dir = Path(cfg.run.dir).resolve()
    report_dir = run_dir / "report"
    with contextlib.ExitStack() as stack:
        _init_ray(cfg, stack)
        # after ray.init, which installs its own SIGTERM handler: ours tears the run down cleanly
        stack.callback(signal.signal, signal.SIGTERM, signal.signal(signal.SIGTERM, _raise_interrupt))
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        check_plan(cfg, ray.cluster_resources(), nodes=len(nodes))  # fails before any actor starts
        if cfg.run.resume == "never":
            _clear_run_dir(run_dir)
        report_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.redis.url:
            host = "127.0.0.1" if len(nodes) <= 1 else ray.util.get_node_ip_address()
            server = EmbeddedRedis(run_dir / "redis", host=host, password=cfg.redis.password,
                                   server=cfg.redis.server)
            stack.enter_context(server)
            cfg = _with_redis_url(cfg, server.url)
        (run_dir / "config.yaml").write_text(to_yaml(_redacted(cfg)))
        client = connect(cfg.redis.url)
        if cfg.run.resume == "never":
            _clear_run_keys(client, cfg.run.name)
        control = RunControl(client, cfg.run.name)
        control.clear_stop()
        monitor = Monitor(cfg, control, run_dir / "tensorboard")
        stack.callback(monitor.close)

        plan = bundles(cfg)
        pg = placement_group([b for _, _, b in plan], strategy=cfg.cluster.placement.upper())
        ray.get(pg.ready(), timeout=300)
        stack.callback(remove_placement_group, pg)
        _write_placement(pg, plan, run_dir / "placement.json")
        cfg_dict = to_dict(cfg)

        evaluator = None
        if cfg.data.eval_size:
            evaluator = ray.remote(Evaluator).options(num_cpus=0).remote(cfg_dict)
            stack.callback(ray.kill, evaluator)
            monitor.add_eval(ray.get(evaluator.evaluate_latest.remote()), 0)

        master = _learner_master(pg, [t for t, _, _ in plan].index("learner"), free_port())
        client.delete(group_key(cfg.run.name))  # generators must not join an earlier learner's weight group
        actors, refs = [], {}
        for index, (tier, rank, bundle) in enumerate(plan):
            actor = ray.remote(StageWorker).options(
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                name=f"rredcot-{cfg.run.name}-{tier}{rank}",
            ).remote(tier, cfg_dict, rank, _stage_env(cfg, tier, rank, master))
            actors.append(actor)
            refs[actor.run.remote()] = (tier, rank)
        for a in actors:
            stack.callback(ray.kill, a)
        learner_refs = [r for r, (tier, _) in refs.items() if tier == "learner"]
        _watch(cfg, monitor, client, refs, learner_refs, evaluator)

        control.request_stop("learner finished")
        ray.wait(list(refs), num_returns=len(refs), timeout=60)
        monitor.poll()
        if evaluator is not None and monitor.evals[-1]["step"] != monitor.step:
            monitor.add_eval(ray.get(evaluator.evaluate_latest.remote()), monitor.step)
        artefacts = _write_report(cfg, run_dir, report_dir, monitor, control, started)
        log.info("run finished: report in %s (%s)", report_dir, ", ".join(artefacts))
    return report_dir


def _watch(cfg: Config, monitor: Monitor, client: Any, refs: dict[Any, tuple[str, int]], learner_refs: list[Any],
           evaluator: Any) -> None:
    """Poll until every learner rank returns; surface any actor's failure at once."""
    import ray

    live = None
    if cfg.logging.progress:
        from rich.live import Live

        live = Live(refresh_per_second=2, transient=False)
        live.start()
    pending = set(refs)
    next_eval = cfg.logging.eval_every if evaluator is not None else 0
    try:
        while any(r in pending for r in learner_refs):
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for r in done:
                pending.discard(r)
                ray.get(r)  # raises the actor's exception (error path tears everything down)
            snaps = monitor.poll()
            if next_eval and monitor.step >= next_eval and any(r in pending for r in learner_refs):
                monitor.add_eval(ray.get(evaluator.evaluate_latest.remote()), monitor.step)
                next_eval += cfg.logging.eval_every
            if live is not None:
                depths = {s: client.xlen(key(cfg.run.name, s)) for s in (ROLLOUTS, BATCHES)}
                live.update(_display_table(snaps, depths, monitor.evals, cfg.run.steps))
    finally:
        if live is not None:
            live.stop()


def _write_report(cfg: Config, run_dir: Path, report_dir: Path, monitor: Monitor, control: RunControl,
                  started: float) -> dict[str, str]:
    from rredcot.launch.report import plot_curves, write_summary

    artefacts = {"learning curves": str(plot_curves(monitor.history, monitor.evals, report_dir / "curves.png")),
                 "tensorboard": str(run_dir / "tensorboard")}
    heatmaps = _render_heatmaps(cfg, run_dir, report_dir)
    artefacts.update({f"credit heatmap {i}": p for i, p in enumerate(heatmaps)})
    final_model = _final_model(run_dir, report_dir)
    if final_model is not None:
        artefacts["final HF model"] = str(final_model)
    write_summary(report_dir / "summary.md", to_yaml(_redacted(cfg)), monitor.evals, control.all_metrics(),
                  time.monotonic() - started, artefacts)
    artefacts["summary"] = str(report_dir / "summary.md")
    return artefacts


def _render_heatmaps(cfg: Config, run_dir: Path, report_dir: Path, limit: int = 3) -> list[str]:
    """Heatmaps of the traces the redistributors saved under ``run_dir/traces`` (the most-credited sample)."""
    traces = sorted((run_dir / "traces").glob("*.msgpack"))[:limit]
    if not traces:
        return []
    from rredcot.common.models import load_tokenizer, resolve_model_path
    from rredcot.redistributor.heatmap import load_group, render_heatmap

    tok = load_tokenizer(cfg.model.tokenizer or resolve_model_path(cfg.model.path, seed=cfg.run.seed))
    out = []
    for trace in traces:
        group = load_group(str(trace), None)
        sample = max(group.samples, key=lambda s: abs(s.advantage))
        html = report_dir / f"heatmap_{trace.stem}.html"
        render_heatmap(sample, tok, html, html.with_suffix(".png"))
        out.append(str(html))
    return out


def _final_model(run_dir: Path, report_dir: Path) -> Path | None:
    """Link the newest checkpoint's HF directory as ``report/final_model``."""
    from rredcot.learner.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        return None
    link = report_dir / "final_model"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(ckpt / "hf", target_is_directory=True)
    return link


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
