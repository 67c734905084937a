"""End to end with real processes: workers die, join, lose their network; politeness holds across workers."""

import asyncio
import itertools
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from crawler.politeness import SLACK_CAP
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=200)




async def test_worker_killed_and_worker_joining_mid_crawl(site, tmp_path, master_store):
    site_dir, manifest = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.25}, record_log=True)
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2", "w3", "w4"],
                                       crawl={"max_depth": manifest.max_depth + 3}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        opts = ["--concurrency", "4"]
        workers = {n: await cluster.start_worker(addr, n, tmp_path, extra=opts) for n in ("w1", "w2", "w3")}
        total = sum(1 for p in manifest.pages if p.endswith(".html"))
        await cluster.until(lambda: len(cluster.pages_of(tmp_path, "w2")) >= 5, 60, "w2 to fetch some pages")
        # The crawl waits while w4 starts, so it joins mid-crawl however long a loaded machine takes to start a
        # process; the tasks already out (w2's among them) go on meanwhile.
        await asyncio.to_thread(cluster.operator, "pause", config)
        workers["w4"] = await cluster.start_worker(addr, "w4", tmp_path, extra=opts)
        workers["w2"].kill()                      # SIGKILL: no goodbye, leases in flight
        await cluster.until(lambda: "worker w4 joined" in master.log(), 60, "w4 to join")
        left_at_join = total - len({e.path for e in server.log if e.path.endswith(".html")})
        assert left_at_join > total / 3, "the crawl was nearly over when w4 joined: slow the site down"
        await asyncio.to_thread(cluster.operator, "resume", config)
        assert await master.wait(240) == 0, master.log()[-3000:]
        for n in ("w1", "w3", "w4"):
            assert await workers[n].wait(30) == 0
        log = list(server.log)

    gets = Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".html"))
    lost = [p for p in manifest.pages if p.endswith(".html") and gets[p] == 0]
    assert not lost, f"{len(lost)} pages never fetched, e.g. {lost[:5]}"
    # Pages fetched twice: at most what w2 had in flight when it died (its credit).
    twice = sum(c - 1 for c in gets.values() if c > 1)
    assert twice <= 2 * 4 + 2 * 8, twice   # concurrency 4, 8 downloads
    # Three live nodes of four: w4 should take about a third of what was left when it joined.
    assert len(cluster.pages_of(tmp_path, "w4")) > 0.15 * left_at_join, "the joining worker got no share of the crawl"
    assert "worker w2 disconnected" in master.log() or "w2 left" in master.log()


async def test_politeness_min_delay_holds_across_all_workers(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=30)
    delay = 0.05
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"],
                                       crawl={"max_depth": 10},
                                       politeness={"min_delay": delay, "obey_robots": True})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("download_audio: false\nconcurrency: 8\n")
        master = await cluster.start_master(config, tmp_path, log_level="debug")
        addr = cluster.master_addr(config)
        ws = [await cluster.start_worker(addr, n, tmp_path, config=wcfg) for n in ("w1", "w2")]
        assert await master.wait(120) == 0, master.log()[-3000:]
        for w in ws:
            assert await w.wait(30) == 0
        log = sorted(e.time for e in server.log if e.path != "/robots.txt")
    assert len(log) > 30
    # The master lets requests go exactly when the delay has passed (less the gate's small slack); what the site
    # sees adds each start's trip through a worker process, which a loaded machine stretches by milliseconds
    # either way, so there only the rate over the whole crawl is held to the delay.
    sent = [t for t, _, _ in cluster.assignments(master.log())]
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert min(gaps) >= delay - SLACK_CAP - 1e-6, f"two requests {min(gaps):.4f} s apart; the minimum delay is {delay}"
    assert (len(log) - 1) / (log[-1] - log[0]) <= 1.1 / delay
    # Both workers took part, so the spacing really was enforced across them.
    assert cluster.pages_of(tmp_path, "w1") and cluster.pages_of(tmp_path, "w2")


# ------------------------------------------------------------------------------------------- namespaces
NS = ["acn-m", "acn-a", "acn-b", "acn-sw"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _netns_available() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    try:
        _ip("netns", "add", "acn-probe")
        _ip("netns", "del", "acn-probe")
    except subprocess.CalledProcessError as e:
        return f"cannot create network namespaces here: {e.stderr.decode().strip()}"
    return None


@pytest.fixture
def netns():
    reason = _netns_available()
    if reason:
        pytest.skip(reason)
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    addrs = {"acn-m": "10.231.0.1", "acn-a": "10.231.0.2", "acn-b": "10.231.0.3"}
    try:
        for ns in NS:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", "acn-sw", "link", "add", "br0", "type", "bridge")
        _ip("-n", "acn-sw", "link", "set", "br0", "up")
        for ns, addr in addrs.items():
            port = "sw-" + ns[-1]
            _ip("-n", "acn-sw", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", "acn-sw", "link", "set", port, "master", "br0")
            _ip("-n", "acn-sw", "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        yield addrs
    finally:
        for ns in NS:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


async def _in_ns(ns: str, name: str, args: list[str], log: Path, *, read_stdout: bool = True) -> cluster.Proc:
    fh = open(log, "wb")
    proc = await asyncio.create_subprocess_exec("ip", "netns", "exec", ns, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=fh, stdin=asyncio.subprocess.DEVNULL,
                                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    fh.close()
    p = cluster.Proc(name, proc, log)
    if read_stdout:
        p._out_task = asyncio.ensure_future(proc.stdout.read())
    return p


async def test_cut_link_detected_within_heartbeat_timeout_and_work_moves(site, tmp_path, netns):
    site_dir, manifest = site
    m = netns["acn-m"]
    py = sys.executable
    siteproc = await _in_ns("acn-m", "site", [py, str(ROOT / "scripts" / "siteserver.py"), str(site_dir),
                                               "--host", m, "--port", "8080", "--slow", r"\.html$=0.03"],
                            tmp_path / "site.log", read_stdout=False)
    timeout = 3.0
    try:
        line = await asyncio.wait_for(siteproc.proc.stdout.readline(), 30)
        assert line.startswith(b"http://"), line
        siteproc._out_task = asyncio.ensure_future(siteproc.proc.stdout.read())
        config = cluster.master_config(tmp_path, [f"http://{m}:8080/"], ["a", "b"], listen=f"{m}:7700",
                                       crawl={"max_depth": manifest.max_depth + 3},
                                       scheduling={"heartbeat_interval": 0.5, "heartbeat_timeout": timeout})
        master = await _in_ns("acn-m", "master", [py, "-m", "crawler.master", "--config", str(config)],
                              tmp_path / "master.log")
        await cluster.until(lambda: (tmp_path / "master" / "master.addr").exists(), 30, "the master to listen")
        workers = {}
        for node in ("a", "b"):
            workers[node] = await _in_ns(
                f"acn-{node}", f"worker {node}",
                [py, "-m", "crawler.worker", "--master", f"{m}:7700", "--id", node, "--data-dir",
                 str(tmp_path / f"worker-{node}"), "--secret-file", str(tmp_path / "secret"),
                 "--concurrency", "4"], tmp_path / f"worker-{node}.log")
        await cluster.until(lambda: len(cluster.pages_of(tmp_path, "a")) >= 10, 60, "worker a to fetch some pages")
        _ip("-n", "acn-sw", "link", "set", "sw-a", "down")      # the cable is pulled: no FIN, no RST
        cut = time.monotonic()
        await cluster.until(lambda: "worker a silent" in master.log(), timeout + 5, "the master to notice")
        detected = time.monotonic() - cut
        assert detected <= timeout + 2.0, detected
        assert await master.wait(240) == 0, master.log()[-3000:]
        assert await workers["b"].wait(30) == 0
        await workers["a"].stop()
    finally:
        await siteproc.stop()
    fetched = set(cluster.pages_of(tmp_path, "a")) | set(cluster.pages_of(tmp_path, "b"))
    base = f"http://{m}:8080"
    missing = [p for p in manifest.pages if base + p not in fetched and p.endswith(".html")]
    assert not missing, f"{len(missing)} pages never fetched, e.g. {missing[:5]}"
