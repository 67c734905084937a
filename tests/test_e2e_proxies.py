"""End to end through proxies: the real master and workers as processes, loopback proxies as processes of their own
(testkit/proxyserver.py), and a site that drops every connection not coming from the proxies' source addresses
(127.0.0.2, 127.0.0.3; the crawl itself runs on 127.0.0.1)."""

import asyncio
import dataclasses
import signal
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from crawler.http.egress import Egress
from crawler.http.proxies import Proxy
from crawler.worker.config import WorkerConfig
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)

SOURCES = frozenset({"127.0.0.2", "127.0.0.3"})
# A worker's requests in flight at once by default: its page fetches and its audio downloads.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
WORKER_IN_FLIGHT = int(_DEFAULTS["concurrency"]) + int(_DEFAULTS["downloads"])


class ProxyProc:
    def __init__(self, proc: asyncio.subprocess.Process, port: int, kind: str) -> None:
        self.proc, self.port, self.kind = proc, port, kind

    @property
    def url(self) -> str:
        return f"{self.kind}://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        self.kill()
        await self.proc.wait()


async def start_proxy(kind: str, source: str, credentials: Path | None = None) -> ProxyProc:
    args = [sys.executable, "-m", "testkit.proxyserver", "--kind", kind, "--source", source]
    if credentials is not None:
        args += ["--credentials-file", str(credentials)]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 30)
    assert line.startswith(b"listening "), line
    return ProxyProc(proc, int(line.split()[1]), kind)


async def until_metrics(url: str, label: str, name: str) -> str:
    """The /metrics text once a series of ``name`` with ``label`` counts at least one."""
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            async with session.get(url) as r:
                text = await r.text()
            if any(line.startswith(name) and label in line and float(line.rsplit(" ", 1)[1]) >= 1
                   for line in text.splitlines()):
                return text
            await asyncio.sleep(0.1)
    raise AssertionError(f"{name} for {label} never showed at {url}:\n{text}")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=40)


async def origins_split(site_dir, behaviour, proxies: list[Proxy], at_least: int):
    """Site servers of the same site, one origin each, until both proxies are the first choice of some: the
    choice is deterministic (rendezvous hashing), so the test picks origins that make the load split."""
    servers, egress = [], Egress()
    first: Counter[Proxy] = Counter()
    while len(servers) < at_least or len(first) < len(proxies):
        server = await siteserver.start(site_dir, behaviour=behaviour)
        servers.append(server)
        first[egress.choose(f"127.0.0.1:{server.port}", proxies, 0.0)] += 1
        assert len(servers) < 40
    return servers


def check_complete(servers, manifest, tmp_path, workers):
    rows = cluster.catalogue(tmp_path)
    for server in servers:
        base = server.url
        gets = Counter(e.path for e in server.log if e.method == "GET" and e.status)
        for path in manifest.pages:
            assert gets[path] >= 1, f"{base}{path} never fetched"
        found = {(r["url"].removeprefix(base), r["page"].removeprefix(base)): r for r in rows
                 if r["url"].startswith(base + "/")}
        for a in manifest.audio:
            row = found.get((a.url, a.page))
            assert row is not None, f"{base}{a.url} missing"
            assert row["sha256"] == a.sha256, (a.url, row.get("status"), row.get("reason"))
        # Nothing reached the site but through the proxies.
        assert {e.peer for e in server.log} <= SOURCES


async def test_a_site_admitting_only_two_proxies_is_crawled_whole_through_them_and_one_dies_midway(site, tmp_path):
    site_dir, manifest = site
    creds = tmp_path / "proxy-creds"
    creds.write_text("crawl:s3cret word\n")
    plain = await start_proxy("http", "127.0.0.2")
    authed = await start_proxy("http", "127.0.0.3", creds)
    proxies = [Proxy("http", "127.0.0.1", plain.port), Proxy("http", "127.0.0.1", authed.port, "crawl", "s3cret word")]
    behaviour = siteserver.Behaviour(record_log=True, peers=SOURCES, slow_paths={r"\.html$": 0.02})
    servers = await origins_split(site_dir, behaviour, proxies, at_least=3)
    try:
        config = cluster.master_config(
            tmp_path, [s.url + "/" for s in servers], ["w1", "w2"],
            crawl={"max_depth": manifest.max_depth + 3}, politeness={"obey_robots": True},
            proxies=[plain.url, {"url": authed.url, "credentials_file": str(creds)}])
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        w1 = await cluster.start_worker(addr, "w1", tmp_path, extra=["--metrics-listen", "127.0.0.1:0"])
        w2 = await cluster.start_worker(addr, "w2", tmp_path)

        def through(source: str) -> int:
            return sum(1 for s in servers for e in s.log if e.peer == source)

        await cluster.until(lambda: through("127.0.0.2") >= 20 and through("127.0.0.3") >= 20, 120,
                            "both proxies carrying requests")
        await plain.stop()         # mid-crawl (SIGKILL, then reaped): its origins move to the other proxy
        before = through("127.0.0.2")
        # The dead proxy's failures reach the master's /metrics through the heartbeats, per node; the worker's
        # own /metrics has them too. Labels only: the credentials never show.
        master_metrics = await until_metrics(cluster.web_url(config) + "/metrics", f'proxy="{plain.url}"',
                                             "crawler_proxy_failures_total")
        assert any(line.startswith("crawler_proxy_requests_total{") and f'proxy="{authed.url}"' in line
                   and 'node="w' in line for line in master_metrics.splitlines()), master_metrics
        waddr = (tmp_path / "worker-w1" / "metrics.addr").read_text().strip()
        worker_metrics = await until_metrics(f"http://{waddr}/metrics", f'proxy="{plain.url}"',
                                             "crawler_proxy_failures_total")
        assert "s3cret" not in master_metrics + worker_metrics
        # Seconds after the death: what the dead proxy had already handed the origins has been answered.
        settled = through("127.0.0.2")
        rc = await master.wait(240)
        assert rc == 0, master.log()[-3000:]
        assert await w1.wait(30) == 0 and await w2.wait(30) == 0
    finally:
        await plain.stop()
        await authed.stop()
        for s in servers:
            await s.close()
    # After the kill only the requests already under way came from the dead proxy's address (logged as they end):
    # at most every request the two workers had in flight, and none once those were answered.
    assert through("127.0.0.3") > 40
    assert settled - before <= 2 * WORKER_IN_FLIGHT and through("127.0.0.2") == settled
    check_complete(servers, manifest, tmp_path, ["w1", "w2"])
    # robots.txt came through the proxies too (the master's own fetch), and nothing failed.
    for s in servers:
        assert any(e.path == "/robots.txt" for e in s.log), s.url
    rows = cluster.catalogue(tmp_path)
    not_ok = [r for r in rows if r["status"] != "ok"]
    assert not not_ok, not_ok[:3]
    wlog = (tmp_path / "worker-w1.log").read_text() + (tmp_path / "worker-w2.log").read_text()
    assert "Traceback" not in wlog


async def test_socks5_with_credentials_from_the_workers_own_flag(site, tmp_path):
    site_dir, manifest = site
    creds = tmp_path / "socks-creds"
    creds.write_text("sock:pw\n")
    socks = await start_proxy("socks5", "127.0.0.2", creds)
    behaviour = siteserver.Behaviour(record_log=True, peers=SOURCES)
    server = await siteserver.start(site_dir, behaviour=behaviour)
    try:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"],
                                       crawl={"max_depth": manifest.max_depth + 3})
        worker_cfg = tmp_path / "w1.yaml"
        worker_cfg.write_text(f"proxies:\n  - url: {socks.url}\n    credentials_file: {creds}\n")
        master = await cluster.start_master(config, tmp_path)
        w1 = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=worker_cfg)
        rc = await master.wait(240)
        assert rc == 0, master.log()[-3000:]
        assert await w1.wait(30) == 0
    finally:
        await socks.stop()
        await server.close()
    check_complete([server], manifest, tmp_path, ["w1"])


async def test_the_browser_resolver_goes_through_the_proxy(tmp_path):
    """Real headless Chromium: its every connection leaves through the worker's local interception proxy, whose
    upstream is the crawl's proxy; the site sees only the proxy's source address."""
    import yaml

    from testkit import playersite
    from testkit.browser import TEST_BROWSER_ARGS, TEST_BROWSER_USER

    proxy = await start_proxy("http", "127.0.0.3")
    site = playersite.PlayerSite()
    try:
        async with playersite.serve(site) as base:
            config = cluster.master_config(tmp_path, [base + "/"], ["b1"], crawl={"max_depth": 2},
                                           proxies=[proxy.url])
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text(yaml.safe_dump({"concurrency": 4, "user_agent": "SiteTestBrowser/1.0", "resolvers": {
                "browser": {"max_pages": 2, "page_timeout": 60, "args": TEST_BROWSER_ARGS,
                            "user": TEST_BROWSER_USER},
                "generic": {}}}))
            master = await cluster.start_master(config, tmp_path)
            worker = await cluster.start_worker(cluster.master_addr(config), "b1", tmp_path, config=wcfg)
            assert await master.wait(180) == 0, master.log()[-3000:] + worker.log()[-3000:]
            assert await worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        await proxy.stop()
    rows = cluster.catalogue(tmp_path)
    assert sorted(r["title"] for r in rows) == ["Assembled Song", "Signed Song", "Streamed Song"], rows
    assert all(r["status"] == "ok" and r["sha256"] for r in rows), rows
    assert site.browser_paths() and "/static/song1.js" in site.browser_paths()
    assert site.api_calls and site.stream_denied == 0
    # Every request (the browser's, the worker's own, the downloads) came through the proxy.
    assert {r.peer for r in site.log} == {"127.0.0.3"}, Counter(r.peer for r in site.log)


async def test_with_every_proxy_down_tasks_are_handed_back_and_the_crawl_ends_whole_once_one_is_up(site, tmp_path):
    """No proxy can carry a request: the worker hands its tasks back (no attempt counted, nothing failed) until
    the proxy comes up, then the crawl finishes through it."""
    site_dir, manifest = site
    port = cluster.free_port()
    server = await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True, peers=SOURCES))
    proxy = None
    try:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"],
                                       crawl={"max_depth": manifest.max_depth + 3},
                                       proxies=[f"socks5://127.0.0.1:{port}"])
        master = await cluster.start_master(config, tmp_path)
        w1 = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        await cluster.until(lambda: "handing back" in w1.log(), 60, "a task handed back for want of a proxy")
        args = [sys.executable, "-m", "testkit.proxyserver", "--kind", "socks5", "--source", "127.0.0.2",
                "--port", str(port)]
        proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
        proxy = ProxyProc(proc, port, "socks5")
        rc = await master.wait(240)
        assert rc == 0, master.log()[-3000:]
        assert await w1.wait(30) == 0
    finally:
        if proxy is not None:
            await proxy.stop()
        await server.close()
    check_complete([server], manifest, tmp_path, ["w1"])
    rows = cluster.catalogue(tmp_path)
    assert rows and all(r["status"] == "ok" for r in rows)
    # Handed back, never reported as failed or retried for the proxy's sake.
    assert "no proxy" in w1.log() and "failed unexpectedly" not in w1.log()
    assert "no proxy" in master.log()                          # the hand-back's reason, as the master heard it
    assert "\n  errors          0\n" in master.stdout.decode(), master.stdout.decode()
