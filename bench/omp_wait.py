"""OpenMP's wait policy on a CPU shared by several workers: why every worker starts passive.

A learner-like step (forward, backward and AdamW on a SmolLM2-135M-shaped Llama, random weights,
one packed row of ``--tokens`` tokens) runs with 2 torch threads beside ``--busy`` single-threaded
processes that multiply matrices in a loop (the generator and redistributor of a 2-core demo).
Cases, each in a fresh process (OpenMP reads the policy when it loads): threads 2 with the policy
unset (libgomp spins at a barrier before it sleeps), threads 2 passive (``OMP_WAIT_POLICY=PASSIVE``:
sleeps at once), threads 1. Per case: the learner's seconds and CPU seconds per step, and the
neighbours' work rate (loops/s). Quiet rows (no neighbours) show what passive costs alone. The
last line (JSON): beside the neighbours, spinning ÷ passive for the step's seconds and CPU seconds,
and the neighbours' rate passive ÷ spinning.

Usage: python -P bench/omp_wait.py [--busy 2 --steps 3 --tokens 1360 --layers 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

CASES = (("2", None), ("2", "PASSIVE"), ("1", None))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--busy", type=int, default=2, help="single-threaded neighbour processes")
    p.add_argument("--steps", type=int, default=3, help="timed learner steps per case (after 1 warm-up)")
    p.add_argument("--tokens", type=int, default=1360, help="tokens per step (the demo's: ~1,360)")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this process, print JSON
    return p.parse_args()


def neighbour(stop, loops) -> None:  # noqa: ANN001 (multiprocessing's Event and Value)
    """A single-threaded worker's stand-in: matmuls until ``stop``; ``loops``: how many it finished."""
    import torch

    torch.set_num_threads(1)
    a, w, n = torch.randn(256, 576), torch.randn(576, 1536), 0
    while not stop.is_set():
        for _ in range(20):
            (a @ w).relu_()
        n += 1
    loops.value = n


def run_case(args: argparse.Namespace, busy: int) -> dict[str, float]:
    """The learner's steps beside ``busy`` neighbours, in this process (threads from the environment)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
        num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randint(0, shape.vocab_size, (1, args.tokens))

    def step() -> None:
        model(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # warm-up
    ctx = mp.get_context("spawn")
    stop, counters = ctx.Event(), [ctx.Value("l", 0) for _ in range(busy)]
    procs = [ctx.Process(target=neighbour, args=(stop, c)) for c in counters]
    for p in procs:
        p.start()
    time.sleep(3 if busy else 0)  # the neighbours import torch and start
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.steps):
        step()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stop.set()
    for p in procs:
        p.join()
    loops = sum(c.value for c in counters)
    return {"step_s": wall / args.steps, "cpu_s": cpu / args.steps, "loops_per_s": loops / wall}


def main() -> None:
    args = parse()
    if args.case:
        print(json.dumps(run_case(args, int(args.case))))
        return
    from rredcot.common.precision import cpu_info

    print(f"OpenMP wait policy: a learner step of {args.tokens} tokens, {args.layers} layers")
    print(f"CPU: {cpu_info().describe()}")
    print(f"  {'neighbours':>10} {'threads':>7} {'policy':>8} {'step s':>7} {'CPU s/step':>10} {'their loops/s':>13}")
    rows = {}
    for busy in (0, args.busy):
        for threads, policy in CASES:
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | {"OMP_NUM_THREADS": threads}
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            argv = [sys.executable, "-P", __file__, "--case", str(busy), "--steps", str(args.steps)]
            argv += ["--tokens", str(args.tokens), "--layers", str(args.layers)]
            out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
            r = rows[busy, threads, policy] = json.loads(out.strip().splitlines()[-1])
            loops = f"{r['loops_per_s']:13.2f}" if busy else f"{'—':>13}"
            row = f"  {busy:>10} {threads:>7} {policy or 'unset':>8} {r['step_s']:7.2f} {r['cpu_s']:10.2f} {loops}"
            print(row, flush=True)
    spin, passive = rows[args.busy, "2", None], rows[args.busy, "2", "PASSIVE"]
    ratios = {
        "spin_vs_passive_step_s": spin["step_s"] / passive["step_s"],
        "spin_vs_passive_cpu_s": spin["cpu_s"] / passive["cpu_s"],
        "neighbours_passive_vs_spin": passive["loops_per_s"] / max(spin["loops_per_s"], 1e-9),
    }
    print(json.dumps({k: round(v, 3) for k, v in ratios.items()}))


if __name__ == "__main__":
    main()
