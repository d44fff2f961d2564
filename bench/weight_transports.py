"""Weight transports side by side: file vs collective vs ipc, one learner rank 0 and one receiver.

For each transport and each version: the seconds the training thread is blocked in ``publish`` and
the seconds until the receiver holds the version's tensors (file: the verified safetensors file
read back; collective: the buckets received and checked by a receiver thread in the group, gloo on
CPU; ipc: the slot copied out and its stamp checked). The model is random and Qwen3-shaped, by
default near the CPU demo's SmolLM2-135M (hidden 576, 30 layers, 9 heads, vocab 49,152; its MLP is
narrower: 114M parameters), in float32 (the demo's dtype on CPUs without native bf16). The
receiver's own apply (vLLM's ``reload_weights``) is the same for every transport and left out.
Real Redis (embedded), real files in a temporary directory, real /dev/shm. Prints a table; the
last line is one JSON object.
Usage: python -P bench/weight_transports.py [--versions 5 --hidden 576 --layers 30 ...]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from rredcot.common.precision import cpu_info
from rredcot.launch.arguments import bounded_int
from rredcot.learner.weights import publish
from rredcot.transports.collective import CollectivePublisher
from rredcot.transports.file import FilePublisher
from rredcot.transports.group import open_group, read_group, receive_tensors
from rredcot.transports.ipc import IpcPublisher
from rredcot.transports.manifest import latest_manifest, load_tensors
from rredcot.transports.slots import SlotReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.learner_samples
from tests.learner_samples import tiny_lm  # noqa: E402

CPU = torch.device("cpu")
TRANSPORTS = ("file", "collective", "ipc")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--versions", type=bounded_int(1, 10**6), default=5, help="timed versions per transport (after 1 warm-up)"
    )
    p.add_argument("--hidden", type=bounded_int(1, 10**6), default=576)
    p.add_argument("--layers", type=bounded_int(1, 10**4), default=30)
    p.add_argument("--vocab", type=bounded_int(1, 10**7), default=49152)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return p.parse_args()


def delivery_times(module, client, out: str, transport: str, versions: int) -> tuple[float, float]:
    """Median (seconds ``publish`` blocks the training thread, seconds until the receiver holds the
    tensors) over ``versions`` versions after a warm-up one."""
    run_id = f"bench-{transport}"
    received: queue.Queue = queue.Queue()
    if transport == "collective":
        publisher = CollectivePublisher(
            client, run_id, out, group_address="127.0.0.1", receivers=1, file_too=False, timeout_s=300
        )

        def receive() -> None:
            member = open_group(read_group(client, run_id), 1, 300)
            for v in range(1, versions + 2):
                while (m := latest_manifest(client, run_id)) is None or m.version < v:
                    time.sleep(0.001)
                receive_tensors(member, m.names, m.shapes, m.dtypes, m.buckets, CPU)
                received.put(time.perf_counter())

        threading.Thread(target=receive, daemon=True).start()
    else:
        publisher = (IpcPublisher if transport == "ipc" else FilePublisher)(client, run_id, out)
    slots = SlotReader(client, run_id, "bench")
    blocking, delivery = [], []
    for v in range(1, versions + 2):
        t0 = time.perf_counter()
        seconds = publish(publisher, module, v)[1]
        if transport == "collective":
            done = received.get(timeout=300)
        else:
            m = latest_manifest(client, run_id)
            assert (slots.read(m, CPU) if transport == "ipc" else load_tensors(m)) is not None
            done = time.perf_counter()
        if v > 1:  # the first version allocates the buffers
            blocking.append(seconds)
            delivery.append(done - t0)
    publisher.close()
    return statistics.median(blocking), statistics.median(delivery)


def main() -> None:
    args = parse()
    model = tiny_lm(0, vocab_size=args.vocab, hidden=args.hidden, layers=args.layers, heads=9, kv_heads=3)
    model = model.to(getattr(torch, args.dtype))
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows: dict[str, tuple[float, float]] = {}
    from rredcot.common.streams import connect
    from rredcot.launch.services import EmbeddedRedis

    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(f"{tmp}/redis") as server:
        client = connect(server.url)
        for transport in TRANSPORTS:
            rows[transport] = delivery_times(model, client, f"{tmp}/{transport}", transport, args.versions)
        client.close()
    result = {
        "weights_mib": nbytes / 2**20,
        **{f"{t}_blocking_s": rows[t][0] for t in TRANSPORTS},
        **{f"{t}_delivery_s": rows[t][1] for t in TRANSPORTS},
        "ipc_vs_file_delivery": rows["file"][1] / rows["ipc"][1],
        "ipc_vs_collective_delivery": rows["collective"][1] / rows["ipc"][1],
        "ipc_vs_file_blocking": rows["file"][0] / rows["ipc"][0],
        "collective_vs_file_delivery": rows["file"][1] / rows["collective"][1],
    }
    size = f"{nbytes / 2**20:,.0f} MiB of {args.dtype} weights"
    print(f"weight transports: {size}, {args.versions} versions; CPU: {cpu_info().describe()}")
    print(f"  {'transport':<12} {'blocking s':>10} {'delivery s':>10}")
    for t in TRANSPORTS:
        print(f"  {t:<12} {rows[t][0]:10.3f} {rows[t][1]:10.3f}")
    for name in [k for k in result if "_vs_" in k]:
        print(f"  {name:<28} {result[name]:6.2f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
