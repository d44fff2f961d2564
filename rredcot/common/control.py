"""Run control plane in Redis: the stop flag and each worker's latest metrics snapshot.

Every worker (``gen0``, ``red0``, ``learner0``, …) keeps one hash ``rredcot:<run>:metrics:<worker>``
with its cumulative counters and latest values, including a ``tier`` field; the driver polls them
for the live display, TensorBoard and the report's curves. Each key is in the run's registry
(``streams.registry_key``), which is also how the driver finds the workers' hashes: no key pattern.
"""

from __future__ import annotations

import os
import time

import redis

from rredcot.common.streams import key, registry_key


class RunControl:
    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.stop_key = key(run_id, "stop")
        self.registry = registry_key(run_id)
        self._metrics_prefix = key(run_id, "metrics:")
        self._cpu_start: float | None = None

    def request_stop(self, reason: str = "done") -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.registry, self.stop_key)
        pipe.set(self.stop_key, reason)
        pipe.execute()

    def stop_requested(self) -> bool:
        return bool(self.client.exists(self.stop_key))

    def clear_stop(self) -> None:
        self.client.delete(self.stop_key)

    def count_restart(self, worker: str) -> None:
        """One more restart of ``worker`` (its ``restarts`` metric; its snapshots never overwrite it)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.registry, self._metrics_prefix + worker)
        pipe.hincrby(self._metrics_prefix + worker, "restarts", 1)
        pipe.execute()

    def publish_metrics(self, worker: str, tier: str, values: dict[str, float]) -> None:
        """Replace-or-add the worker's values, plus ``cpu_s``: this process's CPU seconds since its
        first report (so start-up — imports, model loading — is not counted as work), and ``pid``."""
        if self._cpu_start is None:
            self._cpu_start = time.process_time()
        cpu = time.process_time() - self._cpu_start
        mapping = {"tier": tier, **{k: float(v) for k, v in values.items()}, "cpu_s": cpu, "pid": os.getpid()}
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(self.registry, self._metrics_prefix + worker)
        pipe.hset(self._metrics_prefix + worker, mapping=mapping)
        pipe.execute()

    def all_metrics(self) -> dict[str, dict[str, float | str]]:
        """worker -> its latest snapshot (``tier`` as text, everything else as float)."""
        names = sorted(k.decode() for k in self.client.smembers(self.registry))
        names = [n for n in names if n.startswith(self._metrics_prefix)]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        out: dict[str, dict[str, float | str]] = {}
        for name, raw in zip(names, pipe.execute(), strict=True):
            if raw:
                out[name.removeprefix(self._metrics_prefix)] = {
                    k.decode(): (v.decode() if k == b"tier" else float(v)) for k, v in raw.items()
                }
        return out
