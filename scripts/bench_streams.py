"""What recording live streams costs a worker: CPU and memory per recorded stream-minute, and how many streams one
worker records at once.

    .venv/bin/python scripts/bench_streams.py [--streams 1,32,128] [--window 60] [--bitrate 128] [--identify off]

For each level N, N internet radio stations (testkit/radio.py, in a process of their own, each on a loopback
address of its own, so that politeness lets the worker record them side by side) are linked from one page of a
local site as ``<audio src>`` items. A real master and one real worker (``live_record_seconds`` = --window,
``downloads`` = N) crawl it: the worker records every station for the window, on the disk under --out, and the
master catalogues the recordings. The figures:

- windows whole: recordings whose duration is at least 95% of the window (a worker that cannot keep up records
  less, or late);
- worker CPU: the worker's CPU from start to exit (its fingerprint processes included when --identify on), and
  the share of one core it used over the crawl;
- CPU per stream-minute: the worker's CPU above the one-station level's, per minute recorded above it (start-up,
  the page and the master's talk are the same at every level and cancel out);
- memory: the worker's peak resident size, and its growth per stream above the one-station level;
- streams per core: one core's minute over the CPU per stream-minute, the streams one worker could record at once
  with a core to spare for nothing else (an upper bound: the disk and the network are not counted).

Stations send at their bitrate in real time, so a level takes about one window plus start-up; at 128 kbit/s a
station-minute is 0.96 MB of audio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.bench_crawl import PY, Child, free_port, wait_for_port  # noqa: E402
from testkit import cluster  # noqa: E402

WHOLE = 0.95


def start_stations(count: int, run_dir: Path, bitrate: int) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([PY, "-m", "testkit.radio", "--stations", str(count), "--bitrate", str(bitrate),
                             "--folder", str(run_dir / "tracks")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=open(run_dir / "stations.log", "wb"), text=True)
    assert proc.stdout is not None
    urls = []
    for line in proc.stdout:
        if not line.strip():
            break
        urls.append(line.strip())
    if len(urls) != count:
        proc.kill()
        raise RuntimeError(f"the stations did not start; see {run_dir / 'stations.log'}")
    return proc, urls


def one_level(args: argparse.Namespace, count: int, run_dir: Path) -> dict[str, float]:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    stations, urls = start_stations(count, run_dir, args.bitrate)
    site = run_dir / "site"
    site.mkdir()
    (site / "index.html").write_text("<html><body>" + "".join(
        f'<p>Station {i}</p><audio controls src="{u}"></audio>' for i, u in enumerate(urls)) + "</body></html>")
    port = free_port()
    server = Child("siteserver", [PY, str(ROOT / "scripts" / "siteserver.py"), str(site), "--port", str(port)],
                   log=run_dir / "siteserver.log")
    try:
        wait_for_port(port, server)
        config = cluster.master_config(run_dir, [f"http://127.0.0.1:{port}/"], ["w1"],
                                       crawl={"allowed_networks": ["127.0.0.0/8"]})
        worker_yaml = run_dir / "worker.yaml"
        worker_yaml.write_text(yaml.safe_dump({
            "live_record_seconds": args.window, "downloads": max(2, 2 * count),
            "pending_downloads": max(256, 2 * count), "identify": {"enabled": args.identify == "on"}}))
        data_dir = Path(yaml.safe_load(config.read_text())["data_dir"])
        addr_file = data_dir / "master.addr"
        t0 = time.monotonic()
        master = Child("master", [PY, "-m", "crawler.master", "--config", str(config), "--log-level", "warning"],
                       log=run_dir / "master.log", stdout=run_dir / "master.out")
        while not (addr_file.exists() and addr_file.read_text().strip()):
            if not master.running() or time.monotonic() - t0 > 30:
                master.stop()
                raise RuntimeError(f"the master did not start; its log: {master.log}")
            time.sleep(0.02)   # the master's only sign of life is this file
        worker = Child("worker", [PY, "-m", "crawler.worker", "--master", addr_file.read_text().strip(), "--id",
                                  "w1", "--data-dir", str(run_dir / "worker-w1"), "--secret-file",
                                  str(run_dir / "secret"), "--config", str(worker_yaml), "--log-level", "warning"],
                       log=run_dir / "worker.log")
        try:
            master.wait(args.window * 3 + 120)
            used = worker.wait(60)
        finally:
            master.stop()
            worker.stop()
        wall = time.monotonic() - t0
    finally:
        server.stop()
        stations.kill()
        stations.wait()
    rows = [json.loads(line) for line in (data_dir / "catalog.jsonl").read_text().splitlines() if line.strip()]
    recorded = [r for r in rows if (r.get("extra") or {}).get("live") and r.get("sha256")]
    durations = [float(r.get("duration") or 0) for r in recorded]
    return {"streams": count, "recorded": len(recorded),
            "whole": sum(d >= WHOLE * args.window for d in durations),
            "minutes": sum(durations) / 60, "cpu_s": used.cpu_s, "rss_mb": used.peak_rss_mb, "wall": wall,
            "core_share": used.cpu_s / wall if wall else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="1,32,128", help="levels: stations recorded at once, comma separated")
    ap.add_argument("--window", type=float, default=60.0, help="live_record_seconds")
    ap.add_argument("--bitrate", type=int, default=128, help="kbit/s of every station")
    ap.add_argument("--identify", choices=["on", "off"], default="off",
                    help="fingerprint every recording too (in the worker's fingerprint processes)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-data-streams")
    args = ap.parse_args()
    levels = sorted({int(x) for x in args.streams.split(",")} | {1})
    print(f"{levels} stations at {args.bitrate} kbit/s, {args.window:.0f} s windows, fingerprints {args.identify}, "
          f"files under {args.out}")
    results = []
    for n in levels:
        r = one_level(args, n, args.out / f"streams-{n}")
        results.append(r)
        print(f"  {n:5d} streams: {r['recorded']:5d} recorded, {r['whole']:5d} windows whole, "
              f"{r['minutes']:8.1f} stream-min, worker CPU {r['cpu_s']:7.2f} s ({100 * r['core_share']:5.1f}% "
              f"of a core over {r['wall']:.0f} s), peak RSS {r['rss_mb']:6.1f} MB", flush=True)
    base = results[0]
    print("per stream-minute, above the one-station level:")
    for r in results[1:]:
        minutes = r["minutes"] - base["minutes"]
        if minutes <= 0:
            continue
        cpu = (r["cpu_s"] - base["cpu_s"]) / minutes
        mem = (r["rss_mb"] - base["rss_mb"]) / (r["streams"] - base["streams"])
        print(f"  {r['streams']:5d} streams: CPU {1000 * cpu:7.1f} ms per stream-minute, memory "
              f"{1024 * mem:7.1f} KiB per stream, streams per core {60 / cpu if cpu > 0 else float('inf'):8.0f}, "
              f"windows whole {r['whole']}/{r['streams']}")


if __name__ == "__main__":
    main()
