"""The generator's work around its engine, alone: does its RSS grow per group?

The soak saw the demo generator's process creep while its engine alone stays flat
(``bench/generator_memory.py``) and its Python heap does too (the traced soak). This runs, in one
process without vLLM or Ray, everything else the generator does for each finished group, on a
real tokenizer, verifier and Redis server: the prompt's chat template, the decoding and the
verification of ``group_size`` completions (random tokens of 1 to ``max_tokens``, every other one
followed by the reference solution, so that its answer goes to the verifier), the record's
msgpack encoding, its XADD to a bounded stream (trimmed as a consumer would) and the metrics
publication. After every ``--every`` groups: this process's RSS (not the verifier's or Redis's) and
the number of Python objects. Prints the trend; the last line is one JSON object.

Usage: python -P bench/rollout_io_memory.py [--config demo_cpu --groups 6000 --every 200]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bench.trend

from bench.trend import MIB, print_results, slope  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="demo_cpu")
    p.add_argument("--groups", type=int, default=6000)
    p.add_argument("--every", type=int, default=200)
    args = p.parse_args()
    from rredcot.actors.engine import Completion, EngineSpec, GroupOutput
    from rredcot.actors.rollouts import rollout_group
    from rredcot.common.codec import encode
    from rredcot.common.config import load_config
    from rredcot.common.control import RunControl
    from rredcot.common.precision import cpu_info
    from rredcot.common.streams import Producer, connect
    from rredcot.launch.services import EmbeddedRedis
    from rredcot.models.store import load_tokenizer
    from rredcot.tasks.data import ProblemOrder, train_and_held_out
    from rredcot.tasks.prompts import prompt_ids
    from rredcot.tasks.verifier import Verifier

    cfg = load_config(args.config, [])
    g = cfg.generation
    tokenizer = load_tokenizer(EngineSpec.from_config(cfg).model)
    rng = np.random.default_rng(0)
    proc = psutil.Process()
    rows = []
    print(f"# {args.config}, {args.groups} groups of {g.group_size}; CPU: {cpu_info().describe()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(tmp, appendonly=False) as server:
        client = connect(server.url)
        control = RunControl(client, "bench")
        producer = Producer(client, "bench:rollouts", maxlen=256)
        verifier = Verifier.from_config(cfg)
        order = ProblemOrder(train_and_held_out(verifier.task, cfg.data, cfg.run.seed)[0], cfg.data.shuffle_seed)
        t0 = time.perf_counter()
        for i in range(args.groups):
            problem = order.at(i)
            group = GroupOutput(f"bench-{i}", prompt_ids(problem, verifier.task, cfg.data, tokenizer), [], 0)
            answer = tokenizer("\n".join(verifier.task.reference(problem)), add_special_tokens=False)["input_ids"]
            for k in range(g.group_size):
                n = int(rng.integers(1, g.max_tokens + 1))
                ids = rng.integers(0, len(tokenizer), n).tolist() + (answer if k % 2 else [])  # half are verified
                c = Completion(finish_reason="stop")
                c.extend(ids, (-rng.random(len(ids))).tolist(), 0)
                group.completions.append(c)
            record = rollout_group(group, problem, i, "bench", verifier.task, tokenizer, verifier)
            producer.put(encode(record))
            if client.xlen("bench:rollouts") >= 128:  # the redistributor's reads and acks, as a trim
                client.xtrim("bench:rollouts", maxlen=0)
            control.publish_metrics("gen0", "generator", {"finished_groups": i + 1})
            if (i + 1) % args.every == 0:
                row = {"groups": i + 1, "rss": proc.memory_info().rss / MIB, "objects": len(gc.get_objects())}
                rows.append(row | {"s": time.perf_counter() - t0})
                print(json.dumps(rows[-1]), flush=True)
        verifier.close()
    half = rows[len(rows) // 2 :]
    result = {
        "rss_first": rows[0]["rss"],
        "rss_last": rows[-1]["rss"],
        "rss_slope_2nd_half_per_1000_groups": 1000 / args.every * slope([r["rss"] for r in half]),
        "objects_first": rows[0]["objects"],
        "objects_last": rows[-1]["objects"],
        "ms_per_group": 1000 * rows[-1]["s"] / args.groups,
    }
    print_results({"rollout io": result})


if __name__ == "__main__":
    main()
