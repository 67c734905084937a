"""The browser resolver: its decisions (pure), its config, and real Chromium against the player site on loopback:
deadlines, crashes, recycling, the tab bound, and navigation that must not leave the page's host."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from crawler.items import AudioItem
from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    ResolverConfigError,
    ResolverUnavailable,
)
from crawler.resolvers.browser import (
    BrowserResolver,
    Recording,
    Traffic,
    classify,
    host_matches,
    manifest_uris,
    request_allowed,
)
from crawler.resolvers.chromium import LOOPBACK_ONLY_ARGS, PROFILE_PREFIX, sweep_stale_profiles, tree_pids
from crawler.resolvers.registry import followers, load_resolvers, pick
from crawler.web.page import FetchedPage
from crawler.worker.fetcher import PageFetcher, build_client, build_transport
from tests.fakes import playersite

pytestmark = pytest.mark.timeout(180)

UA = "SiteTestBrowser/1.0"
REPO = Path(__file__).resolve().parent.parent
TEST_ARGS = LOOPBACK_ONLY_ARGS


def html_page(url: str, body: bytes, content_type: str = "text/html", status: int = 200) -> FetchedPage:
    return FetchedPage(url=url, final_url=url, status=status, content_type=content_type, headers={}, body=body)


# -- decisions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, ctype, kind", [
    ("http://a.test/x.mp3?sig=1", None, "audio"),
    ("http://a.test/stream/abc", "audio/mpeg", "audio"),
    ("http://a.test/live/index.m3u8", None, "hls"),
    ("http://a.test/api/manifest", "application/vnd.apple.mpegurl", "hls"),
    ("http://a.test/v/manifest.mpd", None, "dash"),
    ("http://a.test/list.pls", None, "playlist"),
    ("http://a.test/cover.jpg", "image/jpeg", None),
    ("http://a.test/app.js", "application/javascript", None),
    ("http://a.test/clip.mp4", "video/mp4", None),
    ("http://a.test/api/play", "application/json", None),
])
def test_classify(url, ctype, kind):
    assert classify(url, ctype) == kind


def test_scope_and_address_rules():
    page = "http://music.example/song/1"
    assert request_allowed(page, "http://music.example/other", document=True)
    assert not request_allowed(page, "http://elsewhere.example/", document=True)     # never navigates away
    assert request_allowed(page, "https://cdn.example/a.mp3", document=False)        # media on a CDN is fine
    for private in ("http://127.0.0.1/a.mp3", "http://10.1.2.3/x", "http://[::1]/x", "http://169.254.169.254/"):
        assert not request_allowed(page, private, document=False), private
    assert not request_allowed(page, "file:///etc/passwd", document=False)
    # A page that is itself on a private address (an intranet crawl, the tests) may use its neighbours.
    assert request_allowed("http://127.0.0.1:8000/song", "http://127.0.0.1:8000/m/a.mp3", document=False)


def test_host_patterns():
    assert host_matches("music.example", ("music.example",))
    assert host_matches("a.music.example", ("*.music.example",)) and host_matches("music.example", ("*.music.example",))
    assert not host_matches("evilmusic.example", ("*.music.example",))


def test_segments_and_variants_of_a_recorded_manifest_are_not_items():
    rec = Recording("http://a.test/song", max_items=10, max_probes=2)
    rec.add("http://a.test/hls/master.m3u8", "hls", UA, None, "fetch")
    rec.add("http://a.test/hls/audio/index.m3u8", "hls", UA, None, "fetch")
    rec.add("http://a.test/hls/audio/seg0.aac", "audio", UA, None, "fetch")
    rec.add("http://a.test/real.mp3", "audio", UA, None, "media")
    rec.listed |= manifest_uris('#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\naudio/index.m3u8\n',
                                "http://a.test/hls/master.m3u8")
    rec.listed |= manifest_uris('#EXTM3U\n#EXT-X-KEY:METHOD=AES-128,URI="../k.bin"\n#EXTINF:4,\nseg0.aac\n',
                                "http://a.test/hls/audio/index.m3u8")
    assert [f.url for f in rec.results()] == ["http://a.test/hls/master.m3u8", "http://a.test/real.mp3"]
    for i in range(5):
        rec.add(f"http://a.test/unknown{i}", "probe", UA, None, "media")
    assert len(rec.probes()) == 2                   # bounded per page


def test_when_it_runs(tmp_path):
    r = BrowserResolver({"hosts": ["always.test"]})
    player = html_page("http://other.test/p", b"<html><body><audio id=x></audio><script src=a.js></script>")
    plain = html_page("http://other.test/q", b"<html><head><title>Player Site</title></head><body><p>Multiplayer"
                      b" games</p><div class='display-4'></div><script src=a.js></script>")
    found = Resolution(items=[AudioItem(url="http://other.test/a.mp3", page="http://other.test/p")])
    assert r.runs_after(player.url, player, Resolution())
    assert not r.runs_after(player.url, player, found)          # the static resolvers already found audio
    assert not r.runs_after(plain.url, plain, Resolution())     # no player: not worth a browser
    always = html_page("http://always.test/x", b"<p>nothing</p>")
    assert r.runs_after(always.url, always, found)              # listed host: every page
    assert not r.runs_after(always.url, html_page(always.url, b"{}", "application/json"), None)
    assert not r.runs_after(always.url, html_page(always.url, b"gone", status=404), None)
    off = BrowserResolver({"on_player_signs": False})
    assert not off.runs_after(player.url, player, Resolution())
    # In the worker's list it never claims a page; it follows whichever resolver did.
    resolvers = load_resolvers({"browser": {}, "generic": {}})
    assert pick(resolvers, player.url).name == "generic"
    assert [x.name for x in followers(resolvers, resolvers[-1], player.url, player, Resolution())] == ["browser"]


@pytest.mark.parametrize("section, message", [
    ({"max_pages": 0}, "browser.max_pages"),
    ({"page_timeout": "soon"}, "browser.page_timeout"),
    ({"executable": "/nonexistent/chromium"}, "browser.executable"),
    ({"player_signs": [" "]}, "browser.player_signs[0]"),
    ({"args": ["--user-data-dir=/tmp/x"]}, "browser.args[0]"),
    ({"headless": False}, "browser.headless: unknown key"),
])
def test_config_errors_name_the_key(section, message):
    with pytest.raises(ResolverConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BrowserResolver(section)


# -- real Chromium -----------------------------------------------------------------------------------------


@pytest.fixture
async def site():
    s = playersite.PlayerSite()
    async with playersite.serve(s) as base:
        s.base = base
        yield s


@pytest.fixture
async def ctx():
    transport = build_transport(max_connections=8, dns_ttl=60)
    http = build_client(transport, user_agent=UA, connect_timeout=5, read_timeout=10, max_redirects=3)
    yield ResolveContext(http=http, user_agent=UA), PageFetcher(transport, http)
    await http.aclose()


async def visit(resolver: BrowserResolver, ctx, url: str) -> Resolution:
    context, fetcher = ctx
    page, _ = await fetcher.fetch(url, max_bytes=1 << 20)
    return await resolver.resolve(url, page, context)


@pytest.fixture
async def make():
    made: list[BrowserResolver] = []

    def build(**settings) -> BrowserResolver:
        r = BrowserResolver({"args": list(TEST_ARGS), **settings})
        made.append(r)
        return r

    yield build
    for r in made:
        await r.aclose()


async def test_a_hung_page_ends_at_its_deadline_and_the_browser_goes_on(site, ctx, make):
    r = make(page_timeout=6)
    started = time.monotonic()
    await visit(r, ctx, site.base + "/hang")
    assert time.monotonic() - started < 6 + 40      # the deadline, a tab close, and a loaded machine
    assert r.stats["timeouts"] == 1
    got = await visit(r, ctx, site.base + "/song/1")
    assert [i.url for i in got.items] == [site.base + "/m/a7f3.mp3"]
    assert r.stats["restarts"] == 0


async def test_navigation_to_another_host_is_not_followed(site, ctx, make):
    r = make(page_timeout=20)
    await visit(r, ctx, site.base + "/escape")
    assert "/static/escape.js" in site.paths()
    assert not [e for e in site.log if e.host == "127.0.0.2"], site.log


async def test_a_crashed_browser_is_replaced_and_the_page_visited_again(site, ctx, make):
    r = make(page_timeout=8)
    await visit(r, ctx, site.base + "/song/1")
    first = r._browser
    assert first is not None
    # Kill it in the middle of a page: the visit starts again in a new browser.
    task = asyncio.create_task(visit(r, ctx, site.base + "/hang"))
    while site.paths().count("/static/hang.js") < 1:
        await asyncio.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    await task
    assert r.stats["restarts"] == 1 and site.paths().count("/static/hang.js") == 2
    assert r._browser is not None and r._browser.pid != first.pid and tree_pids(first.pid) == []
    got = await visit(r, ctx, site.base + "/song/1")
    assert [i.url for i in got.items] == [site.base + "/m/a7f3.mp3"]


async def test_a_browser_that_cannot_start_gives_the_task_back(site, ctx, make):
    r = make(executable="/bin/false", start_timeout=10)
    with pytest.raises(ResolverUnavailable):
        await visit(r, ctx, site.base + "/song/1")


async def test_tabs_are_bounded_and_browsers_recycled(site, ctx, make):
    r = make(max_pages=2, restart_after=3, page_timeout=30)
    pages = ["/song/1", "/song/2", "/song/3", "/song/1", "/song/2"]
    results = await asyncio.gather(*(visit(r, ctx, site.base + p) for p in pages))
    assert r.stats["peak_tabs"] == 2 and r.stats["pages"] == 5
    assert all(len(res.items) == 1 for res in results), results
    assert r.stats["restarts"] >= 1          # a fresh process after every 3 pages
    assert r._browser is not None and r._retired == []


async def test_a_hung_browser_is_killed_and_replaced(site, ctx, make):
    r = make(page_timeout=20, start_timeout=5)
    await visit(r, ctx, site.base + "/song/1")
    first = r._browser
    assert first is not None
    os.killpg(first.pid, signal.SIGSTOP)      # alive, connected, and answering nothing
    try:
        got = await visit(r, ctx, site.base + "/song/1")
    finally:
        if tree_pids(first.pid):
            os.killpg(first.pid, signal.SIGCONT)
    assert [i.url for i in got.items] == [site.base + "/m/a7f3.mp3"]
    assert r.stats["restarts"] == 1 and tree_pids(first.pid) == []


def test_the_worker_adds_a_later_resolvers_items_one_per_address():
    from crawler.worker.server import _merged

    page = "http://a.test/p"
    static = Resolution(items=[AudioItem(url="http://a.test/1.mp3", page=page, resolver="generic")],
                        links=["http://a.test/next"])
    browser = Resolution(items=[AudioItem(url="http://a.test/1.mp3", page=page, resolver="browser"),
                                AudioItem(url="http://a.test/2.mp3", page=page, resolver="browser")],
                         links=["http://a.test/more"])
    merged = _merged(static, browser)
    assert [(i.url, i.resolver) for i in merged.items] == [("http://a.test/1.mp3", "generic"),
                                                          ("http://a.test/2.mp3", "browser")]
    assert merged.links == ["http://a.test/next", "http://a.test/more"]
    assert _merged(None, browser) is browser and _merged(static, None) is static


_CHILD = r"""
import asyncio, sys
import uvloop
from playwright.async_api import async_playwright
from crawler.resolvers.chromium import ChromiumProcess, find_executable

async def main():
    pw = await async_playwright().start()
    browser = await ChromiumProcess.start(pw, find_executable(None), sys.argv[1:])
    print(browser.pid, browser.profile, flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""


async def test_no_browser_outlives_a_killed_worker(tmp_path):
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, *TEST_ARGS, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE,
                                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        pid_text, profile_text = line.decode().split()
        browser_pid, profile = int(pid_text), Path(profile_text)
        assert tree_pids(browser_pid)
    finally:
        proc.kill()
        await proc.wait()
    deadline = time.monotonic() + 30
    while tree_pids(browser_pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)     # the kernel's signal, then the browser's own exit: another process's events
    assert tree_pids(browser_pid) == []
    # Its profile directory is left behind; the next worker's first browser sweeps it away.
    assert profile.is_dir()
    live = tmp_path / f"{PROFILE_PREFIX}live"
    live.mkdir()
    (live / "SingletonLock").symlink_to(f"{socket.gethostname()}-{os.getpid()}")
    stale = tmp_path / f"{PROFILE_PREFIX}stale"
    stale.mkdir()
    (stale / "SingletonLock").symlink_to(f"{socket.gethostname()}-{browser_pid}")
    assert sweep_stale_profiles(tmp_path) == 1 and live.is_dir() and not stale.exists()
    assert sweep_stale_profiles(profile.parent) >= 1 and not profile.exists()


async def test_quiet_waits_for_requests_in_flight():
    traffic = Traffic()
    await asyncio.wait_for(traffic.quiet(0.05), 5)        # nothing happening: quiet at once, after the window
    traffic.started()
    waiting = asyncio.create_task(traffic.quiet(0.05))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()                              # a request in flight holds it for 2 s at least
    traffic.ended()
    await asyncio.wait_for(waiting, 1.5)                   # ended: quiet one window later, not 2 s later


async def test_quiet_after_an_action_waits_a_whole_window_from_the_action():
    """A click's requests reach us as events a little after the click: the quiet spell must count from the
    click, or a page that was quiet before it is judged quiet at once and its player's requests are missed."""
    loop = asyncio.get_running_loop()
    traffic = Traffic()
    await asyncio.sleep(0.1)                               # quiet for longer than the window before the click
    traffic.acted()
    began = loop.time()
    await asyncio.wait_for(traffic.quiet(0.05), 5)
    assert loop.time() - began >= 0.045
