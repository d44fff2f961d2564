"""Weight receivers of the built-in transports: apply each newer published version to a weight port.

A port is what holds the weights a receiver updates (``WeightPort``): a generator's or the
evaluator's vLLM engine (``actors.engine.Engine``), or a redistributor's scorer following the policy
(``redistributor.scorer_weights.ScorerPort``). One receiver per port; a port outside the learner's
weight group (``rank=None``: the evaluator, a scorer, a continuation engine) follows files.
``poll`` applies the newest published version if it is newer than the port's, under the in-flight
policy, and returns (version, seconds of the update); None when there is nothing new (or nothing
readable yet: a pruned file means a newer version exists, taken on the next poll).

A file that the newest manifest names and that this node cannot find was never pruned: the
receiver does not share the learner's filesystem. That is logged as an error (once per version,
naming the path and the fix), counted in ``missing_files`` (the generator's ``weight_files_missing``
metric), and retried on every poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from rredcot.common.config import Config, tensor_parallel
from rredcot.common.weight_group import GroupInfo, read_group
from rredcot.common.weight_slots import SlotReader, want_files
from rredcot.common.weight_sync import WeightManifest, latest_manifest, published_version, read_weights

log = logging.getLogger(__name__)


class WeightsLost(RuntimeError):
    """A version failed part-way into a port: its weights are a mix of two versions, so it must not be
    used again (its worker ends; the supervisor restarts it on the newest weights)."""


class WeightPort(Protocol):
    """What a receiver updates: the version it holds and the two ways to load one. Each load returns
    the seconds of the update (``load_weights_shared``: None when the slot was overwritten during the
    copy, a newer version being there to take) and raises ``WeightsLost`` if it failed part-way."""

    @property
    def version(self) -> int: ...

    def load_weights_bytes(self, data: bytes, version: int, in_flight: str = "finish") -> float: ...

    def load_weights_shared(
        self, manifest: WeightManifest, still_held: Callable[[], bool], in_flight: str = "finish"
    ) -> float | None: ...


class GroupWeightPort(WeightPort, Protocol):
    """A port that can also be a rank of the learner's weight group (a generator's engine)."""

    def join_weight_group(self, info: GroupInfo, rank: int, timeout_s: float) -> None: ...

    def leave_weight_group(self) -> None: ...

    def load_weights_broadcast(self, manifest: WeightManifest, in_flight: str = "finish") -> tuple[int, float]: ...


def _receiver_name(rank: int | None, name: str | None) -> str:
    return name or (f"gen{rank}" if rank is not None else "eval")


class FileReceiver:
    """``file``: read the version's safetensors file (verified against the manifest's checksum)."""

    def __init__(self, client: Any, run_id: str, engine: WeightPort, name: str = "") -> None:
        self.client, self.run_id, self.engine, self.name = client, run_id, engine, name
        self.missing_files = 0  # versions whose file this node could not find (no shared filesystem)
        self._missing: int | None = None  # the last such version (logged once)

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: WeightPort, rank: int | None, name: str | None = None
    ) -> FileReceiver:
        """The receiver of generator ``rank`` (None: a port outside the weight group), named ``name``
        in logs and in the learner's set of file readers (default ``gen<rank>``, or ``eval``)."""
        return cls(client, cfg.run.name, engine, _receiver_name(rank, name))

    @property
    def holds_group(self) -> bool:
        """Whether the learner's sends wait for this receiver (then it polls until the run ends)."""
        return False

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        return self._apply_file(latest_manifest(self.client, self.run_id, newer_than=self.engine.version), in_flight)

    def _apply_file(self, manifest: WeightManifest | None, in_flight: str) -> tuple[int, float] | None:
        if manifest is None or not manifest.path:  # broadcast only: the learner writes a file for outsiders
            return None
        try:
            data = read_weights(manifest)
        except FileNotFoundError:  # pruned by a newer publication (taken next time), or never on this node
            if published_version(self.client, self.run_id) <= manifest.version:
                self._report_missing(manifest)
            return None
        return manifest.version, self.engine.load_weights_bytes(data, manifest.version, in_flight)

    def _report_missing(self, manifest: WeightManifest) -> None:
        if self._missing == manifest.version:
            return
        self._missing = manifest.version
        self.missing_files += 1
        log.error(
            "%s: weights v%d are published as %s, which does not exist on this node and no newer version "
            "pruned it: this receiver does not share the learner's filesystem. Put run.dir on a filesystem "
            "that every node mounts, or use generation.weight_transport=collective; retrying",
            self.name,
            manifest.version,
            manifest.path,
        )

    def close(self) -> None:
        """Nothing to release (files are pruned by the publisher)."""


class CollectiveReceiver(FileReceiver):
    """``collective``: a generator joins the learner's weight group as rank ``rank + 1`` (its engine's
    workers from ``1 + rank · t`` when it is tensor-parallel over ``t`` GPUs) and receives
    each version's buckets; files are its fallback (and the evaluator's only way, outside the group)."""

    def __init__(
        self, client: Any, run_id: str, engine: GroupWeightPort, name: str, group_rank: int | None, timeout_s: float
    ):
        super().__init__(client, run_id, engine, name)
        if group_rank is None:  # outside the group: files it must have (the learner writes them on request)
            want_files(client, run_id, self.name)
        self.group_rank, self.timeout_s, self.epoch = group_rank, timeout_s, ""
        self.in_group = group_rank is not None and self._join(group_rank, timeout_s)

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: GroupWeightPort, rank: int | None, name: str | None = None
    ) -> CollectiveReceiver:
        shards = tensor_parallel(cfg.cluster.gpus_per_generator)  # each worker of a tensor-parallel engine
        group_rank = None if rank is None else 1 + rank * shards  # is a rank: the engine's first is this
        return cls(
            client, cfg.run.name, engine, _receiver_name(rank, name), group_rank, cfg.generation.weight_group_timeout_s
        )

    @property
    def holds_group(self) -> bool:
        return self.in_group

    def _join(self, group_rank: int, timeout_s: float) -> bool:
        """Join the learner's weight group (waits for the learner to host it); False → use files."""
        deadline = time.monotonic() + timeout_s
        while (info := read_group(self.client, self.run_id)) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            if info is None:
                raise TimeoutError(f"no weight group published within {timeout_s:.0f} s")
            self.engine.join_weight_group(info, group_rank, timeout_s)
            self.epoch = info.epoch
        except Exception as e:  # noqa: BLE001 - the learner falls back to files when the group is incomplete
            log.warning(
                "%s: cannot join the weight group (%s: %s); following weight files", self.name, type(e).__name__, e
            )
            return False
        return True

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        self._follow_restart()
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None or manifest.transport != "collective" or not self.in_group:
            return self._apply_file(manifest, in_flight)
        try:
            return self.engine.load_weights_broadcast(manifest, in_flight)
        except WeightsLost:
            raise
        except Exception as e:  # noqa: BLE001 - a broken group: the learner re-publishes as files
            log.warning("%s: weight broadcast failed (%s: %s); following weight files", self.name, type(e).__name__, e)
            self.close()
            return None

    def _follow_restart(self) -> None:
        """A restarted learner hosts a new group (another epoch) and waits for the generators in its
        first publication: leave the old group and join the new one."""
        if not self.epoch:  # never joined (outside the group, or the join failed)
            return
        info = read_group(self.client, self.run_id)
        if info is not None and info.epoch != self.epoch:
            log.info("%s: the learner restarted (weight group %s); joining its new group", self.name, info.epoch)
            self.close()
            self.epoch = ""
            self.in_group = self._join(self.group_rank, self.timeout_s)

    def close(self) -> None:
        if self.in_group:
            self.engine.leave_weight_group()
            self.in_group = False


class IpcReceiver(FileReceiver):
    """``ipc``: copy each version out of the learner's shared slot (``common.weight_slots``). A receiver
    that cannot map the slots (another node, a GPU it does not see) says why once, asks the learner
    for weight files and follows them; a slot that cannot be opened any more (the learner ended or
    restarted) is read from the version's file when there is one."""

    def __init__(self, client: Any, run_id: str, engine: WeightPort, name: str = "") -> None:
        super().__init__(client, run_id, engine, name)
        self.slots = SlotReader(client, run_id, name)

    def poll(self, in_flight: str = "finish") -> tuple[int, float] | None:
        manifest = latest_manifest(self.client, self.run_id, newer_than=self.engine.version)
        if manifest is None or manifest.transport != "ipc" or not self.slots.usable(manifest.shared):
            return self._apply_file(manifest, in_flight)
        try:
            seconds = self.engine.load_weights_shared(manifest, lambda: self.slots.still_held(manifest), in_flight)
        except WeightsLost:
            raise
        except Exception as e:  # noqa: BLE001 - the slots went with their learner: its file, if any
            log.info("%s: cannot open weights v%d's slot (%s: %s)", self.name, manifest.version, type(e).__name__, e)
            return self._apply_file(manifest, in_flight)
        return None if seconds is None else (manifest.version, seconds)
