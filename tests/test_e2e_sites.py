"""End to end with real processes: two loopback sites (two ports of 127.0.0.1), one with a policy of its own in
the master's sites: table (delay, concurrency, user agent, a header, a deeper max_depth), the other with none.

Each site records every request as it comes and as its answer goes, with the headers that came. Checked: the
policy site's pages are let go by the master no closer than its min_delay (less the gate's documented slack) and
never two in flight at the site, nor two downloads; every request to it (pages and audio) carries its user agent
and header and no request to the other does; both are crawled whole to their own depth (a link from the plain site
into the deeper one is followed past the crawl's limit); `status --json` and `status` show the site's figures."""

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass

import pytest
from aiohttp import web

from crawler.politeness import SLACK_CAP
from testkit import cluster, sitegen

pytestmark = pytest.mark.timeout(300)

DELAY = 0.1          # site A's min_delay and audio_min_delay
CHAIN = 6            # /d/1.html ... /d/6.html: a chain of pages one level deeper each
FLAT = 8             # /p/0.html ... : pages the home page links to (depth 1)
AUDIO = 4            # /a/0.mp3 ... : named by the flat pages


@dataclass(frozen=True)
class Hit:
    start: float
    end: float
    path: str
    user_agent: str
    x_site: str | None


class Site:
    """A home page linking FLAT pages and the first of a CHAIN; each flat page names an mp3; every answer takes
    `latency` so that requests would overlap if the crawl let them. extra: path -> more links on that page."""

    def __init__(self, latency: float = 0.02) -> None:
        self.latency = latency
        self.hits: list[Hit] = []
        self.extra: dict[str, list[str]] = {}
        self._in_flight = {"page": 0, "audio": 0}
        self.most_in_flight = {"page": 0, "audio": 0}
        rng = random.Random(7)
        self.mp3 = [sitegen._mp3(rng, 12_000, f"Song {i}", "Artist", "Album") for i in range(AUDIO)]
        self.url = ""

    def _page(self, path: str) -> str:
        links = list(self.extra.get(path, ()))
        if path == "/":
            links += [f"/p/{i}.html" for i in range(FLAT)] + ["/d/1.html"]
        elif path.startswith("/d/"):
            n = int(path[3:].split(".")[0])
            if n < CHAIN:
                links.append(f"/d/{n + 1}.html")
        elif path.startswith("/p/"):
            i = int(path[3:].split(".")[0])
            if i < AUDIO:
                links.append(f"/a/{i}.mp3")
        body = "".join(f'<a href="{u}">{u}</a> ' for u in links)
        return f"<html><head><title>{path}</title></head><body>{body}</body></html>"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        start = time.monotonic()
        path = request.path
        kind = "audio" if path.startswith("/a/") else "page"
        self._in_flight[kind] += 1
        self.most_in_flight[kind] = max(self.most_in_flight[kind], self._in_flight[kind])
        try:
            await asyncio.sleep(self.latency)
            if kind == "audio":
                resp: web.StreamResponse = web.Response(body=self.mp3[int(path[3:].split(".")[0])],
                                                        content_type="audio/mpeg")
            elif path == "/" or path.startswith(("/p/", "/d/")) or path in self.extra_pages():
                resp = web.Response(text=self._page(path), content_type="text/html")
            else:
                resp = web.Response(status=404, text="no")
            return resp
        finally:
            self._in_flight[kind] -= 1
            self.hits.append(Hit(start, time.monotonic(), path, request.headers.get("User-Agent", ""),
                                 request.headers.get("X-Site")))

    def extra_pages(self) -> set[str]:
        return {"/cross.html", "/from-a.html"}

    def paths(self, prefix: str = "") -> set[str]:
        return {h.path for h in self.hits if h.path.startswith(prefix)}

    async def __aenter__(self) -> "Site":
        server = web.Server(self.handle)
        self._runner = web.ServerRunner(server, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()


async def test_a_sites_policy_is_enforced_by_the_master_and_applied_by_the_workers(tmp_path):
    async with Site() as a, Site() as b:
        # A link from the plain site into the deep one at depth 3 (past the crawl's 2, within A's 4), and one
        # from A's depth 4 into the plain site at depth 5 (past B's limit).
        b.extra["/d/2.html"] = [a.url + "/cross.html"]
        a.extra["/d/4.html"] = [b.url + "/from-a.html"]
        a_key = a.url.removeprefix("http://")
        sites = {a_key: {"politeness": {"min_delay": DELAY, "max_per_host": 1, "audio_min_delay": DELAY,
                                        "audio_max_per_host": 1},
                         "user_agent": "site-a-agent/1", "headers": {"X-Site": "A"}, "max_depth": 4}}
        nodes = ["w1", "w2"]
        config = cluster.master_config(tmp_path, [a.url + "/", b.url + "/"], nodes, crawl={"max_depth": 2},
                                       sites=sites)
        master = await cluster.start_master(config, tmp_path, log_level="debug")
        workers = []
        try:
            addr = cluster.master_addr(config)
            for n in nodes:
                wcfg = tmp_path / f"worker-{n}.yaml"
                wcfg.write_text("user_agent: plain-worker/1\n")
                workers.append(await cluster.start_worker(addr, n, tmp_path, config=wcfg))
            assert await master.wait(120) == 0, master.log()[-3000:]
            for w in workers:
                assert await w.wait(30) == 0, w.log()[-3000:]
        finally:
            for proc in [master, *workers]:
                await proc.stop()
        log = master.log()

    # Both crawled whole, each to its own depth.
    flat = {f"/p/{i}.html" for i in range(FLAT)}
    audio = {f"/a/{i}.mp3" for i in range(AUDIO)}
    assert a.paths() == {"/", *flat, *audio, *(f"/d/{i}.html" for i in range(1, 5)), "/cross.html"}, a.paths()
    assert b.paths() == {"/", *flat, *audio, "/d/1.html", "/d/2.html"}, b.paths()
    assert all(h.end >= h.start for h in a.hits + b.hits)

    # Every request to A, page or download, as A's policy says; none to B.
    assert {(h.user_agent, h.x_site) for h in a.hits} == {("site-a-agent/1", "A")}
    assert {(h.user_agent, h.x_site) for h in b.hits} == {("plain-worker/1", None)}

    # A's concurrency: never two pages at once, nor two downloads (B, with the crawl's, had more than one).
    assert a.most_in_flight == {"page": 1, "audio": 1}, a.most_in_flight
    # A's spacing where the master keeps it: no two of A's pages let go closer than the delay less the slack.
    sent = [(t, urls) for t, _, urls in cluster.assignments(log)]
    a_starts = [t for t, urls in sent for u in urls if u.startswith(a.url)]
    assert len(a_starts) == len([h for h in a.hits if h.path.startswith(("/", "/p/", "/d/")) and
                                 not h.path.startswith("/a/")])
    gaps = [y - x for x, y in itertools.pairwise(a_starts)]
    assert min(gaps) >= DELAY - SLACK_CAP - 1e-6, f"two of A's pages let go {min(gaps):.4f} s apart"
    # At the site each start has also crossed a worker process, whose lateness varies; over the crawl it washes
    # out: the mean spacing of A's pages and of its downloads is the delay or more.
    for kind in ("page", "audio"):
        starts = sorted(h.start for h in a.hits if (h.path.startswith("/a/")) == (kind == "audio"))
        mean = (starts[-1] - starts[0]) / (len(starts) - 1)
        assert mean >= DELAY * 0.9, f"A's {kind} requests {mean:.3f} s apart on average"

    # The status shows A's figures (from the master's last view).
    st = json.loads(await asyncio.to_thread(cluster.operator, "status", config, "--json"))
    fig = st["sites"][a_key]
    a_pages = len(a.paths()) - AUDIO
    assert (fig["pages_done"], fig["pages_failed"], fig["pages_in_flight"]) == (a_pages, 0, 0), fig
    assert (fig["audio"], fig["audio_in_flight"]) == (AUDIO, 0), fig
    assert (fig["max_per_host"], fig["min_delay_s"], fig["audio_max_per_host"], fig["max_depth"]) == \
        (1, DELAY, 1, 4), fig
    assert list(st["sites"]) == [a_key]
    text = await asyncio.to_thread(cluster.operator, "status", config)
    assert "sites (their own policy; this run):" in text and a_key in text, text
