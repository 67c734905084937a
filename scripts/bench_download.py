"""Download one large file over loopback with the Downloader and with curl; print throughput and peak RSS.

    .venv/bin/python scripts/bench_download.py [--size-mib 1024] [--runs 3] [--transport aiohttp|httpcore]

The file is served by tests/fakes/rangeserver.py in its own process (sendfile: the server costs little
CPU); curl and the Downloader each run in a process of their own and write to the same disk, so the figures
compare like with like. The Downloader's peak RSS is that whole process's high-water mark (interpreter and
imports included). Targets: at least 80% of curl's throughput; peak RSS under 100 MB whatever the size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
from crawler.worker.fetcher import build_transport
from crawler.items import AudioItem
from crawler.worker.downloader import Downloader, DownloadConfig

url, data_dir, transport = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

async def main():
    client = httpx.AsyncClient(transport=build_transport(max_connections=16, dns_ttl=60, max_body=1 << 40) if transport == "aiohttp" else None)
    async with client:
        dl = Downloader(client, data_dir, DownloadConfig(max_size=1 << 40))
        t0 = time.perf_counter()
        item = await dl.fetch(AudioItem(url=url, page="bench"))
        elapsed = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"status": item.status, "reason": item.reason, "size": item.size, "sha256": item.sha256,
                      "seconds": elapsed, "peak_rss_mb": peak_kib * 1024 / 1e6}))

asyncio.run(main())
"""


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
    args = ap.parse_args()
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
