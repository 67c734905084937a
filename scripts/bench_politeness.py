"""A polite crawl of one host: the rate achieved against the rate allowed.

    .venv/bin/python scripts/bench_politeness.py [--seconds 3]

Each run crawls one loopback site (testkit/politesite.py: a home page linking to N pages, every request's arrival
logged) with a real master and real workers, sized so that at the allowed rate it takes about --seconds:

  min_delay 100, 20, 10 ms, with 1 and with 3 workers: allowed 1 / min_delay pages/s;
  max_per_host 1, 4, 16 (no delay) against a site answering each page in 50 ms: allowed max_per_host / 0.05.

The achieved rate is measured at the site, from the first page request to the last: (requests - 1) / span. Also
printed: the closest two starts came (delay runs) or the most requests the site saw at once (concurrency runs),
and how the requests were shared among the workers. Process start-up is outside the measured span.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit import cluster
from testkit.politesite import PoliteSite

LATENCY = 0.05


async def run(tmp: Path, *, workers: int, pages: int, politeness: dict, latency: float = 0.0) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    async with PoliteSite(pages, latency=latency) as site:
        nodes = [f"w{i + 1}" for i in range(workers)]
        config = cluster.master_config(tmp, [site.url + "/"], nodes, crawl={"max_depth": 2},
                                       politeness=politeness)
        master = await cluster.start_master(config, tmp)
        procs = [master]
        try:
            addr = cluster.master_addr(config)
            for n in nodes:
                wcfg = tmp / f"worker-{n}.yaml"
                wcfg.write_text(f"download_audio: false\nstore_pages: false\nuser_agent: agent-{n}\n")
                procs.append(await cluster.start_worker(addr, n, tmp, config=wcfg))
            if await master.wait(300) != 0:
                raise SystemExit(f"the master failed:\n{master.log()[-3000:]}")
            for w in procs[1:]:
                await w.wait(30)
        finally:
            for p in procs:
                await p.stop()
        hits = sorted(site.page_hits(), key=lambda h: h.start)
    starts = [h.start for h in hits]
    span = starts[-1] - starts[0]
    return {
        "pages": len(hits),
        "rate": (len(starts) - 1) / span if span > 0 else float("nan"),
        "min_gap": min((b - a for a, b in itertools.pairwise(starts)), default=float("nan")),
        "max_in_flight": site.max_in_flight,
        "share": sorted(Counter(h.agent for h in hits).values(), reverse=True),
        "span": span,
    }


async def main_async(seconds: float) -> None:
    print(f"{'run':34} {'allowed/s':>9} {'achieved/s':>10} {'ratio':>6}  detail")
    with tempfile.TemporaryDirectory(prefix="bench-politeness-") as d:
        runs = 0
        for delay in (0.1, 0.02, 0.01):
            for workers in (1, 3):
                allowed = 1 / delay
                pages = max(30, int(allowed * seconds))
                runs += 1
                r = await run(Path(d) / f"r{runs}", workers=workers, pages=pages, politeness={"min_delay": delay})
                print(f"{f'min_delay {delay * 1000:.0f} ms, {workers} worker(s)':34} {allowed:9.1f} "
                      f"{r['rate']:10.1f} {r['rate'] / allowed:6.1%}  {r['pages']} pages in {r['span']:.2f} s, "
                      f"closest starts {r['min_gap'] * 1000:.1f} ms, per worker {r['share']}", flush=True)
        for limit in (1, 4, 16):
            workers = 3
            allowed = limit / LATENCY
            pages = max(30, int(allowed * seconds))
            runs += 1
            r = await run(Path(d) / f"r{runs}", workers=workers, pages=pages, latency=LATENCY,
                          politeness={"max_per_host": limit})
            print(f"{f'max_per_host {limit}, {LATENCY * 1000:.0f} ms site, {workers} workers':34} {allowed:9.1f} "
                  f"{r['rate']:10.1f} {r['rate'] / allowed:6.1%}  {r['pages']} pages in {r['span']:.2f} s, "
                  f"at most {r['max_in_flight']} at once, per worker {r['share']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each run at the allowed rate")
    args = ap.parse_args()
    asyncio.run(main_async(args.seconds))


if __name__ == "__main__":
    main()
