"""The learner loop: batches stream → DeepSpeed step → ack → version, weights, metrics, checkpoints.

The ranks read ``generation.prompts_per_step`` groups from the ``batches`` stream and share them
out by tokens (``learner.batches``: never a group or sample twice, nor one trained in an earlier
step, by a Redis set of rollout ids written after the step, so a crash before it loses nothing);
each trains its share in one step, and only then acknowledges its entries. Rank 0 then publishes
the weights (every ``learner.broadcast_every`` steps) and the new version that the generators'
staleness admission reads.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import redis

from rredcot.common.codec import decode
from rredcot.common.config import Config, resolve_credit
from rredcot.common.records import WeightedGroup
from rredcot.common.registry import WEIGHT_TRANSPORTS
from rredcot.common.run_context import RunContext
from rredcot.common.staleness import Admission
from rredcot.common.streams import BATCHES, DEAD, ROLLOUTS, Consumer, key, run_key
from rredcot.learner.batches import Batch, BatchReader, Gather, group_length
from rredcot.learner.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rredcot.learner.checkpoint_dirs import latest_checkpoint
from rredcot.learner.engine import LearnerEngine, init_distributed, load_policy
from rredcot.learner.packing import TrainSample, samples_from_group
from rredcot.learner.rendezvous import join_from_env
from rredcot.learner.replay import ReplayLog, steps_to_replay
from rredcot.learner.version_truth import ledger_versions, trajectory_metrics
from rredcot.learner.weights import publish
from rredcot.models.store import load_tokenizer, resolve_model_path
from rredcot.transports import Publisher
from rredcot.transports.manifest import version_key

log = logging.getLogger(__name__)
GROUP = "learner"
STALENESS_BINS = 4  # histogram of (learner version - token version): 0, 1, 2, >=3


class Trainer:
    """One learner rank (the driver makes one per rank; ``rredcot learn`` runs rank 0 alone)."""

    def __init__(self, cfg: Config, name: str = "learner0", rank: int = 0) -> None:
        run = RunContext.connect(cfg, "the learner")
        self.cfg, self.name, self.run_id = cfg, name, run.run_id
        self.run_dir = Path(cfg.run.dir).resolve()
        self.client, self.control, self.ledger, self.lineage = run.client, run.control, run.ledger, run.lineage
        self.admission = Admission(self.client, self.run_id, cfg.generation.prompts_per_step, cfg.staleness.eta)
        batches, dead = run_key(self.client, self.run_id, BATCHES), run_key(self.client, self.run_id, DEAD)
        self.consumer = Consumer(self.client, batches, GROUP, name, dead, cfg.redis.claim_idle_ms)
        self.trained_key = run_key(self.client, self.run_id, "trained_ids")
        self.replay = ReplayLog(self.client, self.run_id, rank)
        self.scored = resolve_credit(cfg).method.needs_scorer  # σ from a scorer of some version
        path = resolve_model_path(cfg.model.path, seed=cfg.run.seed)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer or path)
        init_distributed(join_from_env(self.client, self.run_id))
        self.engine = LearnerEngine(
            load_policy(path, cfg.learner),
            cfg.learner,
            temperature=cfg.generation.temperature,
            total_steps=cfg.run.steps,
        )
        self.rank, self.world = self.engine.rank, self.engine.world
        self.reader = BatchReader(
            self.client,
            self.consumer,
            self.ledger,
            self.trained_key,
            self.rank,
            self.world,
            cfg.generation.prompts_per_step,
            self.engine.module.config.vocab_size,
        )
        self.step = 0
        self.last_checkpoint, self.saved_step = time.monotonic(), -1
        self.published = -1  # the newest version this learner published
        self._to_replay: deque[list[tuple[WeightedGroup, set[str]]]] = deque()  # steps trained after the checkpoint
        self.totals = Counter(
            {
                "wait_s": 0.0,
                "fill_wait_s": 0.0,  # the part of wait_s before the first batch (start-up and the pipeline's fill)
                "busy_s": 0.0,
                "broadcast_s": 0.0,
                "duplicates": 0,
                "groups": 0,
                "samples": 0,
                "staleness_max": 0,
                "ahead_tokens": 0,
            }
        )
        self.writer = self._tensorboard() if self.rank == 0 and cfg.logging.tensorboard else None
        self.publisher = self._publisher() if self.rank == 0 else None  # the other ranks take part in gathers
        self._resume()

    # ----- setup -----
    def _tensorboard(self) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.run_dir / "tensorboard" / "learner"))

    def _publisher(self) -> Publisher:
        """Rank 0's publisher of ``generation.weight_transport`` (``transports``)."""
        transport = WEIGHT_TRANSPORTS.get(self.cfg.generation.weight_transport)
        return transport.publisher_class().from_config(self.cfg, self.client, self.run_dir / "weights")

    def _resume(self) -> None:
        """``run.resume=auto`` (also a restarted learner): the newest checkpoint, then the steps trained
        after it are retrained first (``learner.replay``), so no group is lost to the restore."""
        if self.cfg.run.resume == "auto":
            ckpt = latest_checkpoint(self.run_dir / "checkpoints")
            if ckpt is not None:
                pipeline = load_checkpoint(self.engine, ckpt)
                self.step = int(pipeline["step"])
                self.totals.update(pipeline.get("totals", {}))
                if self.rank == 0:
                    self.admission.rebase(max(self.admission.admitted(), int(pipeline["admitted"])), self.step)
            self._plan_replay()
            published = published_version(self.client, self.run_id, self.rank, self.engine.all_gather)
            if published > self.engine.version:  # the restored weights go out as a newer version than
                self.lineage.renumber(published + 1, self.engine.version)  # any the receivers hold
                self.engine.version = published + 1  # so they take them
            log.info(
                "resumed from %s at step %d as version %d; %d step(s) trained after it are trained again first",
                ckpt or "the starting model",
                self.step,
                self.engine.version,
                len(self._to_replay),
            )
        self._broadcast()  # receivers start from the learner's weights (matters after a resume)
        if self.rank == 0:
            self.admission.publish_version(self.step)

    def _plan_replay(self) -> None:
        """The steps this rank trained after the restored checkpoint, retrained first. Every rank
        replays the same steps, up to the last any rank recorded: a rank that recorded nothing for a
        step (an empty share) replays it empty, so the ranks' collectives stay in step. A rank that
        died after the last step's all-reduce but before recording it replays the share that step's
        assignment gave it (``_unrecorded_share``), so the replayed step trains the whole batch. The
        replayed samples count as trained, and an entry of theirs still pending under this rank's name
        (a crash between recording and acknowledging) is acknowledged, not trained a second time."""
        recorded = {s: [_trained(*t) for t in trained] for s, trained in self.replay.after(self.step)}
        last = int(self.engine.all_reduce([float(max(recorded, default=self.step))], ["max"])[0])
        if last > self.step:  # a collective: every rank says what it recorded of the last step
            shares = self._assignment(last)
            if last not in recorded and shares:
                recorded[last] = self._unrecorded_share(shares[self.rank])
        self._to_replay.extend(steps_to_replay(recorded, self.step, last))
        ids = [i for groups in recorded.values() for _, trained in groups for i in trained]
        if ids:
            self.client.sadd(self.trained_key, *ids)
        replayed = {g.group_id for groups in recorded.values() for g, _ in groups}
        held = [e for e in self.consumer.pending_mine() if e.payload is not None]
        self.consumer.ack([e.id for e in held if decode(e.payload, WeightedGroup).group_id in replayed])

    def _assignment(self, step: int) -> list[list[bytes]]:
        """``step``'s assignment (every rank's entry ids) as any rank recorded it; empty if none did (a
        log written before assignments were recorded). A collective."""
        gathered = self.engine.all_gather(msgpack.packb(self.replay.shares(step)))
        return next(filter(None, map(msgpack.unpackb, gathered)), [])

    def _unrecorded_share(self, entry_ids: list[bytes]) -> list[tuple[WeightedGroup, set[str]]]:
        """This rank's share of a step its predecessor trained but died before recording: the groups of
        the entries the step's assignment gave it, still in the stream (nobody acknowledged them), less
        the samples marked trained since."""
        groups = [decode(e.payload, WeightedGroup) for e in self.consumer.fetch(entry_ids) if e.payload is not None]
        ids = [s.rollout.id for g in groups for s in g.samples]
        done = dict(zip(ids, self.client.smismember(self.trained_key, ids), strict=True)) if ids else {}
        share = [(g, {s.rollout.id for s in g.samples if not done[s.rollout.id]}) for g in groups]
        return [(g, fresh) for g, fresh in share if fresh]

    # ----- the loop -----
    def run(self) -> dict[str, float]:
        """Train until ``run.steps`` steps or a stop request; returns the last metrics."""
        metrics: dict[str, float] = {}
        while self.step < self.cfg.run.steps:
            batch = self.next_batch()
            if batch is None:
                break
            metrics = self.train_on(batch)
        if self.saved_step != self.step:
            self.checkpoint()
        if self.published != self.engine.version:  # broadcast_every > 1, or a stop between broadcasts
            self._broadcast()
        if self.publisher is not None:
            self.publisher.close()  # the last version reaches the generators before the run stops
        if self.writer is not None:
            self.writer.close()
        return metrics

    def train_on(self, batch: Batch) -> dict[str, float]:
        """One step on this rank's share; ack, publish, log and checkpoint after it."""
        t0 = time.perf_counter()
        version = self.engine.version
        result = self.engine.train_step(batch.samples)
        self.replay.record(self.step + 1, batch.trained, batch.shares)
        # consumed, applied or not: a skipped step (zero advantages, a non-finite loss) counts its groups
        # trained in the ledger, so a copy that comes again (re-sent or re-generated after a crash) is a
        # duplicate, not a new group that would take the place of one still to come
        if batch.samples:
            self.client.sadd(self.trained_key, *[s.id for s in batch.samples])
        # before the ack: a crash between them trains it again
        self.ledger.record(
            "trained", batch.groups, versions=ledger_versions(batch.spans, version, self.lineage.position)
        )
        self.consumer.ack([e.id for e in batch.entries])
        self.step += 1
        metrics = dict(result.metrics)
        if result.applied and self.engine.version % self.cfg.learner.broadcast_every == 0:
            metrics["broadcast_s"] = self._broadcast()
        if self.rank == 0:  # steps, not versions: a skipped step must still let generators admit more
            self.admission.publish_version(self.step)
        self.totals["busy_s"] += time.perf_counter() - t0
        metrics |= self._pipeline_metrics(batch.samples, version)
        self._log(metrics)
        if self._checkpoint_due():
            try:
                self.checkpoint()
            except CheckpointError as e:  # e.g. a full disk: keep training; the final save will say it again
                self.totals["checkpoint_failures"] += 1
                log.error("%s; training goes on", e)
        return metrics

    def _checkpoint_due(self) -> bool:
        """Every ``learner.checkpoint_every`` steps, or once ``checkpoint_every_s`` of wall time passed
        since the last one (rank 0's clock decides, so every rank joins the collective save)."""
        every, every_s = self.cfg.learner.checkpoint_every, self.cfg.learner.checkpoint_every_s
        by_time = float(bool(every_s) and time.monotonic() - self.last_checkpoint >= every_s and self.rank == 0)
        return bool(every and self.step % every == 0) or self.engine.all_reduce([by_time], ["max"])[0] > 0

    def next_batch(self) -> Batch | None:
        """This rank's share of the next global batch: a step trained after the restored checkpoint
        first (nothing to acknowledge), then the stream's; None once any rank saw a stop request."""
        if self._to_replay:
            return self._replayed()
        t0 = time.perf_counter()
        own = self.reader.read(self.control.stop_requested)
        if self.engine.all_reduce([float(own is None)], ["max"])[0] > 0:  # all ranks stop together
            own = None
        else:  # the groups two ranks both read, counted once; None: a stop while reading what was missing
            own = self.reader.top_up(own, self.engine.all_gather, self.control.stop_requested)
        waited = time.perf_counter() - t0
        self.totals["wait_s"] += waited
        if not self.totals["samples"]:  # no batch yet: the tiers are starting and filling the pipeline
            self.totals["fill_wait_s"] += waited
        if own is None:
            return None
        batch = self.reader.balance(own, self.engine.all_gather)
        self.totals.update(groups=len(batch.entries), samples=len(batch.samples), duplicates=batch.duplicates)
        return batch

    def _replayed(self) -> Batch:
        """The next step trained after the restored checkpoint, the samples it trained only (retrained
        first; nothing to acknowledge, nothing to record again)."""
        groups = self._to_replay.popleft()
        samples = [s for g, ids in groups for s in samples_from_group(g) if s.id in ids]
        self.totals.update(groups=len(groups), samples=len(samples))  # consumed after the checkpoint, counted again
        return Batch(samples=samples, groups={g.group_id: group_length(g) for g, _ in groups})

    # ----- outputs -----
    def _broadcast(self) -> float:
        _, seconds = publish(self.publisher, self.engine.module, self.engine.version)
        self.published = self.engine.version
        self.totals["broadcast_s"] += seconds
        return seconds

    def checkpoint(self) -> Path:
        """A checkpoint of this step. One that fails (``CheckpointError``) counts as not written: the
        end of the run writes it still; the next periodic one is due as if it had been written."""
        self.last_checkpoint = time.monotonic()
        pipeline = {"step": self.step, "admitted": self.admission.admitted(), "totals": dict(self.totals)}
        path = save_checkpoint(
            self.engine, self.run_dir / "checkpoints", pipeline, self.tokenizer, keep=self.cfg.learner.keep_checkpoints
        )
        self.saved_step = self.step
        self.replay.clear()  # the checkpoint holds what it recorded
        return path

    def _pipeline_metrics(self, samples: list[TrainSample], version: int) -> dict[str, float]:
        busy, wait, fill = self.totals["busy_s"], self.totals["wait_s"], self.totals["fill_wait_s"]
        out = {
            "step": float(self.step),
            "version": float(self.engine.version),
            "busy_s": busy,
            "wait_s": wait,
            "idle_frac": wait / max(busy + wait, 1e-9),
            "fill_wait_s": fill,
            # once the first batch came: what the pipeline's throughput, not its start-up, leaves the learner idle
            "steady_idle_frac": (wait - fill) / max(busy + wait - fill, 1e-9),
            "duplicates": float(self.totals["duplicates"]),
            "checkpoint_failures": float(self.totals["checkpoint_failures"]),
            "skipped_nonfinite": float(self.engine.counters["skipped_nonfinite"]),
            "skipped_empty": float(self.engine.counters["skipped_empty"]),
            "broadcast_s_total": self.totals["broadcast_s"],
            "broadcast_send_s_total": self.publisher.send_s if self.publisher is not None else 0.0,
            "broadcast_fallbacks": float(self.publisher.fallbacks) if self.publisher is not None else 0.0,
        }
        for name in (ROLLOUTS, BATCHES):
            out[f"queue_{name}"] = float(self.client.xlen(key(self.run_id, name)))
        out["groups_consumed"] = float(self.totals["groups"])
        out["samples_consumed"] = float(self.totals["samples"])
        out["samples_trained"] = float(self.engine.counters["samples"])
        if samples:
            # in updates along the run's history, across restores (``common.lineage``)
            lag = self.lineage.position(version) - self.lineage.position(np.concatenate([s.versions for s in samples]))
            # tokens of a policy the restore discarded that the restored one has not caught up with
            self.totals["ahead_tokens"] += int((lag < 0).sum())
            out["ahead_tokens"] = float(self.totals["ahead_tokens"])
            lag = np.maximum(lag, 0)
            self.totals["staleness_max"] = max(self.totals["staleness_max"], int(lag.max()))
            out["staleness_max"] = float(self.totals["staleness_max"])
            hist = np.bincount(np.minimum(lag, STALENESS_BINS - 1), minlength=STALENESS_BINS) / len(lag)
            out |= {
                f"staleness_{i}" if i < STALENESS_BINS - 1 else f"staleness_{i}plus": float(h)
                for i, h in enumerate(hist)
            }
            out |= trajectory_metrics(samples, int(self.lineage.position(version)), self.lineage.position, self.scored)
            out["advantage_abs_mean"] = float(np.mean([abs(s.advantage) for s in samples]))
            out["reward_mean"] = float(np.mean([s.reward for s in samples]))
        return out

    def _log(self, metrics: dict[str, float]) -> None:
        """Every rank's snapshot (its step and pid: the driver's progress waits for the slowest rank);
        TensorBoard from rank 0."""
        self.control.publish_metrics(self.name, "learner", metrics)
        if self.writer is not None and self.step % self.cfg.logging.every == 0:
            for k, v in metrics.items():
                self.writer.add_scalar(f"learner/{k}", v, self.step)
            self.writer.flush()


def published_version(client: redis.Redis, run_id: str, rank: int, gather: Gather) -> int:
    """The newest version published before this start, as rank 0 reads it, on every rank (a
    collective): rank 0 publishes the next one right after, which a slower rank would read instead."""
    read = (client.get(version_key(run_id)) or b"0") if rank == 0 else b""
    return int(gather(read)[0])


def _trained(payload: bytes, ids: list[str] | None) -> tuple[WeightedGroup, set[str]]:
    """A replay log entry: the group and the ids of its samples the step trained (None: all of them)."""
    group = decode(payload, WeightedGroup)
    return group, set(ids) if ids is not None else {s.rollout.id for s in group.samples}
