"""The demo: generate a local music site, serve it on loopback, crawl it with a real master and real workers.

    python scripts/demo.py [--songs 2000] [--workers 2] [--out demo-data]

Everything it writes goes under --out (removed and made anew on each run).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit import cluster, sitegen, siteserver


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.monotonic()
    manifest = sitegen.generate(out / "site", songs=args.songs)
    print(f"site: {len(manifest.pages)} pages, {len(manifest.audio)} audio items "
          f"(generated in {time.monotonic() - t0:.1f} s)")
    async with await siteserver.start(out / "site") as site:
        print(f"serving it at {site.url}")
        nodes = [f"node{i + 1}" for i in range(args.workers)]
        config = cluster.master_config(
            out, [site.url + "/"], nodes,
            crawl={"max_depth": manifest.max_depth + 3},
            politeness={"obey_robots": True},
            scheduling={"heartbeat_interval": 2.0, "heartbeat_timeout": 10.0, "lease_timeout": 60.0},
        )
        master = await cluster.start_master(config, out)
        addr = cluster.master_addr(config)
        print(f"master listening on {addr}; status page on {cluster.web_url(config)}/ while it runs; "
              f"starting {len(nodes)} workers")
        workers = [await cluster.start_worker(addr, n, out, extra=["--concurrency", str(args.concurrency)])
                   for n in nodes]
        rc = await master.wait(args.timeout)
        for w in workers:
            await w.wait(30)
    print()
    print(master.stdout.decode().rstrip())
    if rc != 0:
        print(f"master exited with {rc}; its log: {master.log_path}", file=sys.stderr)
        return rc
    rows = cluster.catalogue(out)
    found = {(row["url"].removeprefix(site.url), row["page"].removeprefix(site.url)) for row in rows}
    expected = {(a.url, a.page) for a in manifest.audio}
    print(f"  audio expected  {len(expected)}, found {len(expected & found)}")
    print(f"  fill rate       {fill_rates(rows)}")
    print()
    print("where things are:")
    print(f"  catalogue       {out / 'master' / 'catalog.jsonl'}")
    for n in nodes:
        print(f"  {n:<15} {out / f'worker-{n}'} (pages/, audio/)")
    print(f"  logs            {out}/*.log")
    print(f"  status          .venv/bin/crawler-master status --config {config}")
    return 0


FILL_FIELDS = ("title", "artist", "album", "duration", "bitrate")


def fill_rates(rows: list[dict]) -> str:
    """The share of catalogue rows that have each field, e.g. "title 100.0%  artist 99.5% ..."."""
    n = len(rows) or 1
    return "  ".join(f"{f} {100 * sum(1 for r in rows if r.get(f) not in (None, '')) / n:.1f}%"
                     for f in FILL_FIELDS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--songs", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "demo-data"))
    ap.add_argument("--timeout", type=float, default=600)
    return asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
