"""Run control plane in Redis: the stop flag and the metrics stream every tier reports into.

Each tier (generator, redistributor, learner) calls ``report(tier, worker, values)`` now and then;
the driver reads the ``metrics`` stream for the live display, TensorBoard and the report's
curves. Values are plain numbers; entries are msgpack maps (no pickle).
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
import redis

from rredcot.common.streams import key

METRICS_MAXLEN = 100_000  # approximate cap; old metric points are dropped, never data records


class RunControl:
    def __init__(self, client: redis.Redis, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self.stop_key = key(run_id, "stop")
        self.metrics_key = key(run_id, "metrics")

    def request_stop(self, reason: str = "done") -> None:
        self.client.set(self.stop_key, reason)

    def stop_requested(self) -> bool:
        return bool(self.client.exists(self.stop_key))

    def clear_stop(self) -> None:
        self.client.delete(self.stop_key)

    def report(self, tier: str, worker: str, values: dict[str, float | int], step: int | None = None) -> None:
        """Append one metrics point of a tier's worker."""
        point = {"tier": tier, "worker": worker, "t": time.time(), "step": step,
                 "values": {k: float(v) for k, v in values.items()}}
        self.client.xadd(self.metrics_key, {"m": msgpack.packb(point)}, maxlen=METRICS_MAXLEN, approximate=True)

    def read_metrics(self, after: bytes = b"0-0", count: int = 10_000) -> tuple[bytes, list[dict[str, Any]]]:
        """Metric points after the given entry id; returns (last id, points)."""
        entries = self.client.xrange(self.metrics_key, min=b"(" + after, count=count)
        if not entries:
            return after, []
        return entries[-1][0], [msgpack.unpackb(fields[b"m"]) for _, fields in entries]
