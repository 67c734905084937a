"""Frontier throughput and the master store's size: N new URLs pushed through the durable frontier, then popped.

    python scripts/bench_frontier.py [--count 10000000] [--batch 10000] [--nodes 4] [--hosts 5000]
                                     [--workload pages|random] [--dir /tmp/...] [--store postgresql://...]

Pushes every URL in batches, one transaction each (the master commits a batch every 100-200 ms), as the master
pushes links its Bloom filter never saw (``unseen``: the store indexes them without looking them up first); after
each tenth, pops 1% of the run's URLs, node by node, one transaction per batch, as the master pops between pushes.
Prints the push and pop rates in each tenth of the run as it goes (a store whose ingest falls as it grows shows it here), in URLs per second of wall time and per second
of the process's CPU time (user + system: on a shared machine the wall time says as much about the neighbours), the peak RSS (VmHWM) with the whole frontier queued,
the bytes per URL on disk, and a projection to a billion URLs from the measured curve.

Workloads: "pages" is what the master sees: each page reports ~50 new links, 45 of them on its own host, and
one batch holds the links of many pages on random hosts; a page's links name it as their parent, a URL found
earlier on its host, as in a crawl. "random" puts every URL on a random host, the worst case for locality.

--store postgresql://... runs against that (empty) database instead of an SQLite file in --dir; --store pg-temp
starts a throwaway PostgreSQL cluster for the run (testkit/pgcluster.py; 256 MB of shared buffers, fsync on).
The PostgreSQL size is pg_total_relation_size of the store's tables (heap, indexes and TOAST), its WAL aside.
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawler.master.store import MasterStore

LINKS_PER_PAGE = 50
SAME_HOST = 45


class Control:
    """A small store fed its own batches of the same workload between the run's batches: the same code on the same
    machine in the same minutes, with a table that never grows past CONTROL_MAX URLs (it is started again).

    On a shared machine the same work takes 20-40% more or less CPU time from one minute to the next (cores and
    caches shared with others), which hides whether the store's own cost grows. The run's CPU per URL divided by
    the control's, measured in the same tenth, does not move with the machine: if it stays flat, so does the
    store's cost per URL as its table grows."""

    def __init__(self, batch: int, hosts: int, workload: str, nodes: list[str], parent: Path) -> None:
        self.args = (batch, hosts, workload, nodes)
        self.parent = parent
        self.store: MasterStore | None = None
        self.rows: Any = None
        self.cpu = 0.0
        self.urls = 0
        self._restart()

    def _restart(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.parent / "control", ignore_errors=True)
        (self.parent / "control").mkdir()
        self.store = MasterStore(self.parent / "control" / "master.db")
        batch, hosts, workload, nodes = self.args
        self.rows = batches(CONTROL_MAX, batch, hosts, workload, nodes, seed=2)

    def step(self) -> None:
        rows = next(self.rows, None)
        if rows is None:
            self._restart()
            rows = next(self.rows)
        assert self.store is not None
        c0 = time.process_time()
        self.store.push(rows, unseen=True)
        self.store.commit()
        self.cpu += time.process_time() - c0
        self.urls += len(rows)

    def take(self) -> float:
        """CPU seconds per URL since the last take (a batch is run now if none was: a short run's tenth is fewer
        batches than CONTROL_EVERY)."""
        if not self.urls:
            self.step()
        per = self.cpu / self.urls
        self.cpu, self.urls = 0.0, 0
        return per


CONTROL_MAX = 500_000    # URLs in the control store before it starts again
CONTROL_EVERY = 10       # run batches per control batch


def status_mb() -> dict[str, float]:
    """This process's memory figures in MB from /proc/self/status: VmHWM (peak RSS), RssAnon, RssFile (the URL
    index's mapped pages: page cache the kernel writes back and reclaims under pressure)."""
    return {line.split(":")[0]: int(line.split()[1]) / 1024
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith(("VmHWM:", "RssAnon:", "RssFile:"))}


def peak_rss_mb() -> float:
    return status_mb().get("VmHWM", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def batches(count: int, batch: int, hosts: int, workload: str, nodes: list[str], seed: int = 1):
    """Rows (url, depth, priority, node, parent) of `count` distinct URLs, `batch` at a time."""
    rnd = random.Random(seed)
    found_on: dict[int, str] = {}    # a URL already pushed per host: the next page of that host to report links
    i = 0
    while i < count:
        rows = []
        n = min(batch, count - i)
        while len(rows) < n:
            host = rnd.randrange(hosts)
            parent = found_on.get(host)
            for k in range(min(LINKS_PER_PAGE, n - len(rows))):
                h = host if workload == "pages" and k < SAME_HOST else rnd.randrange(hosts)
                url = f"https://site{h}.example.com/music/{rnd.getrandbits(32):08x}/song-{i}.html"
                rows.append((url, i % 6, i % 3, nodes[i % len(nodes)], parent))
                if k == 0:
                    found_on[h] = url
                i += 1
        yield rows


def store_bytes(store: MasterStore, work: Path) -> int:
    if store.backend == "postgresql":
        return int(store.db.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'm') AND n.nspname = current_schema()").fetchone()[0])
    return sum(p.stat().st_size for p in work.iterdir() if p.is_file())


def projection(points: list[tuple[int, float]], target: int) -> tuple[float, float]:
    """Seconds per URL fitted as a + b*ln(n) over the measured tenths (a B-tree's cost grows with its depth,
    the log of its size; never below the cheapest tenth measured), summed from the first URL to `target`:
    (hours for target URLs, URLs/s at the end)."""
    xs = [math.log(max(n, 1)) for n, _ in points]
    ys = [s for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    a = my - b * mx
    floor = min(ys)

    def cost(n: float) -> float:
        return max(a + b * math.log(max(n, 1.0)), floor)

    steps, total, prev = 1000, 0.0, 0.0
    for i in range(1, steps + 1):
        n = target * i / steps
        total += cost((prev + n) / 2) * (n - prev)
        prev = n
    return total / 3600, 1 / cost(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=5000)
    ap.add_argument("--workload", choices=["pages", "random"], default="pages")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--store", default=None,
                    help="a postgresql:// address (an empty database) or pg-temp, instead of SQLite")
    args = ap.parse_args()
    cluster = None
    if args.store == "pg-temp":
        from testkit.pgcluster import PgCluster

        cluster = PgCluster.start(shared_buffers="256MB", max_wal_size="4GB")
        args.store = cluster.create_database("bench")
    work = Path(tempfile.mkdtemp(prefix="bench-frontier-", dir=args.dir))
    nodes = [f"node{i}" for i in range(args.nodes)]
    tenth = max(1, args.count // 10)
    try:
        store = MasterStore(args.store or work / "master.db")
        print(f"URLs {args.count:,} ({args.workload}) in batches of {args.batch:,} over {args.nodes} nodes and "
              f"{args.hosts:,} hosts, on {store.backend}", flush=True)
        gen_s = push_s = pop_s = push_cpu = 0.0
        mark_cpu = 0.0
        cpu_rates: list[float] = []
        cpu_curve: list[tuple[int, float]] = []      # the same in CPU seconds: what the load of others leaves out
        pop_cpu_rates: list[float] = []
        pushed = popped = 0
        mark, mark_s = tenth, 0.0
        push_curve: list[tuple[int, float]] = []     # (URLs in the table at the middle of a tenth, s per URL)
        pop_rates: list[float] = []
        sample = max(1, args.count // 100)
        turn = 0
        control = Control(args.batch, args.hosts, args.workload, nodes, work) if args.store is None else None
        relative: list[float] = []                   # CPU per URL of the run / of the control, per tenth
        t = time.perf_counter()
        for n_batch, rows in enumerate(batches(args.count, args.batch, args.hosts, args.workload, nodes)):
            if control is not None and n_batch % CONTROL_EVERY == 0:
                control.step()
                t = time.perf_counter()
            t0, c0 = time.perf_counter(), time.process_time()
            gen_s += t0 - t
            pushed += store.push(rows, unseen=True)      # as the master pushes what its Bloom filter never saw
            store.commit()
            t = time.perf_counter()
            push_s += t - t0
            push_cpu += time.process_time() - c0
            if pushed >= mark or pushed == args.count:
                done = pushed - (mark - tenth)
                rate = done / (push_s - mark_s)
                push_curve.append((pushed - done // 2, 1 / rate))
                cpu_rates.append(done / max(push_cpu - mark_cpu, 1e-9))
                cpu_curve.append((pushed - done // 2, 1 / cpu_rates[-1]))
                # Pop 1% of the run's URLs at this size, as the master does between pushes, node by node.
                t0, c0, got = time.perf_counter(), time.process_time(), 0
                while got < sample:
                    batch = store.pop(nodes[turn % len(nodes)], min(args.batch, sample - got), 0.0)
                    store.commit()
                    turn += 1
                    got += len(batch)
                took = time.perf_counter() - t0
                pop_cpu_rates.append(got / max(time.process_time() - c0, 1e-9))
                pop_s, popped = pop_s + took, popped + got
                pop_rates.append(got / took)
                versus = ""
                if control is not None:
                    relative.append(1 / cpu_rates[-1] / control.take())
                    versus = f"; {relative[-1]:.2f}x the CPU per URL of a store under {CONTROL_MAX:,} meanwhile"
                print(f"tenth {len(push_curve):2d}  push {rate:9,.0f} URLs/s ({cpu_rates[-1]:9,.0f} per CPU s)  "
                      f"pop {got / took:9,.0f} URLs/s ({pop_cpu_rates[-1]:9,.0f} per CPU s)  "
                      f"(table at {pushed:,}{versus})", flush=True)
                mark, mark_s, mark_cpu = mark + tenth, push_s, push_cpu
                t = time.perf_counter()
        queued = store.frontier_size()
        rss_queued = peak_rss_mb()
        mem = status_mb()
        anon, mapped = mem.get("RssAnon", 0.0), mem.get("RssFile", 0.0)
        if args.store is not None:
            size = store_bytes(store, work)
        store.close()
        if control is not None and control.store is not None:
            control.store.close()
        if args.store is None:
            size = store_bytes(store, work)      # after the last checkpoint folded the WAL in
        rates = [1 / s for _, s in push_curve]
        spread = (max(rates) - min(rates)) / max(rates) if rates else 0.0
        pop_spread = (max(pop_rates) - min(pop_rates)) / max(pop_rates) if pop_rates else 0.0

        def spread_of(r: list[float]) -> float:
            return (max(r) - min(r)) / max(r) if r else 0.0
        hours, end_rate = projection(push_curve, 1_000_000_000)
        cpu_hours, cpu_end = projection(cpu_curve, 1_000_000_000)
        print(f"push               {args.count / push_s:,.0f} URLs/s over the run ({push_s:.1f} s; generating the "
              f"URLs took another {gen_s:.1f} s, not counted); slowest tenth {spread:.0%} below the fastest, "
              f"{spread_of(cpu_rates):.0%} in URLs per CPU second")
        print(f"pop                {popped / pop_s:,.0f} URLs/s over the run ({pop_s:.1f} s, {popped:,} URLs, 1% of "
              f"the run after each tenth); slowest tenth {pop_spread:.0%} below the fastest, "
              f"{spread_of(pop_cpu_rates):.0%} in URLs per CPU second")
        if relative:
            print(f"against the control push CPU per URL over a small store's in the same minutes, by tenth: "
                  f"{', '.join(f'{r:.2f}' for r in relative)}; the largest {max(relative) / min(relative) - 1:.0%} "
                  f"above the smallest")
        print(f"queued at the end  {queued:,} (the rest leased)")
        whose = ("the URL index's, page cache the kernel reclaims under pressure" if store.backend == "sqlite"
                 else "the program's own files")
        print(f"peak RSS           {rss_queued:.0f} MB (at the end {anon:.0f} MB anonymous, {mapped:.0f} MB mapped "
              f"file pages: {whose})")
        print(f"store on disk      {size / 1e6:,.0f} MB ({size / args.count:.0f} bytes per URL)")
        print(f"projection to 1B   {size / args.count * 1e9 / 1e9:,.0f} GB; push {hours:.1f} h in all, "
              f"{end_rate:,.0f} URLs/s at the billionth (fit a + b ln n over the tenths above); in CPU time "
              f"{cpu_hours:.1f} h, {cpu_end:,.0f} URLs per CPU second at the billionth")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if cluster is not None:
            cluster.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
