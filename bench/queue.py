"""Queue benchmark: 25k-token rollout records through the stream layer vs raw redis-py, and the codec.

Both paths move the same encoded payloads through a real embedded server in the same run, in
rounds of ``--batch`` records: put each record, read the batch through a consumer group, ack and
delete it. The raw path uses plain XADD / XREADGROUP / XACK / XDEL; the layer adds the bounded
put (Lua), reclaim check and transactional ack+delete. Last line: one JSON object.

    python bench/queue.py [--records 400] [--tokens 25000] [--batch 16]
"""

from __future__ import annotations

import os
import sys

if __name__ == "queue":
    # Running any ``python bench/<x>.py`` puts bench/ first on sys.path, so a plain ``import queue``
    # (redis-py does one) lands here. Hand the importer the standard-library module instead: the
    # import system returns whatever sys.modules holds under the name once this file has run.
    import importlib.util
    import sysconfig

    _spec = importlib.util.spec_from_file_location("queue", os.path.join(sysconfig.get_paths()["stdlib"], "queue.py"))
    sys.modules["queue"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["queue"])

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from rredcot.common.codec import decode, encode  # noqa: E402
from rredcot.common.records import RolloutGroup, RolloutRecord, new_id  # noqa: E402
from rredcot.common.streams import DEAD, Consumer, Producer, connect, ensure_group, key  # noqa: E402
from rredcot.launch.services import EmbeddedRedis  # noqa: E402


def make_group(tokens: int, seed: int) -> RolloutGroup:
    rng = np.random.default_rng(seed)
    gid = new_id()
    sample = RolloutRecord(
        id=new_id(), group_id=gid, prompt_id="p", sample_index=0,
        completion_ids=rng.integers(0, 151_000, tokens, dtype=np.int32),
        behaviour_logprobs=-rng.random(tokens, dtype=np.float32),
        version_runs=np.zeros((1, 2), np.int32), finish_reason="length", reward=0.0, verdict="wrong",
    )
    return RolloutGroup(group_id=gid, prompt_id="p", prompt_ids=rng.integers(0, 1000, 200, dtype=np.int32),
                        ref_solution_ids=[], ref_answer_ids=[], samples=[sample])


def run_layer(client, payloads: list[bytes], batch: int, run: str) -> float:
    prod = Producer(client, key(run, "s"), maxlen=4 * batch)
    cons = Consumer(client, key(run, "s"), "g", "c", key(run, DEAD), claim_idle_ms=60_000)
    t0 = time.perf_counter()
    for i in range(0, len(payloads), batch):
        for p in payloads[i:i + batch]:
            prod.put(p)
        got = cons.read(count=batch, block_ms=1000)
        cons.ack([e.id for e in got])
    return time.perf_counter() - t0


def run_raw(client, payloads: list[bytes], batch: int, run: str) -> float:
    stream = key(run, "s")
    ensure_group(client, stream, "g")
    t0 = time.perf_counter()
    for i in range(0, len(payloads), batch):
        for p in payloads[i:i + batch]:
            client.xadd(stream, {"d": p})
        reply = client.xreadgroup("g", "c", {stream: ">"}, count=batch, block=1000)
        ids = [eid for _, entries in reply for eid, _ in entries]
        client.xack(stream, "g", *ids)
        client.xdel(stream, *ids)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=25_000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    groups = [make_group(args.tokens, i) for i in range(args.records)]
    t0 = time.perf_counter()
    payloads = [encode(g) for g in groups]
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for p in payloads:
        decode(p, RolloutGroup)
    t_dec = time.perf_counter() - t0
    mb = sum(map(len, payloads)) / 1e6

    with tempfile.TemporaryDirectory() as d, EmbeddedRedis(d, appendonly=False) as server:
        client = connect(server.url)
        run_raw(client, payloads[: args.batch * 2], args.batch, "warm")  # warm the server
        layer, raw = [], []
        for r in range(args.repeats):  # interleave to share any drift fairly
            raw.append(run_raw(client, payloads, args.batch, f"raw{r}"))
            layer.append(run_layer(client, payloads, args.batch, f"layer{r}"))
    t_layer, t_raw = min(layer), min(raw)
    n = args.records
    rows = [
        ("stream layer", n / t_layer, mb / t_layer),
        ("raw redis-py", n / t_raw, mb / t_raw),
        ("codec encode", n / t_enc, mb / t_enc),
        ("codec decode+validate", n / t_dec, mb / t_dec),
    ]
    print(f"{args.records} records x {args.tokens} tokens ({mb / n * 1000:.0f} KB each), batch {args.batch}")
    print(f"{'path':<24}{'records/s':>12}{'MB/s':>10}")
    for name, rps, mbps in rows:
        print(f"{name:<24}{rps:>12.0f}{mbps:>10.0f}")
    print(f"stream layer / raw: {t_raw / t_layer:.3f}")
    print(json.dumps({
        "records": n, "tokens": args.tokens, "record_kb": round(mb / n * 1000, 1),
        "layer_records_s": round(n / t_layer, 1), "layer_mb_s": round(mb / t_layer, 1),
        "raw_records_s": round(n / t_raw, 1), "raw_mb_s": round(mb / t_raw, 1),
        "stream_vs_raw": round(t_raw / t_layer, 3),
        "encode_mb_s": round(mb / t_enc, 1), "decode_mb_s": round(mb / t_dec, 1),
    }))


if __name__ == "__main__":
    main()
