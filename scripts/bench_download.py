"""Download one large file over loopback with the Downloader and with curl; print throughput and peak RSS.

    .venv/bin/python scripts/bench_download.py [--size-mib 1024] [--runs 3] [--transport aiohttp|httpcore]
    .venv/bin/python scripts/bench_download.py --small 5000 [--songs 5000] [--in-flight 8] [--runs 3] [--profile F]

The file is served by tests/fakes/rangeserver.py in its own process (sendfile: the server costs little
CPU); curl and the Downloader each run in a process of their own and write to the same disk, so the figures
compare like with like. The Downloader's peak RSS is that whole process's high-water mark (interpreter and
imports included). Targets: at least 80% of curl's throughput; peak RSS under 100 MB whatever the size.

With --small N it measures the other end instead: the CPU one small audio file costs the Downloader, as a worker
runs it (file tags read, records kept), without the crawl around it. The crawl benchmark's site (the same
generator and song count, kept under bench-data/) is served by nginx, and one process downloads the first N of
its audio files, --in-flight at a time, in a fresh data dir each run, its records in the node's WARC archive
(--archive off: none). CPU is the process's user + system time
over the downloads alone (its threads included, start-up and imports excluded), so before/after comparisons
are steadier than the whole crawl's on a loaded machine. --profile writes a cProfile of the last run there.

A run's data dir is not deleted when it ends but moved under <out>/trash/ (testkit/trash.py: deleting thousands
of files right before the next run measured ext4's scan past freed inodes, not the downloader), emptied after
the runs of what is older than ten minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
CURL = "/usr/bin/curl"

_CHILD = r"""
import asyncio, json, resource, sys, time
from pathlib import Path
import httpx
from crawler.http.getter import ClientGetter, Stack
from crawler.http.transport import build_transport
from crawler.items import AudioItem
from crawler.worker.downloader import Downloader, DownloadConfig

url, data_dir, transport = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

async def main():
    ours = build_transport(max_connections=16, dns_ttl=60, max_body=1 << 40) if transport == "aiohttp" else None
    client = httpx.AsyncClient(transport=ours)
    async with client:
        dl = Downloader(ClientGetter(client) if ours is None else Stack(ours, client), data_dir,
                        DownloadConfig(max_size=1 << 40))
        t0 = time.perf_counter()
        item = await dl.fetch(AudioItem(url=url, page="bench"))
        elapsed = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"status": item.status, "reason": item.reason, "size": item.size, "sha256": item.sha256,
                      "seconds": elapsed, "peak_rss_mb": peak_kib * 1024 / 1e6}))

asyncio.run(main())
"""


_SMALL_CHILD = r"""
import asyncio, cProfile, json, os, sys, time
from pathlib import Path
import httpx
from crawler.http.getter import build_stack
from crawler.items import AudioItem
from crawler.worker.downloader import Downloader, DownloadConfig

from crawler.eventloop import run

urls, data_dir, in_flight, profile = json.loads(sys.stdin.read()), Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
archive = None
if sys.argv[4] == "on":      # the worker's own archive, as a worker with archive.enabled (the default) keeps it
    from crawler.archive.writer import ArchiveWriter
    archive = ArchiveWriter(data_dir / "archive", "worker")

async def main():
    client = build_stack(max_connections=2 * in_flight, dns_ttl=60, max_body=1 << 30,
                         user_agent="bench", connect_timeout=10, read_timeout=30, max_redirects=5)
    async with client:
        dl = Downloader(client, data_dir, DownloadConfig(max_downloads=in_flight, max_per_host=in_flight),
                        file_tags=True, **({"archive": archive} if archive is not None else {}))
        # The downloader's own slots bound the downloads in flight, and free them before a file is stored,
        # as in a worker; tasks are started a few at a time beyond them.
        sem = asyncio.Semaphore(4 * in_flight)
        async def one(url):
            async with sem:
                return await dl.fetch(AudioItem(url=url, page=url))
        prof = cProfile.Profile() if profile else None
        t0, c0 = time.perf_counter(), os.times()
        if prof:
            prof.enable()
        items = await asyncio.gather(*(one(u) for u in urls))
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        c1, elapsed = os.times(), time.perf_counter() - t0
        dl.store.close()
    bad = [i for i in items if i.status != "ok"]
    print(json.dumps({"ok": len(items) - len(bad), "failed": [i.reason for i in bad[:3]], "seconds": elapsed,
                      "cpu": (c1.user - c0.user) + (c1.system - c0.system), "sys": c1.system - c0.system,
                      "tags": sum(1 for i in items if i.codec)}))

run(main())
"""


def bench_small(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from scripts import bench_crawl
    from testkit.trash import deletion_note, empty_trash, throw_away

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if (note := deletion_note(out)) is not None:
        print(note)
    manifest = bench_crawl.prepare_site(out, args.songs)
    site = bench_crawl.serve_site(out / f"site-{args.songs}", out / "server-small", "auto")
    urls = [site.url + a.url for a in manifest.audio[:args.small]]
    runs = []
    try:
        for i in range(args.runs):
            data_dir = out / f"small-data-{os.getpid()}-{i}"
            throw_away(data_dir, out)
            profile = str(args.profile) if args.profile and i == args.runs - 1 else ""
            r = subprocess.run([PY, "-c", _SMALL_CHILD, str(data_dir), str(args.in_flight), profile, args.archive],
                               input=json.dumps(urls), check=True, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(args.code or REPO)}, cwd=args.code or REPO)
            result = json.loads(r.stdout.strip().splitlines()[-1])
            throw_away(data_dir, out)
            if result["failed"]:
                raise SystemExit(f"downloads failed: {result}")
            runs.append(result)
            n, cpu, system = result["ok"], 1000 * result["cpu"], 1000 * result["sys"]
            print(f"run {i + 1}: {n} files in {result['seconds']:.2f} s = {n / result['seconds']:.0f} files/s; "
                  f"CPU {cpu / n:.3f} ms/file (user {(cpu - system) / n:.3f}, system {system / n:.3f}); "
                  f"tags read for {result['tags']}" + ("  [profiled]" if profile else ""))
    finally:
        site.child.stop(signal.SIGQUIT if site.kind == "nginx" else signal.SIGTERM)
        empty_trash(out)
    per_file = sorted(1000 * r["cpu"] / r["ok"] for r in runs if not (args.profile and r is runs[-1]))
    if per_file:
        print(f"CPU per small file: median {per_file[(len(per_file) - 1) // 2]:.3f} ms, range "
              f"{per_file[0]:.3f}-{per_file[-1]:.3f} ms over {len(per_file)} unprofiled runs; "
              f"{args.in_flight} in flight")


def make_file(path: Path, size: int) -> None:
    # Random blocks, not zeros, so nothing along the way can compress or short-cut them.
    block = os.urandom(16 * 1024 * 1024)
    with open(path, "wb") as fh:
        left = size
        i = 0
        while left > 0:
            n = min(left, len(block))
            # The first block starts with an MPEG audio frame header: the downloader keeps only audio.
            head = b"\xff\xfb\x90\x64" if i == 0 else b""
            fh.write(head + i.to_bytes(8, "little") + block[8 + len(head):n] if n >= 8 + len(head) else block[:n])
            left -= n
            i += 1


def run_curl(url: str, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([CURL, "-s", "-f", "-o", str(out), url], check=True)
    elapsed = time.perf_counter() - t0
    out.unlink()
    return elapsed


def run_downloader(url: str, data_dir: Path, transport: str) -> dict:
    shutil.rmtree(data_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([PY, "-c", _CHILD, url, str(data_dir), transport], check=True, capture_output=True,
                         text=True, env=env)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    shutil.rmtree(data_dir, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transport", choices=["aiohttp", "httpcore"], default="aiohttp")
    ap.add_argument("--small", type=int, default=0, help="instead: N small audio files of the crawl site")
    ap.add_argument("--songs", type=int, default=5000, help="with --small: the crawl site's song count")
    ap.add_argument("--in-flight", type=int, default=8, help="with --small: downloads at once")
    ap.add_argument("--profile", type=Path, help="with --small: a cProfile of the last run, written here")
    ap.add_argument("--archive", choices=["on", "off"], default="on",
                    help="with --small: each download's records in a WARC archive, as a worker keeps them")
    ap.add_argument("--out", type=Path, default=REPO / "bench-data", help="with --small: where the site is kept")
    ap.add_argument("--code", type=Path, help="with --small: the source tree to measure (another checkout: before "
                                               "and after on the same site)")
    args = ap.parse_args()
    if args.small:
        bench_small(args)
        return
    size = args.size_mib * 1024 * 1024

    with tempfile.TemporaryDirectory(prefix="bench-download-") as tmp:
        tmpdir = Path(tmp)
        src = tmpdir / "source.bin"
        make_file(src, size)
        server = subprocess.Popen([PY, "-m", "tests.fakes.rangeserver", str(src)], stdout=subprocess.PIPE,
                                  text=True, cwd=REPO)
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            curl_s, dl = [], []
            for _ in range(args.runs):
                curl_s.append(run_curl(url, tmpdir / "curl.out"))
                r = run_downloader(url, tmpdir / "data", args.transport)
                if r["status"] != "ok" or r["size"] != size:
                    raise SystemExit(f"download failed: {r}")
                dl.append(r)
        finally:
            server.terminate()
            server.wait(10)

    mib = size / (1024 * 1024)
    best_curl = min(curl_s)
    best_dl = min(r["seconds"] for r in dl)
    peak = max(r["peak_rss_mb"] for r in dl)
    print(f"file: {mib:.0f} MiB over loopback, best of {args.runs} runs, transport={args.transport}")
    print(f"curl       : {mib / best_curl:8.1f} MiB/s  ({best_curl:.2f} s)   runs: "
          + ", ".join(f"{mib / s:.0f}" for s in curl_s))
    print(f"downloader : {mib / best_dl:8.1f} MiB/s  ({best_dl:.2f} s)   runs: "
          + ", ".join(f"{mib / r['seconds']:.0f}" for r in dl))
    print(f"ratio      : {best_curl / best_dl:8.2f} of curl (target >= 0.80)")
    print(f"peak RSS   : {peak:8.1f} MB for the downloader process (target < 100)")


if __name__ == "__main__":
    main()
