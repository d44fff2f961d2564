"""``rredcot advise RUN_DIR`` or ``rredcot advise --params … --total N``: the command around
``observe.advise``'s model of a split."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from rredcot.common.errors import UserError
from rredcot.launch.observe.advise import TIERS, advise, predict, run_rates, table
from rredcot.launch.observe.paper_rates import Workload, paper_rates


def advise_command(args: argparse.Namespace) -> int:
    """``rredcot advise``: the splits that a run's measured rates (or, without a run, rates on paper)
    predict, as a short table; ``args`` as ``launch.cli`` parses them."""

    if args.run_dir:
        try:
            rates, own_split, measured, cfg = run_rates(Path(args.run_dir))
        except (FileNotFoundError, ValueError) as e:
            raise UserError(str(e)) from None
        on_cpu = not any(cfg["cluster"][f"gpus_per_{t}"] for t in TIERS)
        if args.cores is not None:
            rates = dataclasses.replace(rates, cores=args.cores)
        elif on_cpu:  # a CPU run's workers share this machine's cores
            rates = dataclasses.replace(rates, cores=os.cpu_count() or 1)
        scorer = on_cpu or bool(cfg["cluster"]["gpus_per_redistributor"])
        total = args.total or own_split.generator + own_split.redistributor + own_split.learner
        own = predict(own_split, rates)
        unit = "worker" if on_cpu else "GPU"
    else:
        if not (args.params and args.layers and args.heads and args.kv_heads and args.total):
            raise UserError("advise: give a run directory, or --params, --layers, --heads, --kv-heads and --total")
        if args.kv_heads > args.heads:
            raise UserError(f"advise: --kv-heads {args.kv_heads} is more than --heads {args.heads}")
        work = Workload(
            args.params,
            args.layers,
            args.heads,
            args.kv_heads,
            args.head_dim,
            args.prompt,
            args.completion,
            args.scored,
        )
        rates, scorer, total, own, measured = (
            paper_rates(work, overlap=not args.sync),
            args.scored > 0,
            args.total,
            None,
            None,
        )
        unit = "GPU"
    if scorer and total < 3:
        raise UserError(
            f"advise: --total {total} cannot hold a generator, a redistributor and a learner: give --total 3 or more"
        )
    print(
        f"per {unit} samples/s: generator {rates.generator:.3g}, redistributor {rates.redistributor:.3g}, "
        f"learner {rates.learner:.3g} ({'overlapped' if rates.overlap else 'alternating'} tiers)"
    )
    if rates.cores and rates.cpu_per_sample:
        print(
            f"shared cores: {rates.cores:g}, at {rates.cpu_per_sample:.3g} CPU s per trained sample (every worker): "
            f"at most {rates.cores / rates.cpu_per_sample:.3g} samples/s whatever the split"
        )
    keep = own.split if own else None
    print(table(advise(total, rates, scorer, keep=keep), own, measured))
    return 0
