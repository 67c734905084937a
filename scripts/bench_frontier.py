"""Frontier throughput and the master store's memory: N new URLs pushed through the durable frontier.

    python scripts/bench_frontier.py [--count 10000000] [--batch 10000] [--nodes 4] [--hosts 5000]
                                     [--workload pages|random] [--dir /tmp/...]

Pushes every URL in batches, one transaction each (the master commits a batch every 100-200 ms), then pops them
all back, node by node, one transaction per batch, and prints URLs/s for each phase, the peak RSS (VmHWM) with
the whole frontier queued, and the database size.

Workloads: "pages" is what the master sees: each page reports ~50 new links, 45 of them on its own host, and
one batch holds the links of many pages on random hosts. "random" puts every URL on a random host, the worst
case for the URL index (no two URLs of a batch share an index page).
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawler.master.store import MasterStore

LINKS_PER_PAGE = 50
SAME_HOST = 45


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batches(count: int, batch: int, hosts: int, workload: str, nodes: list[str], seed: int = 1):
    """Rows (url, depth, priority, node, parent) of `count` distinct URLs, `batch` at a time."""
    rnd = random.Random(seed)
    i = 0
    while i < count:
        rows = []
        n = min(batch, count - i)
        while len(rows) < n:
            host = rnd.randrange(hosts)
            parent = f"https://site{host}.example.com/list/{rnd.getrandbits(24):x}.html"
            for k in range(min(LINKS_PER_PAGE, n - len(rows))):
                h = host if workload == "pages" and k < SAME_HOST else rnd.randrange(hosts)
                url = f"https://site{h}.example.com/music/{rnd.getrandbits(32):08x}/song-{i}.html"
                rows.append((url, i % 6, i % 3, nodes[i % len(nodes)], parent))
                i += 1
        yield rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=5000)
    ap.add_argument("--workload", choices=["pages", "random"], default="pages")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-frontier-", dir=args.dir))
    nodes = [f"node{i}" for i in range(args.nodes)]
    try:
        store = MasterStore(work / "master.db")
        gen_s = push_s = 0.0
        t = time.perf_counter()
        for rows in batches(args.count, args.batch, args.hosts, args.workload, nodes):
            t0 = time.perf_counter()
            gen_s += t0 - t
            store.push(rows)
            store.commit()
            t = time.perf_counter()
            push_s += t - t0
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
        size = sum(p.stat().st_size for p in work.iterdir())
        print(f"URLs               {args.count:,} ({args.workload}) in batches of {args.batch:,} "
              f"over {args.nodes} nodes and {args.hosts:,} hosts")
        print(f"push               {args.count / push_s:,.0f} URLs/s ({push_s:.1f} s; "
              f"generating them took another {gen_s:.1f} s, not counted)")
        print(f"pop                {popped / pop_s:,.0f} URLs/s ({pop_s:.1f} s, {popped:,} URLs)")
        print(f"queued at the peak {queued:,}")
        print(f"peak RSS           {rss_queued:.0f} MB with the frontier full, {peak_rss_mb():.0f} MB at the end")
        print(f"database on disk   {size / 1e6:,.0f} MB ({size / args.count:.0f} bytes per URL)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
