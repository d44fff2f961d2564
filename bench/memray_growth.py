"""Which native allocation sites hold the memory a process gained: a memray capture, read back.

``bench/soak.py --no-ray --memray FILE`` records every allocation of the generator with its Python
and native stack (``memray run --native``). This reads the capture's temporal records: for each
allocation site, the bytes it holds live at two moments ``--from`` and ``--to`` (fractions of the
capture's duration; the default skips the start-up and the teardown), and prints the sites whose
live bytes grew most between them, with their stacks, beside the process's RSS and the traced heap
at both moments. A site whose live bytes grow steadily is a leak or an unbounded cache; RSS that
grows while the traced heap does not is the allocator's (free memory it keeps).

    python -P bench/memray_growth.py FILE [--from 0.4 --to 0.95 --top 12 --frames 14]
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict

from rredcot.launch.arguments import bounded_float, bounded_int

MIB = 2**20


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("capture", help="a memray capture file (memray run --native -o FILE)")
    p.add_argument(
        "--from", dest="start", type=bounded_float(0, 1), default=0.4, help="first moment, as a fraction of the capture"
    )
    p.add_argument(
        "--to", dest="end", type=bounded_float(0, 1), default=0.95, help="second moment, as a fraction of the capture"
    )
    p.add_argument("--top", type=bounded_int(1, 10**6), default=12, help="sites to print")
    p.add_argument("--frames", type=bounded_int(1, 10**4), default=14, help="stack frames to print per site")
    args = p.parse_args()
    if args.start >= args.end:
        p.error(f"--from {args.start:g} must come before --to {args.end:g}")
    return args


def live_bytes(intervals: list, snapshot: int) -> tuple[int, int]:
    """(bytes, allocations) of one site that are live at ``snapshot``: allocated before it and not
    freed before it."""
    n_bytes = n_allocs = 0
    for iv in intervals:
        freed = iv.deallocated_before_snapshot
        if iv.allocated_before_snapshot <= snapshot and (freed is None or freed > snapshot):
            n_bytes += iv.n_bytes
            n_allocs += iv.n_allocations
    return n_bytes, n_allocs


def frames(record, limit: int) -> list[str]:
    """The site's stack, innermost first: Python frames where there are some, native ones elsewhere."""
    try:
        stack = record.hybrid_stack_trace()
    except NotImplementedError:  # a capture without native frames
        stack = record.stack_trace()
    return [f"{func}  {file.rsplit('/', 2)[-1] if file else '?'}:{line}" for func, file, line in stack[:limit]]


def main() -> None:
    import memray

    args = parse()
    reader = memray.FileReader(args.capture)
    snaps = list(reader.get_memory_snapshots())
    t0, t1 = snaps[0].time, snaps[-1].time
    times = [s.time for s in snaps]
    at = [min(bisect.bisect_left(times, t0 + f * (t1 - t0)), len(snaps) - 1) for f in (args.start, args.end)]
    minutes = [(snaps[i].time - t0) / 60e3 for i in at]
    print(f"# {args.capture}: {len(snaps)} snapshots over {(t1 - t0) / 60e3:.1f} min")
    for i, m in zip(at, minutes):
        print(f"# at {m:.1f} min: RSS {snaps[i].rss / MIB:,.0f} MiB, traced heap {snaps[i].heap / MIB:,.0f} MiB")

    growth: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])  # site → [Δ bytes, blocks, bytes at the end]
    for record in reader.get_temporal_allocation_records(merge_threads=True):
        (b0, _), (b1, n1) = live_bytes(record.intervals, at[0]), live_bytes(record.intervals, at[1])
        if b1 == b0:
            continue
        site = tuple(frames(record, args.frames))
        g = growth[site]
        g[0] += b1 - b0
        g[1] += n1
        g[2] += b1
    ranked = sorted(growth.items(), key=lambda kv: -kv[1][0])
    total = sum(g[0] for g in growth.values())
    print(f"# live bytes of all sites: {total / MIB:+,.1f} MiB from {minutes[0]:.1f} to {minutes[1]:.1f} min\n")
    rows = []
    for site, (delta, allocs, held) in ranked[: args.top]:
        print(f"{delta / MIB:+9.2f} MiB   live at the end: {allocs:,} blocks, {held / MIB:,.1f} MiB")
        for f in site:
            print(f"        {f}")
        rows.append({"growth_mib": delta / MIB, "blocks": allocs, "held_mib": held / MIB, "top": site[:3]})
    print(json.dumps({"minutes": minutes, "growth_mib": total / MIB, "sites": rows}))


if __name__ == "__main__":
    main()
