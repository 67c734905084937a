"""A site's user agent and headers on every request kind a worker makes, against a loopback server that records
what it gets: page fetches, the client's requests (resolvers' API calls, playlists, segments), and the download
headers with a resolver's identity (which wins)."""

from pathlib import Path

import pytest
from aiohttp import web

from crawler.http.getter import Stack
from crawler.http.transport import build_client, build_transport
from crawler.items import AudioItem, RequestIdentity
from crawler.resolvers.base import ResolveContext
from crawler.sites import LOOKUPS_KEPT, parse_sites
from crawler.worker import siterules
from crawler.worker.fetcher import PageFetcher
from crawler.worker.siterules import SiteHeaders, SiteRules
from crawler.worker.transfer import identity_headers

UA = "worker-agent/1"


def rules(raw: dict) -> SiteRules:
    return SiteRules(parse_sites("sites", raw, Path(".")))


@pytest.fixture
async def two_sites():
    """Two loopback servers (two ports: two sites); each records the headers of every request."""
    seen: list[tuple[int, str, dict[str, str]]] = []
    runners, bases = [], []
    for _ in range(2):
        async def handle(request, runners=runners):
            seen.append((request.url.port, request.path, dict(request.headers)))
            if "to" in request.query:
                return web.Response(status=302, headers={"Location": request.query["to"]})
            return web.Response(text="<html>ok</html>", content_type="text/html")
        app = web.Application()
        app.router.add_get("/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        bases.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    transport = build_transport(max_connections=8, dns_ttl=60)
    client = build_client(transport, user_agent=UA, connect_timeout=5, read_timeout=5, max_redirects=3)
    yield bases, seen, Stack(transport, client)
    await client.aclose()
    for r in runners:
        await r.cleanup()


async def test_page_fetches_carry_the_sites_agent_and_headers_and_no_other_site_does(two_sites):
    (a, b), seen, stack = two_sites
    port_a = int(a.rsplit(":", 1)[1])
    fetcher = PageFetcher(stack)
    fetcher.sites = rules({f"127.0.0.1:{port_a}": {"user_agent": "site-a/2", "headers": {"X-Site": "A"}}})
    page, _ = await fetcher.fetch(a + "/p", max_bytes=1000, referrer=a + "/", validators=('"e"', None))
    await fetcher.fetch(b + "/p", max_bytes=1000, referrer=b + "/")
    (_, _, ha), (_, _, hb) = seen
    assert ha["User-Agent"] == "site-a/2" and ha["X-Site"] == "A"
    assert ha["Referer"] == a + "/" and ha["If-None-Match"] == '"e"'   # the request's own still go
    assert hb["User-Agent"] == UA and "X-Site" not in hb
    # What the archive records as sent is what went.
    sent = dict(page.sent)
    assert sent[b"User-Agent"] == b"site-a/2" and sent[b"X-Site"] == b"A" and sent[b"Referer"] == (a + "/").encode()
    assert list(sent).count(b"User-Agent") == 1


async def test_the_clients_requests_carry_them_unless_the_request_set_its_own(two_sites):
    (a, b), seen, stack = two_sites
    port_a = int(a.rsplit(":", 1)[1])
    r = rules({f"127.0.0.1:{port_a}": {"user_agent": "site-a/2", "headers": {"X-Site": "A", "Referer": "r"}}})
    siterules.install(stack.client, r)
    siterules.install(stack.client, r)       # again (a new Welcome): one hook, not two
    assert len(stack.client.event_hooks["request"]) == 1
    await stack.client.get(a + "/api")
    await stack.client.get(a + "/api2", headers={"User-Agent": "resolver/9", "Referer": "mine"})
    await stack.client.get(b + "/api")
    (_, _, h1), (_, _, h2), (_, _, h3) = seen
    assert h1["User-Agent"] == "site-a/2" and h1["X-Site"] == "A" and h1["Referer"] == "r"
    assert h2["User-Agent"] == "resolver/9" and h2["Referer"] == "mine" and h2["X-Site"] == "A"
    assert h3["User-Agent"] == UA and "X-Site" not in h3
    # A redirect from A to B takes none of A's along; one from B to A gets A's.
    seen.clear()
    r1 = await stack.client.get(a + "/go", params={"to": b + "/landing"})
    r2 = await stack.client.get(b + "/go", params={"to": a + "/landing"})
    assert r1.status_code == r2.status_code == 200
    (_, _, ga), (_, _, gb), (_, _, fb), (_, _, fa) = seen
    assert ga["User-Agent"] == "site-a/2" and ga["X-Site"] == "A"
    assert gb["User-Agent"] == UA and "X-Site" not in gb and "Referer" not in gb
    assert fb["User-Agent"] == UA and "X-Site" not in fb
    assert fa["User-Agent"] == "site-a/2" and fa["X-Site"] == "A"
    # A table with no headers takes the hook off.
    siterules.install(stack.client, rules({"127.0.0.1": {"max_depth": 3}}))
    assert stack.client.event_hooks["request"] == []


def item(identity: RequestIdentity | None) -> AudioItem:
    return AudioItem(url="http://cdn.example/a.mp3", page="http://a.example/", identity=identity)


def test_a_resolvers_identity_wins_over_the_sites_for_a_download():
    site = SiteHeaders("site-a/2", (("X-Site", "A"), ("Referer", "site")))
    signed = item(RequestIdentity(user_agent="kugou/1", headers=(("Referer", "resolver"),), cookies=(("k", "v"),)))
    assert identity_headers(signed, same_host=True, site=site) == {
        "X-Site": "A", "Referer": "resolver", "User-Agent": "kugou/1", "Cookie": "k=v"}
    # Across hosts only the identity's user agent goes, with the site's own headers for that host.
    assert identity_headers(signed, same_host=False, site=site) == {
        "X-Site": "A", "Referer": "site", "User-Agent": "kugou/1"}
    plain = item(None)
    assert identity_headers(plain, same_host=True, site=site) == {
        "X-Site": "A", "Referer": "site", "User-Agent": "site-a/2"}
    assert identity_headers(plain, same_host=True) == {}


def test_site_headers_over_a_base_list_replace_the_agent_once():
    base = [("User-Agent", UA), ("Accept-Encoding", "gzip")]
    assert SiteHeaders("s/1", (("X-K", "v"),)).over(base) == [
        ("Accept-Encoding", "gzip"), ("User-Agent", "s/1"), ("X-K", "v")]
    assert SiteHeaders(None, (("X-K", "v"),)).over(base) == [*base, ("X-K", "v")]


def test_lookup_is_cheap_and_bounded():
    empty = SiteRules()
    assert not empty and empty.of("a.example", 80) is None and empty.of_url("http://a.example/") is None
    r = rules({"a.example": {"user_agent": "s/1"}, "b.example": {"max_depth": 2}, "*.c.example": {"headers": {"X": "1"}}})
    assert r.of("A.example", 80) == SiteHeaders("s/1", ())
    assert r.of("b.example", 80) is None                      # a site that sets no headers costs nothing more
    assert r.of_url("https://x.c.example/") == SiteHeaders(None, (("X", "1"),))
    assert r.user_agent("http://a.example/x") == "s/1" and r.user_agent("http://b.example/") is None
    for i in range(LOOKUPS_KEPT + 10):
        r.of(f"h{i}.c.example", 80)
    assert len(r.table._answers) <= LOOKUPS_KEPT
    r.set_table(parse_sites("sites", {}, Path(".")))
    assert not r and r.of("a.example", 80) is None


def test_the_browsers_agent_per_site():
    r = rules({"a.example": {"user_agent": "s/1"}})
    ctx = ResolveContext(http=None, user_agent=UA, site_user_agent=r.user_agent)  # type: ignore[arg-type]
    assert ctx.user_agent_for("http://a.example/p") == "s/1"
    assert ctx.user_agent_for("http://b.example/p") == UA
    assert ResolveContext(http=None, user_agent=UA).user_agent_for("http://a.example/") == UA  # type: ignore[arg-type]
