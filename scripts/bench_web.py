"""Does the status page slow the crawl? Crawl pages/s with nobody watching, beside the same crawl with the page
open and refreshing every 2 s.

Rounds on one generated site (master + 2 workers, as the demo runs them), each from a fresh state:
  none     the web server on, nobody asking
  poller   the requests the page makes every 2 s (/, then /api/status, /api/recent, /api/audio), sent by a
           small process of its own: the master's own cost of serving the page
  browser  the page in a real headless Chromium with ?refresh=2 (the browser's own CPU competes with the crawl
           on the same machine, which an operator's browser elsewhere would not)
  cost     a crawl, then the master started again on its finished state and asked for 100 refreshes back to
           back: its CPU time per refresh (steadier than pages/s on a busy machine)

Prints pages/s from the master's summary for each round. One run each: on a shared machine the figures move
by several per cent from run to run, so read differences of that size as noise.

    .venv/bin/python scripts/bench_web.py [--songs 1500] [--rounds none,poller,browser,none,poller,cost]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit import cluster, sitegen, siteserver

REFRESH = 2.0


async def poll_until_terminated(url: str) -> None:
    """--poll: in a process of its own, so that neither the site server nor this script's GIL delays it."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(json.dumps(await poll(url, stop, lambda: print("ready", flush=True))), flush=True)


async def poll_process(url: str, stop: asyncio.Event, ready: asyncio.Event) -> list[float]:
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, "--poll", url,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.readline()   # "ready": the page is open before the crawl starts
    ready.set()
    await stop.wait()
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = await proc.communicate()
    return json.loads(out)


async def poll(url: str, stop: asyncio.Event, ready: Callable[[], None]) -> list[float]:
    """The page's requests every REFRESH seconds; returns how long each refresh took (all three answers)."""
    took: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        (await client.get("/")).raise_for_status()
        ready()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                for path in ("/api/status", "/api/recent", "/api/audio?limit=15"):
                    (await client.get(path)).raise_for_status()
            except httpx.TransportError:
                break   # the crawl is over and the master gone, a moment before we are told to stop
            took.append(time.perf_counter() - t0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REFRESH)
    return took


async def browse(url: str, stop: asyncio.Event, ready: asyncio.Event) -> list[float]:
    from playwright.async_api import async_playwright

    from testkit.browser import chromium

    async with chromium() as ws, async_playwright() as pw:
        browser = await pw.chromium.connect_over_cdp(ws)
        page = await browser.new_page()
        await page.goto(f"{url}/?refresh={REFRESH:g}")
        ready.set()
        await stop.wait()
        await browser.close()
    return []


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


async def cpu_per_refresh(config: Path, out: Path, refreshes: int = 100) -> tuple[float, float]:
    """The master's CPU time per refresh of the page, on the finished crawl's state, refreshes back to back;
    CPU time, unlike wall time, hardly depends on what else the machine runs. Returns (ms per refresh, idle
    ms per second) so the master's own idle ticking can be told apart."""
    raw = yaml.safe_load(config.read_text())
    raw["exit_when_done"] = False
    config.write_text(yaml.safe_dump(raw))
    master = await cluster.start_master(config, out, log_name="master-idle.log")
    try:
        url = cluster.web_url(config)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await client.get("/api/status")
            c0, t0 = cpu_seconds(master.proc.pid), time.monotonic()
            await asyncio.sleep(5)
            idle = (cpu_seconds(master.proc.pid) - c0) / (time.monotonic() - t0)
            c0, t0 = cpu_seconds(master.proc.pid), time.monotonic()
            for _ in range(refreshes):
                for path in ("/api/status", "/api/recent", "/api/audio?limit=15"):
                    (await client.get(path)).raise_for_status()
            used = cpu_seconds(master.proc.pid) - c0 - idle * (time.monotonic() - t0)
    finally:
        await master.stop()
    return used / refreshes * 1000, idle * 1000


async def one_round(site_dir: Path, manifest: sitegen.Manifest, mode: str, work: Path) -> tuple[float, list]:
    out = Path(tempfile.mkdtemp(prefix=mode + "-", dir=work))
    async with await siteserver.start(site_dir) as site:
        config = cluster.master_config(out, [site.url + "/"], ["node1", "node2"],
                                       crawl={"max_depth": manifest.max_depth + 3})
        master = await cluster.start_master(config, out)
        stop, ready = asyncio.Event(), asyncio.Event()
        watcher = None
        if mode == "poller":
            watcher = asyncio.create_task(poll_process(cluster.web_url(config), stop, ready))
        elif mode == "browser":
            watcher = asyncio.create_task(browse(cluster.web_url(config), stop, ready))
        if watcher is not None:   # the page is open before the first worker starts
            await asyncio.wait([watcher, asyncio.ensure_future(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
            if watcher.done():
                watcher.result()
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, out, extra=["--concurrency", "32"])
                   for n in ("node1", "node2")]
        rc = await master.wait(900)
        stop.set()
        took = await watcher if watcher is not None else []
        for w in workers:
            await w.wait(30)
    if rc != 0:
        raise RuntimeError(f"master exited with {rc}: {master.log()[-2000:]}")
    lines = {line[:16].strip(): line[16:].strip() for line in master.stdout.decode().splitlines()[1:]}
    if mode == "cost":
        ms, idle = await cpu_per_refresh(config, out)
        print(f"  the master's CPU per refresh of the page (3 requests, {len(manifest.audio)} catalogue rows): "
              f"{ms:.2f} ms, i.e. {ms / REFRESH / 10:.2f} % of a core at one refresh every {REFRESH:g} s "
              f"(idle master: {idle:.1f} ms CPU per s)")
    return float(lines["throughput"].split()[0]), took


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--songs", type=int, default=1500)
    ap.add_argument("--poll", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", default="none,poller,browser,none,poller,cost",
                    help="comma-separated; repeat a mode to see the run-to-run noise")
    args = ap.parse_args()
    if args.poll:
        await poll_until_terminated(args.poll)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-web-"))
    try:
        manifest = sitegen.generate(work / "site", songs=args.songs)
        print(f"site: {len(manifest.pages)} pages, {len(manifest.audio)} audio items; page refresh every "
              f"{REFRESH:g} s")
        for mode in args.rounds.split(","):
            rate, took = await one_round(work / "site", manifest, mode, work)
            extra = ""
            if took:
                extra = (f"   (a refresh, 3 requests: median {statistics.median(took) * 1000:.1f} ms, "
                         f"max {max(took) * 1000:.1f} ms, {len(took)} refreshes)")
            if mode != "cost":
                print(f"  {mode:<8} {rate:8.1f} pages/s{extra}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
