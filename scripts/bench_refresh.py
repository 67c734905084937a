"""Refresh at scale: can the master keep every one of a big site's pages within its revisit interval?

    python scripts/bench_refresh.py [--pages 200000] [--interval 60] [--cycles 3] [--change 0.1]
                                    [--report 64] [--dir /tmp/...]

A store with --pages fetched pages (done, with validators and a digest, their last visits spread evenly over one
interval) is driven on a simulated clock in the master's own steps, every 0.2 s of crawl time (the master's
housekeeping cadence): the due scan (MasterStore.requeue_due in batches of the master's REFRESH_BATCH until none
is due, exactly what the running master does), then workers that take everything queued (MasterStore.pop with
validators) and report it in reports of --report pages (MasterStore.finish with the revisit policy), a --change
share of them changed, the rest answered 304, then one commit. The workers are assumed fast enough: what is
measured is the master.

Printed: how late each page's visit was (the tick that requeued it minus its next_visit; the workers visit it in
that tick), as a distribution, and how many waited longer than one tick past their interval; the scan's CPU per page requeued, and the report path's
CPU per page (pop + finish), as process CPU time.

The interval is fixed (refresh_min = refresh_max = --interval), so every page is due once an interval and the
load is pages / interval visits a second: 200,000 pages every 60 s is 3,333 visits/s.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawler.master.revisit import RevisitPolicy
from crawler.master.server import COMMIT_INTERVAL, REFRESH_BATCH
from crawler.master.store import MasterStore, PageOutcome


def route(urls):
    return ["w1"] * len(urls)


def percentiles(xs: list[float]) -> str:
    xs = sorted(xs)
    pick = [xs[min(len(xs) - 1, int(q * len(xs)))] for q in (0.5, 0.9, 0.99, 0.999)]
    return (f"p50 {pick[0]:.2f} s, p90 {pick[1]:.2f} s, p99 {pick[2]:.2f} s, p99.9 {pick[3]:.2f} s, "
            f"max {xs[-1]:.2f} s, mean {statistics.fmean(xs):.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=200_000)
    ap.add_argument("--interval", type=float, default=60.0, help="refresh interval, seconds of crawl time")
    ap.add_argument("--cycles", type=int, default=3, help="intervals to run")
    ap.add_argument("--change", type=float, default=0.1, help="share of visits that find the page changed")
    ap.add_argument("--report", type=int, default=64, help="pages per worker report")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    if args.pages < 1 or args.interval <= 0 or args.cycles < 1 or args.report < 1:
        print("bench_refresh: --pages, --interval, --cycles and --report must be positive", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-refresh-", dir=args.dir))
    rnd = random.Random(1)
    policy = RevisitPolicy(args.interval, args.interval, args.interval)
    try:
        store = MasterStore(work / "master.db", cache_mb=256)
        urls = [f"https://site{i % 500}.example.com/music/{rnd.getrandbits(32):08x}/page-{i}.html"
                for i in range(args.pages)]
        t0 = time.perf_counter()
        for i in range(0, len(urls), 10_000):
            store.push([(u, 2, 0, "w1", None) for u in urls[i:i + 10_000]])
            store.commit()
        # The first visits, spread evenly over one interval before the start, so visits fall due evenly.
        digest = {u: rnd.getrandbits(63) for u in urls}
        while rows := store.pop("w1", 10_000, 0.0):
            base = len(digest) - store.frontier_size() - len(rows)
            store.finish([PageOutcome(u, "done", 200, u, "text/html", 1000, None, "w1",
                                   -args.interval + args.interval * (base + k) / args.pages,
                                   f'"{digest[u]:x}"', None, digest[u], frozenset())
                          for k, (u, *_rest) in enumerate(rows)], policy)
            store.commit()
        print(f"set up {args.pages} fetched pages in {time.perf_counter() - t0:.1f} s ({work})")

        lags: list[float] = []
        scan_cpu = report_cpu = 0.0
        reported = 0
        now = 0.0
        end = args.cycles * args.interval
        tick = 0
        while now < end:
            tick += 1
            now = tick * COMMIT_INTERVAL
            c0 = time.process_time()
            while True:
                batch = store.requeue_due(now, route, REFRESH_BATCH)   # how late each page is
                lags += batch
                if len(batch) < REFRESH_BATCH:
                    break
            scan_cpu += time.process_time() - c0
            c2 = time.process_time()
            rows = store.pop("w1", 1 << 30, now, validators=True)
            for i in range(0, len(rows), args.report):
                part = rows[i:i + args.report]
                results = []
                for u, _depth, _parent, validators in part:
                    if rnd.random() < args.change:
                        digest[u] = rnd.getrandbits(63)
                        results.append(PageOutcome(u, "done", 200, u, "text/html", 1000, None, "w1", now,
                                                f'"{digest[u]:x}"', None, digest[u], frozenset()))
                    else:
                        assert validators is not None   # the conditional fetch has what it needs
                        results.append(PageOutcome(u, "done", 304, u, None, 0, None, "w1", now, None, None, None,
                                                frozenset()))
                store.finish(results, policy)
            store.commit()
            report_cpu += time.process_time() - c2
            reported += len(rows)
        store.close()
        print(f"crawl time {end:.0f} s in ticks of {COMMIT_INTERVAL} s; {args.pages} pages every "
              f"{args.interval:.0f} s = {args.pages / args.interval:.0f} visits/s; {args.change:.0%} changed")
        print(f"visits: {len(lags)} ({len(lags) / args.pages:.2f} per page)")
        print(f"visit lag past next_visit: {percentiles(lags)}")
        late = sum(1 for x in lags if x > COMMIT_INTERVAL + 1e-9)
        print(f"pages visited more than one tick ({COMMIT_INTERVAL} s) late: {late}")
        print(f"scan CPU: {scan_cpu:.2f} s for {len(lags)} pages requeued = {1e6 * scan_cpu / max(len(lags), 1):.1f} "
              f"us/page")
        print(f"report path CPU (pop with validators + finish with revisit + commit): {report_cpu:.2f} s for "
              f"{reported} pages = {1e6 * report_cpu / max(reported, 1):.1f} us/page")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
