"""Implementation of the queue benchmark; run it as ``python bench/queue.py`` or ``rredcot bench queue``."""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from rredcot.common.codec import decode, encode
from rredcot.common.records import RolloutGroup, RolloutRecord, new_id
from rredcot.common.streams import DEAD, Consumer, Producer, connect, ensure_group, key
from rredcot.launch.services import EmbeddedRedis


def make_group(tokens: int, seed: int) -> RolloutGroup:
    rng = np.random.default_rng(seed)
    gid = new_id()
    sample = RolloutRecord(
        id=new_id(),
        group_id=gid,
        prompt_id="p",
        sample_index=0,
        completion_ids=rng.integers(0, 151_000, tokens, dtype=np.int32),
        behaviour_logprobs=-rng.random(tokens, dtype=np.float32),
        version_runs=np.zeros((1, 2), np.int32),
        finish_reason="length",
        reward=0.0,
        verdict="wrong",
    )
    return RolloutGroup(
        group_id=gid,
        prompt_id="p",
        prompt_ids=rng.integers(0, 1000, 200, dtype=np.int32),
        ref_solution_ids=[],
        ref_answer_ids=[],
        samples=[sample],
    )


def run_layer(client, payloads: list[bytes], batch: int, run: str) -> float:
    prod = Producer(client, key(run, "s"), maxlen=4 * batch)
    cons = Consumer(client, key(run, "s"), "g", "c", key(run, DEAD), claim_idle_ms=60_000)
    t0 = time.perf_counter()
    for i in range(0, len(payloads), batch):
        for p in payloads[i : i + batch]:
            prod.put(p)
        got = cons.read(count=batch, block_ms=1000)
        cons.ack([e.id for e in got])
    return time.perf_counter() - t0


def run_raw(client, payloads: list[bytes], batch: int, run: str) -> float:
    stream = key(run, "s")
    ensure_group(client, stream, "g")
    t0 = time.perf_counter()
    for i in range(0, len(payloads), batch):
        for p in payloads[i : i + batch]:
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
    for name in ("records", "tokens", "batch", "repeats"):
        if getattr(args, name) < 1:  # --records 0 used to end in a ZeroDivisionError
            ap.error(f"--{name} must be >= 1 (got {getattr(args, name)})")

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
    print(
        json.dumps(
            {
                "records": n,
                "tokens": args.tokens,
                "record_kb": round(mb / n * 1000, 1),
                "layer_records_s": round(n / t_layer, 1),
                "layer_mb_s": round(mb / t_layer, 1),
                "raw_records_s": round(n / t_raw, 1),
                "raw_mb_s": round(mb / t_raw, 1),
                "stream_vs_raw": round(t_raw / t_layer, 3),
                "encode_mb_s": round(mb / t_enc, 1),
                "decode_mb_s": round(mb / t_dec, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
