"""The ``collective`` transport: learner rank 0 broadcasts each version's buckets to the generators'
weight group (``transports.group``; gloo on CPU, NCCL on GPU), falling back to files.

Publisher (``CollectivePublisher``, learner rank 0): each of the learner's buckets is copied into
its own reused host buffer (pinned when CUDA is there), so rank 0 holds one copy of the version in
host memory and no extra one on its device; the version's manifest is published at once (before the
learner admits the next step's prompts, so that η = 0 holds), and a background thread broadcasts the
buckets to the generators' weight group while the next step trains, staging them one at a time
through one device buffer of the largest bucket's size (plus the checksum's < 100 MiB). At most one
send is in flight: the next publication waits for it before it overwrites the host buffers. The file
is written from the same host buffers too (and the version re-announced with its path) when a
receiver outside the group needs it. Version 0 (what every receiver starts from) is never broadcast,
only written when a file is wanted. If the group cannot be formed or a send fails, the version is
re-published as a file from the host buffers and the run continues on files.

Receiver (``CollectiveReceiver``): a generator's engine joins the learner's weight group and receives
each version's buckets into its own memory (the engine-side ``join_group``, ``receive_broadcast`` and
``leave_group``, on the port's ``transports.ports.Landing``); files are its fallback,
and the only way for a port outside the group (the evaluator, a policy-following scorer, an MC
continuation engine), which asks the learner for them. A restarted learner hosts a new group: its
receivers leave the old one and join it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import torch

from rredcot.common.config import Config, tensor_parallel
from rredcot.transports import Deployment, WeightSource
from rredcot.transports.file import FilePublisher, FileReceiver, receiver_name
from rredcot.transports.group import (
    GroupInfo,
    device_for,
    flat_nbytes,
    flatten,
    group_key,
    open_group,
    publish_group,
    read_group,
    receive_tensors,
    send_buckets,
    unflatten_buckets,
)
from rredcot.transports.manifest import WeightManifest, latest_manifest, publish_manifest, write_weights
from rredcot.transports.ports import Landing, WeightPort, function_ref
from rredcot.transports.slots import files_wanted, want_files

log = logging.getLogger(__name__)
CPU = torch.device("cpu")
Layout = tuple[str, list[int], str]  # (HF name, shape, dtype name) of one tensor in a bucket


def layout_columns(layout: list[list[Layout]]) -> tuple[list[str], list[list[int]], list[str]]:
    """(names, shapes, dtypes) of every tensor of the buckets, in order."""
    flat = [x for bucket in layout for x in bucket]
    return [n for n, _, _ in flat], [s for _, s, _ in flat], [d for _, _, d in flat]


class CollectivePublisher(FilePublisher):
    """The ``collective`` transport's publisher: rank 0 hosts the weight group for ``receivers``
    generators and broadcasts each version's buckets from a background thread (files and memory: see
    the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        out_dir: str | Path,
        *,
        group_address: str,
        receivers: int,
        file_too: bool = True,
        timeout_s: float = 600.0,
        keep: int = 2,
    ) -> None:
        super().__init__(client, run_id, out_dir, keep)
        self.file_too, self.timeout_s = file_too, timeout_s
        self._group = None
        self._host: list[torch.Tensor] = []  # the last version's buckets, reused
        self.group_info, self._store = GroupInfo.host(group_address, receivers, timeout_s)
        publish_group(client, run_id, self.group_info)
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="weight-send")
        self._pending: Future | None = self._pool.submit(self._open)  # the generators join while the learner starts

    @classmethod
    def from_config(cls, cfg: Config, client: redis.Redis, out_dir: Path) -> CollectivePublisher:
        """The group is hosted at this rank's address; receivers outside it (the evaluator, a
        policy-following scorer) read the files written beside the broadcasts."""
        return cls(
            client,
            cfg.run.name,
            out_dir,
            group_address=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            receivers=cfg.cluster.generators * tensor_parallel(cfg.cluster.gpus_per_generator),  # a rank per shard
            file_too=CollectiveDeployment().shared_run_dir(cfg),
            timeout_s=cfg.generation.weight_group_timeout_s,
        )

    def _with_file(self) -> bool:
        """Whether a version also goes to a file: for the receivers outside the group, those the config
        implies and any that asked (an MC continuation engine, a tool)."""
        return self.file_too or files_wanted(self.client, self.run_id)

    @property
    def collective(self) -> bool:
        """Whether versions still go over the weight group (False after a failure)."""
        return self._pool is not None

    def publish(self, weights: WeightSource, version: int) -> tuple[WeightManifest | None, float]:
        """Publish ``version``; returns (the manifest when published on this thread, seconds here)."""
        if version == 0:  # every receiver starts from version 0: the group never carries it
            return super().publish(weights, version) if self._with_file() else (None, 0.0)
        t0 = time.perf_counter()
        self.wait()  # the send in flight is done with the host buffers
        manifest = None
        layout: list[list[Layout]] = []
        buffers: list[torch.Tensor] = []
        for i, bucket in enumerate(weights.buckets()):
            tensors = [t for _, t in bucket]
            layout.append([(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in bucket])
            buffers.append(flatten(tensors, CPU, self._host_buffer(i, flat_nbytes(tensors))))
        if self.collective:
            # announced before publish() returns, so before the learner admits the next step's
            # prompts: a generator that admits one finds this version waiting (η = 0 holds)
            announced = WeightManifest(
                version, *layout_columns(layout), checksum="", path="", nbytes=0, created=time.time()
            )
            publish_manifest(self.client, self.run_id, _collective(announced, layout))
            self._pending = self._pool.submit(self._send, version, layout, buffers, weights.device)
        else:
            manifest = self._write_file(version, layout, buffers)
            publish_manifest(self.client, self.run_id, manifest)
        return manifest, time.perf_counter() - t0

    def wait(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _host_buffer(self, i: int, nbytes: int) -> torch.Tensor:
        """Bucket ``i``'s host buffer of ``nbytes``, kept from version to version."""
        if i == len(self._host) or self._host[i].numel() != nbytes:
            self._host[i : i + 1] = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())]
        return self._host[i]

    # ----- rank 0, background thread -----
    def _open(self) -> None:
        try:
            self._group = open_group(self.group_info, 0, self.timeout_s, self._store)
        except Exception as e:  # noqa: BLE001 - a generator that never joined: files instead
            log.warning("the weight group did not form (%s: %s); publishing files", type(e).__name__, e)
            self._stop_group()

    def _stop_group(self) -> None:
        pool, self._pool, self._group = self._pool, None, None
        pool.shutdown(wait=False)  # called from the pool's (last) task

    def _send(
        self, version: int, layout: list[list[Layout]], buffers: list[torch.Tensor], device: torch.device
    ) -> None:
        """Background: write the file for receivers outside the group (re-announcing the version with
        its path), then broadcast the buckets; on any failure the version is published as a file."""
        t0 = time.perf_counter()
        written = None  # the file's manifest, once written
        try:
            if self._with_file():
                written = self._write_file(version, layout, buffers)
                publish_manifest(self.client, self.run_id, _collective(written, layout))
            send_buckets(self._group, version, buffers, device)
        except Exception as e:  # noqa: BLE001 - whatever broke the group, the run continues on files
            log.warning(
                "weight group failed at v%d (%s: %s); publishing files from now on", version, type(e).__name__, e
            )
            self._stop_group()
            self.fallbacks += 1
            publish_manifest(self.client, self.run_id, written or self._write_file(version, layout, buffers))
        finally:
            self.send_s += time.perf_counter() - t0

    def _write_file(self, version: int, layout: list[list[Layout]], buffers: list[torch.Tensor]) -> WeightManifest:
        """Stream the version from its host buffers into its file (no copy)."""
        names, shapes, dtypes = layout_columns(layout)
        tensors = unflatten_buckets(buffers, shapes, dtypes, [len(b) for b in layout])
        return write_weights(version, zip(names, tensors, strict=True), self.out_dir, self.keep)


def _collective(manifest: WeightManifest, layout: list[list[Layout]]) -> WeightManifest:
    """``manifest`` marked as broadcast over the group, with the tensors per bucket."""
    return dataclasses.replace(manifest, transport="collective", buckets=[len(b) for b in layout])


class CollectiveReceiver(FileReceiver):
    """``collective``: a generator joins the learner's weight group as rank ``rank + 1`` (its engine's
    workers from ``1 + rank · t`` when it is tensor-parallel over ``t`` GPUs) and receives
    each version's buckets; files are its fallback (and the evaluator's only way, outside the group)."""

    def __init__(
        self, client: Any, run_id: str, engine: WeightPort, name: str, group_rank: int | None, timeout_s: float
    ):
        super().__init__(client, run_id, engine, name)
        if group_rank is None:  # outside the group: files it must have (the learner writes them on request)
            want_files(client, run_id, self.name)
        self.group_rank, self.timeout_s, self.epoch = group_rank, timeout_s, ""
        self.in_group = group_rank is not None and self._join(group_rank, timeout_s)

    @classmethod
    def from_config(
        cls, cfg: Config, client: Any, engine: WeightPort, rank: int | None, name: str | None = None
    ) -> CollectiveReceiver:
        shards = tensor_parallel(cfg.cluster.gpus_per_generator)  # each worker of a tensor-parallel engine
        group_rank = None if rank is None else 1 + rank * shards  # is a rank: the engine's first is this
        return cls(
            client, cfg.run.name, engine, receiver_name(rank, name), group_rank, cfg.generation.weight_group_timeout_s
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
            self.engine.receive(
                function_ref(join_group), info=dataclasses.asdict(info), rank=group_rank, timeout_s=timeout_s
            )
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
        try:  # at once (the learner's send waits for every rank), applied under the in-flight policy
            version = self.engine.receive(
                function_ref(receive_broadcast),
                names=manifest.names,
                shapes=manifest.shapes,
                dtypes=manifest.dtypes,
                buckets=manifest.buckets,
            )
        except Exception as e:  # noqa: BLE001 - a broken group: the learner re-publishes as files
            log.warning("%s: weight broadcast failed (%s: %s); following weight files", self.name, type(e).__name__, e)
            self.close()
            return None
        return version, self.engine.apply(version, in_flight)

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
            self.engine.receive(function_ref(leave_group))
            self.in_group = False


# ----- engine side: on each worker of a generator's engine -----
def join_group(landing: Landing, info: dict[str, Any], rank: int, timeout_s: float) -> None:
    """Join the learner's weight group as ``rank`` plus this worker's rank in its engine (a
    tensor-parallel engine's workers each receive every bucket and load their own shard; blocks until
    every member joined)."""
    group_info = GroupInfo(**info)
    landing.state["group"] = open_group(group_info, rank + landing.rank, timeout_s)
    landing.state["device"] = device_for(group_info.backend)


def receive_broadcast(
    landing: Landing, names: list[str], shapes: list[list[int]], dtypes: list[str], buckets: list[int]
) -> int:
    """Receive the next broadcast version and hold it (applied when the engine says so); its number."""
    version, tensors = receive_tensors(landing.state["group"], names, shapes, dtypes, buckets, landing.state["device"])
    landing.hold(tensors)
    return version


def leave_group(landing: Landing) -> None:
    landing.state.pop("group", None)
    landing.drop()


class CollectiveDeployment(Deployment):
    """Only the receivers outside the group (the evaluator, a policy-following scorer) read files;
    the group has a rank for each configured generator (one per GPU under NCCL); a restarted run's
    generators must not join an earlier learner's group."""

    def shared_run_dir(self, cfg: Config) -> bool:
        return cfg.data.eval_size > 0 or cfg.credit.scorer.model == "policy"

    def group_size(self, cfg: Config) -> int | None:
        return cfg.cluster.generators

    def reset(self, client: Any, run_id: str) -> None:
        client.delete(group_key(run_id))
