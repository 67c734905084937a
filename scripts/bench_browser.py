"""Browser-resolved pages per second in one worker, and the browser's peak memory.

    .venv/bin/python scripts/bench_browser.py [--pages 30] [--tabs 1 2]

The player site of the tests (testkit/playersite.py: a script-assembled address, a signed API address after
a click, an HLS stream) is served on loopback; each round resolves ``--pages`` song pages, cycling over the three,
through the worker's BrowserResolver with ``max_pages`` set to each ``--tabs`` value, all pages submitted at once
as a worker with a full credit would. The first page of a round starts the browser; its time is counted.

Memory is sampled every 100 ms from /proc over the browser's process tree (the browser, its renderers, its
GPU/utility/zygote helpers): RSS summed (counts shared pages once per process, so it overstates) and PSS summed
(shared pages split among their users: the honest total). The Playwright driver (a node process) is reported on
its own. A page's cost is dominated by waiting for the network to be quiet (500 ms, twice on pages with a
player to press), so pages per second grows with tabs until the CPU is the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crawler.http.getter import build_stack
from crawler.http.targets import TargetPolicy
from crawler.resolvers.base import ResolveContext
from crawler.resolvers.browser import BrowserResolver
from crawler.resolvers.chromium import LOOPBACK_ONLY_ARGS, rss_bytes, tree_pids
from crawler.worker.fetcher import PageFetcher
from testkit.browser import TEST_BROWSER_USER
from testkit import playersite

UA = "Mozilla/5.0 (compatible; audio-crawler/0.1)"


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError):
            continue
    return total


async def round_(base: str, pages: int, tabs: int) -> dict[str, float]:
    http = build_stack(max_connections=16, dns_ttl=60, user_agent=UA, connect_timeout=10, read_timeout=30,
                       max_redirects=3)
    # The site is the crawl's seed, so the browser's proxy lets it through as a worker's would.
    ctx = ResolveContext(http=http, user_agent=UA, targets=TargetPolicy.for_crawl([base + "/"], []))
    fetcher = PageFetcher(http)
    resolver = BrowserResolver({"max_pages": tabs, "args": list(LOOPBACK_ONLY_ARGS), "page_timeout": 60,
                                "user": TEST_BROWSER_USER})
    peak = {"rss": 0, "pss": 0, "driver": 0}
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            browser = resolver._browser
            if browser is not None:
                tree = tree_pids(browser.pid)
                peak["rss"] = max(peak["rss"], rss_bytes(tree))
                peak["pss"] = max(peak["pss"], pss_bytes(tree))
                ours = set(tree_pids(os.getpid())) - set(tree) - {os.getpid()}
                peak["driver"] = max(peak["driver"], rss_bytes(sorted(ours)))
            try:
                await asyncio.wait_for(done.wait(), 0.1)
            except TimeoutError:
                pass

    async def one(i: int) -> int:
        url = f"{base}/song/{i % 3 + 1}"
        page, _ = await fetcher.fetch(url, max_bytes=1 << 20)
        return len((await resolver.resolve(url, page, ctx)).items)

    sampler = asyncio.create_task(sample())
    started = time.perf_counter()
    try:
        found = await asyncio.gather(*(one(i) for i in range(pages)))
        elapsed = time.perf_counter() - started
    finally:
        done.set()
        await sampler
        await resolver.aclose()
        await http.aclose()
    return {"tabs": tabs, "pages": pages, "items": sum(found), "seconds": elapsed, "pages_per_s": pages / elapsed,
            "peak_rss_mb": peak["rss"] / 1e6, "peak_pss_mb": peak["pss"] / 1e6, "driver_rss_mb": peak["driver"] / 1e6,
            "restarts": resolver.stats["restarts"], "timeouts": resolver.stats["timeouts"]}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--tabs", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    site = playersite.PlayerSite()
    async with playersite.serve(site) as base:
        print(f"{'tabs':>4} {'pages':>5} {'items':>5} {'seconds':>8} {'pages/s':>8} {'peak RSS MB':>11} "
              f"{'peak PSS MB':>11} {'driver MB':>9}")
        for tabs in args.tabs:
            r = await round_(base, args.pages, tabs)
            print(f"{r['tabs']:>4} {r['pages']:>5} {r['items']:>5} {r['seconds']:>8.1f} {r['pages_per_s']:>8.2f} "
                  f"{r['peak_rss_mb']:>11.0f} {r['peak_pss_mb']:>11.0f} {r['driver_rss_mb']:>9.0f}")
            if r["items"] != r["pages"] or r["timeouts"]:
                print(f"  warning: {r['items']} items for {r['pages']} pages, {r['timeouts']} deadlines hit")


if __name__ == "__main__":
    asyncio.run(main())
