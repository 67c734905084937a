"""The browser resolver: its decisions (pure), its config, and real Chromium against the player site on loopback:
deadlines, crashes, recycling, the tab bound, and navigation that must not leave the page's host."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import pwd
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from crawler.http.getter import Stack
from crawler.http.targets import TargetPolicy
from crawler.http.transport import build_client, build_transport
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
from crawler.resolvers.browserproxy import BrowserProxy, HostRules, close_response_head, parse_target
from crawler.resolvers.chromium import (
    LOOPBACK_ONLY_ARGS,
    PROFILE_PREFIX,
    BrowserStartError,
    ChromiumProcess,
    sweep_stale_profiles,
    tree_pids,
)
from crawler.resolvers.registry import followers, load_resolvers, pick
from crawler.web.page import FetchedPage
from crawler.worker.fetcher import PageFetcher
from testkit.browser import TEST_BROWSER_USER
from testkit import playersite

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


def test_a_manifest_line_that_is_no_address_loses_only_itself():
    listed = manifest_uris("#EXTM3U\n#EXTINF:4,\nhttp://[bad/seg0.aac\n#EXTINF:4,\nseg1\\x.aac\n",
                           "http://a.test/hls/index.m3u8")
    assert listed == {"http://a.test/hls/seg1/x.aac"}


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
async def ctx(site):
    # The crawl's addresses as a worker learns them from its master: the site's (a seed on 127.0.0.1).
    targets = TargetPolicy.for_crawl([site.base + "/"], [])
    transport = build_transport(max_connections=8, dns_ttl=60)
    http = build_client(transport, user_agent=UA, connect_timeout=5, read_timeout=10, max_redirects=3)
    stack = Stack(transport, http)
    yield ResolveContext(http=stack, user_agent=UA, targets=targets), PageFetcher(stack)
    await http.aclose()


async def visit(resolver: BrowserResolver, ctx, url: str) -> Resolution:
    context, fetcher = ctx
    page, _ = await fetcher.fetch(url, max_bytes=1 << 20)
    return await resolver.resolve(url, page, context)


@pytest.fixture
async def make():
    made: list[BrowserResolver] = []

    def build(**settings) -> BrowserResolver:
        r = BrowserResolver({"args": list(TEST_ARGS), "user": TEST_BROWSER_USER, **settings})
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


async def test_a_crashed_browser_is_replaced_and_the_page_visited_again(site, ctx, make, until):
    r = make(page_timeout=8)
    await visit(r, ctx, site.base + "/song/1")
    first = r._browser
    assert first is not None
    # Kill it in the middle of a page: the visit starts again in a new browser.
    task = asyncio.create_task(visit(r, ctx, site.base + "/hang"))
    await until(lambda: "/static/hang.js" in site.paths(), 30, "the browser to be in the page")
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
from crawler.resolvers.chromium import BrowserUser, ChromiumProcess, find_executable

async def main():
    pw = await async_playwright().start()
    browser = await ChromiumProcess.start(pw, find_executable(None), sys.argv[2:], user=BrowserUser.lookup(sys.argv[1]))
    print(browser.pid, browser.profile, flush=True)
    await asyncio.Event().wait()

uvloop.run(main())
"""


async def test_no_browser_outlives_a_killed_worker(tmp_path, until):
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, TEST_BROWSER_USER, *TEST_ARGS, cwd=REPO,
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
    # The kernel's signal, then the browser's own exit: another process's events, seen by polling.
    await until(lambda: not tree_pids(browser_pid), 30, "the browser's processes to exit")
    # Its profile directory is left behind; the next worker's first browser sweeps it away.
    assert profile.is_dir()
    live = tmp_path / f"{PROFILE_PREFIX}live"
    (live / "profile").mkdir(parents=True)
    (live / "profile" / "SingletonLock").symlink_to(f"{socket.gethostname()}-{os.getpid()}")
    stale = tmp_path / f"{PROFILE_PREFIX}stale"
    (stale / "profile").mkdir(parents=True)
    (stale / "profile" / "SingletonLock").symlink_to(f"{socket.gethostname()}-{browser_pid}")
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
    now = [0.0]                                            # the test's clock: times in binary fractions, exact
    traffic = Traffic(clock=lambda: now[0])
    now[0] += 0.125                                        # quiet for longer than the window before the click
    traffic.acted()
    waiting = asyncio.create_task(traffic.quiet(0.0625))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()                              # the window counts from the click
    now[0] += 0.0625
    await asyncio.wait_for(waiting, 5)                     # a whole window after the click: quiet


# -- confinement: the browser's user and sandbox, its connections, its memory -------------------------------


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        return fh.read().decode(errors="replace").split("\0")


async def test_the_browser_runs_sandboxed_as_an_unprivileged_user(site, ctx, make, until):
    r = make(page_timeout=3)
    task = asyncio.create_task(visit(r, ctx, site.base + "/hang"))     # a page open while we look
    await until(lambda: "/static/hang.js" in site.paths(), 30, "the browser to be in the page")
    browser = r._browser
    assert browser is not None
    uid = pwd.getpwnam(TEST_BROWSER_USER).pw_uid
    assert uid != 0
    pids = tree_pids(browser.pid)
    renderers = [p for p in pids if "--type=renderer" in " ".join(_cmdline(p))]
    assert renderers, [_cmdline(p)[:2] for p in pids]
    for pid in pids:
        status = _status(pid)
        assert set(map(int, status["Uid"].split())) == {uid}, (pid, status["Uid"])
        if os.readlink(f"/proc/{pid}/ns/user") == os.readlink("/proc/self/ns/user"):
            # No capability in the worker's user namespace (the sandbox's own namespaces have theirs, for it).
            assert {int(status[c], 16) for c in ("CapPrm", "CapEff", "CapAmb")} == {0}, (pid, status)
        assert not {"--no-sandbox", "--disable-setuid-sandbox"} & set(" ".join(_cmdline(pid)).split()), pid
    for pid in renderers:
        # Chromium's own sandbox on top: a seccomp-BPF filter and namespaces of their own (user, pid, network).
        assert _status(pid)["Seccomp"] == "2", pid
        for ns in ("user", "pid", "net"):
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/{browser.pid}/ns/{ns}"), ns
    await task
    # Its profile is the browser user's alone; the worker's environment does not reach it.
    profile = browser.profile / "profile"
    assert profile.stat().st_uid == uid and profile.stat().st_mode & 0o077 == 0
    with open(f"/proc/{browser.pid}/environ", "rb") as fh:
        environ = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
    assert environ[b"HOME"] == str(profile).encode() and b"PYTEST_CURRENT_TEST" not in environ


def test_the_browser_never_runs_as_root_nor_without_its_sandbox():
    with pytest.raises(ResolverConfigError, match=r"browser\.user: .*never runs as root"):
        BrowserResolver({"user": "root"})
    with pytest.raises(ResolverConfigError, match=r"browser\.user: no user 'no-such-browser-user'"):
        BrowserResolver({"user": "no-such-browser-user"})
    for switch in ("--no-sandbox", "--proxy-server=http://127.0.0.1:1", "--js-flags=--max-old-space-size=9999"):
        with pytest.raises(ResolverConfigError, match=r"browser\.args\[0\]"):
            BrowserResolver({"args": [switch]})


async def test_a_root_worker_does_not_start_the_browser_as_itself():
    if os.geteuid() != 0:
        pytest.skip("only a worker running as root can be refused for it")   # the check is for root alone
    with pytest.raises(BrowserStartError, match="will not run as root"):
        await ChromiumProcess.start(None, "/bin/true", [], user=None)


@pytest.fixture
async def internal():
    async with playersite.serve_internal() as served:
        yield served


REACH_ARGS = playersite.REACH_ARGS


async def test_a_page_reaches_no_refused_address_by_name_or_websocket(site, ctx, make, internal):
    """The page is on a crawl address (127.0.0.1:its port, a seed); its script opens a WebSocket and POSTs to
    internal.test, a name that resolves to loopback, and to 127.0.0.1 on another port: none of it may leave."""
    port, hits = internal
    r = make(args=REACH_ARGS, settle=1.0)
    await visit(r, ctx, f"{site.base}/reach?port={port}")
    assert "/static/reached" in site.paths()          # the script ran to its end: every attempt was made
    assert hits == []
    assert r._proxy is not None and r._proxy.stats["refused"] >= 4

    # The same page in a crawl that names loopback (crawl.allowed_networks): the same requests go through, so
    # the refusal above is the target policy's, applied to names and WebSockets alike.
    context, fetcher = ctx
    context.targets.allow([], [ipaddress.ip_network("127.0.0.0/8")])
    await visit(r, ctx, f"{site.base}/reach?port={port}")
    assert f"GET internal.test:{port} /ws" in hits and f"POST internal.test:{port} /secret" in hits, hits
    assert "ws:hello" in hits and f"POST 127.0.0.1:{port} /secret" in hits, hits


@pytest.mark.parametrize("hog", ["/hog/buffers", "/hog/heap"])
async def test_a_page_over_the_memory_bound_is_ended_and_the_browser_replaced(site, ctx, make, hog):
    r = make(max_memory_bytes=512 << 20, page_timeout=40)
    await visit(r, ctx, site.base + "/song/1")
    first = r._browser
    assert first is not None
    started = time.monotonic()
    await visit(r, ctx, site.base + hog)
    assert time.monotonic() - started < 30           # ended by the bound, not by the page's deadline
    assert r.stats["memory_kills"] + r.stats["crashes"] >= 1 and r.stats["timeouts"] == 0, r.stats
    got = await visit(r, ctx, site.base + "/song/1")
    assert [i.url for i in got.items] == [site.base + "/m/a7f3.mp3"]
    assert r._browser is not None and r._browser.pid != first.pid and tree_pids(first.pid) == []


# -- the browser's proxy, without a browser ------------------------------------------------------------------


def test_host_rules_read_like_chromiums():
    rules = HostRules.from_args(["--other", REACH_ARGS[0]])
    assert rules.lookup("internal.test") == "127.0.0.1"
    assert rules.lookup("INTERNAL.test") == "127.0.0.1"
    assert rules.lookup("example.org") is None                  # MAP * ~NOTFOUND
    assert rules.lookup("127.0.0.1") == "127.0.0.1"             # EXCLUDE
    assert HostRules.from_args([]).lookup("example.org") == "example.org"
    with pytest.raises(ValueError, match="host rule"):
        HostRules.from_args(["--host-resolver-rules=REWRITE a b c d"])


def test_proxy_requests_are_read_as_a_tunnel_or_rewritten_to_origin_form():
    assert parse_target(b"CONNECT Internal.Test:443 HTTP/1.1\r\nHost: x\r\n\r\n") == (
        "CONNECT", "internal.test", 443, None)
    assert parse_target(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n")[1:3] == ("::1", 8080)
    method, host, port, head = parse_target(
        b"POST http://a.example:81/x?y=1 HTTP/1.1\r\nHost: a.example:81\r\nProxy-Connection: keep-alive\r\n"
        b"Connection: keep-alive\r\nContent-Length: 1\r\n\r\n")
    assert (method, host, port) == ("POST", "a.example", 81)
    assert head == (b"POST /x?y=1 HTTP/1.1\r\nHost: a.example:81\r\nContent-Length: 1\r\nConnection: close\r\n\r\n")
    for bad in (b"GET /relative HTTP/1.1\r\n\r\n", b"GET ftp://a/ HTTP/1.1\r\n\r\n", b"CONNECT a:0 HTTP/1.1\r\n\r\n",
                b"CONNECT a HTTP/1.1\r\n\r\n", b"GET http://a/ SPDY\r\n\r\n"):
        with pytest.raises(ValueError):
            parse_target(bad)
    assert close_response_head(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\nX: 1\r\n\r\n") == (
        b"HTTP/1.1 200 OK\r\nX: 1\r\nConnection: close\r\n\r\n")


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_the_proxy_connects_only_where_the_policy_allows(internal):
    port, hits = internal
    policy = TargetPolicy()                      # the public internet only
    proxy = BrowserProxy(lambda: policy, HostRules.from_args(REACH_ARGS))
    await proxy.start()
    try:
        for request in (f"CONNECT internal.test:{port} HTTP/1.1\r\n\r\n",
                        f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n",
                        f"GET http://internal.test:{port}/x HTTP/1.1\r\nHost: internal.test\r\n\r\n",
                        f"GET http://elsewhere.example:{port}/x HTTP/1.1\r\n\r\n"):      # resolves to nothing
            assert (await _ask(proxy.port, request.encode())).startswith(b"HTTP/1.1 403 "), request
        assert hits == [] and proxy.stats["refused"] == 4
        assert (await _ask(proxy.port, b"GET x" + b"x" * 20000)).startswith(b"HTTP/1.1 400 ")   # head too long
        policy.allow([], [ipaddress.ip_network("127.0.0.0/8")])
        answer = await _ask(proxy.port, f"GET http://internal.test:{port}/x HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in answer and answer.endswith(b"internal")
        assert hits == ["GET a /x"]
    finally:
        await proxy.aclose()
