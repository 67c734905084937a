"""Frontier throughput and the master store's memory: N URLs pushed through the durable frontier.

    python scripts/bench_frontier.py [--count 10000000] [--batch 10000] [--nodes 4] [--dir /tmp/...]

Pushes every URL (batches, one transaction each, as the master does), then pops them all back node by node in
batches, and prints URLs/s for each phase and the process's peak RSS (VmHWM) with the whole frontier queued.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawler.master.store import MasterStore  # noqa: E402


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-frontier-", dir=args.dir))
    nodes = [f"node{i}" for i in range(args.nodes)]
    try:
        store = MasterStore(work / "master.db")
        t0 = time.perf_counter()
        for start in range(0, args.count, args.batch):
            rows = [(f"https://music.example.org/song/{i}.html?list={i % 97}", i % 6, i & 1,
                     nodes[i % len(nodes)], None) for i in range(start, min(start + args.batch, args.count))]
            store.push(rows)
            store.commit()
        push_s = time.perf_counter() - t0
        queued = store.frontier_size()
        rss_queued = peak_rss_mb()
        t0 = time.perf_counter()
        popped = 0
        for node in nodes:
            while batch := store.pop(node, args.batch, 0.0):
                popped += len(batch)
                store.commit()
        pop_s = time.perf_counter() - t0
        store.close()
        size = (work / "master.db").stat().st_size
        print(f"URLs               {args.count:,} in batches of {args.batch:,} over {args.nodes} nodes")
        print(f"push               {args.count / push_s:,.0f} URLs/s ({push_s:.1f} s)")
        print(f"pop                {popped / pop_s:,.0f} URLs/s ({pop_s:.1f} s)")
        print(f"queued at the peak {queued:,}")
        print(f"peak RSS           {rss_queued:.0f} MB with the frontier full, {peak_rss_mb():.0f} MB at the end")
        print(f"database on disk   {size / 1e6:.0f} MB ({size / args.count:.0f} bytes per URL)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
