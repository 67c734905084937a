"""Benchmark of the double-hash node table: load balance, movement on leave/rejoin, routing throughput.

    .venv/bin/python scripts/bench_scheduler.py [--urls 1000000]

Balance is max/mean (and min/mean) of the URLs per live node for every N of M; the target is max/mean <= 1.05.
Movement compares the share of URLs that change node when one node leaves, and again when it rejoins, with the
ideal: the leaver's own share, 1/N. Throughput is assign_many in master-sized batches of 1,000 URLs, cold (the
first batches after a live-set change, which fill the dead slots' tables) and warm.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from crawler.scheduler import NodeTable


def make_urls(n: int, hosts: int) -> list[str]:
    rnd = random.Random(7)
    paths = ("song", "album", "artist", "mv", "playlist")
    return [f"https://www{rnd.randrange(hosts)}.music-site.example/{paths[i % 5]}/{rnd.getrandbits(40):x}"
            ".html" for i in range(n)]


def balance(nodes: list[str], urls: list[str], subsets: int) -> None:
    m = len(nodes)
    rnd = random.Random(m)
    for n in range(1, m + 1):
        choices = [nodes[:n]] + [rnd.sample(nodes, n) for _ in range(subsets - 1)]
        worst_max, worst_min = 0.0, 2.0
        for live in choices:
            counts = Counter(NodeTable(nodes, live=live).assign_many(urls))
            mean = len(urls) / n
            worst_max = max(worst_max, max(counts.values()) / mean)
            worst_min = min(worst_min, min(counts.values()) / mean)
        print(f"  M={m} N={n}: max/mean {worst_max:.4f}  min/mean {worst_min:.4f}  "
              f"(worst of {len(choices)} live sets){'' if worst_max <= 1.05 else '  OVER 1.05'}")


def movement(nodes: list[str], urls: list[str], n: int) -> None:
    table = NodeTable(nodes, live=nodes[:n])
    leaver = nodes[n // 2]
    before = table.assign_many(urls)
    table.set_live(leaver, False)
    during = table.assign_many(urls)
    table.set_live(leaver, True)
    after = table.assign_many(urls)
    left = sum(b != d for b, d in zip(before, during, strict=True))
    stray = sum(b != d and b != leaver for b, d in zip(before, during, strict=True))
    back = sum(d != a for d, a in zip(during, after, strict=True))
    not_home = sum(a != b for a, b in zip(after, before, strict=True))
    total = len(urls)
    print(f"  M={len(nodes)} N={n}, {leaver} leaves: moved {left / total:.4%} (ideal {1 / n:.4%}, "
          f"its own share {before.count(leaver) / total:.4%}), moved but not its: {stray}")
    print(f"  M={len(nodes)} N={n}, {leaver} rejoins: moved {back / total:.4%} (ideal {1 / n:.4%}), "
          f"differing from before it left: {not_home}")


def throughput(nodes: list[str], urls: list[str], n: int, key: str, batch: int) -> None:
    table = NodeTable(nodes, key=key, live=nodes[:n])
    batches = [urls[i:i + batch] for i in range(0, len(urls), batch)]
    t0 = time.perf_counter()
    for b in batches:
        table.assign_many(b)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for b in batches:
        table.assign_many(b)
    warm = time.perf_counter() - t0
    print(f"  key={key:4} M={len(nodes)} N={n}: cold {len(urls) / cold:>12,.0f} URLs/s   "
          f"warm {len(urls) / warm:>12,.0f} URLs/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--urls", type=int, default=1_000_000)
    ap.add_argument("--subsets", type=int, default=3, help="live sets tried for each N")
    args = ap.parse_args()
    # One big site (a handful of host names) is the hard case for key="url": it must still spread.
    urls = make_urls(args.urls, hosts=4)
    print(f"{len(urls):,} URLs")

    print("balance")
    for m in (8, 5):
        balance([f"node-{i}" for i in range(m)], urls, args.subsets)

    print("movement")
    nodes8 = [f"node-{i}" for i in range(8)]
    for n in (8, 6, 3):
        movement(nodes8, urls, n)

    print("throughput (assign_many, batches of 1,000)")
    broad = make_urls(args.urls, hosts=50_000)
    for n in (8, 6, 2):
        throughput(nodes8, urls, n, "url", 1000)
    throughput(nodes8, broad, 6, "host", 1000)
    throughput([f"node-{i}" for i in range(64)], urls, 40, "url", 1000)


if __name__ == "__main__":
    main()
