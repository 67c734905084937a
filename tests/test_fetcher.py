"""The worker's page fetch against a hostile little server on loopback: caps, bombs, redirects, cookies."""

import gzip
import time
import zlib

import aiohttp
import pytest
from aiohttp import web

from crawler.http.getter import Stack
from crawler.http.transport import build_client, build_transport
from crawler.worker.fetcher import SNIFF_BYTES, FetchError, PageFetcher
from tests.test_http1 import answer
from tests.test_transport import RawServer, read_request


class Http:
    """An httpx client over the worker's transport, and the page fetcher on the same transport."""

    def __init__(self, **kw) -> None:
        transport = build_transport(max_connections=kw.pop("max_connections"), dns_ttl=kw.pop("dns_ttl"),
                                    resolver=kw.pop("resolver", None))
        self.client = build_client(transport, connect_timeout=5, read_timeout=5, max_redirects=3, **kw)
        self.pages = PageFetcher(Stack(transport, self.client))

    async def aclose(self) -> None:
        await self.client.aclose()


async def fetch_page(http: Http, url: str, **kw):
    return await http.pages.fetch(url, **kw)


@pytest.fixture
async def hostile():
    big = b"<html><body>" + b"<p>x</p>" * 200_000 + b"</body></html>"     # about 1.6 MB
    bomb = gzip.compress(b"<html>" + b" " * (64 * 1024 * 1024))              # 64 MiB in about 64 KiB
    deflated = zlib.compress(b"<html>" + b"a" * (32 * 1024 * 1024))

    async def page(request):
        return web.Response(body=big, content_type="text/html")

    async def gz(request):
        return web.Response(body=bomb, headers={"Content-Type": "text/html", "Content-Encoding": "gzip"})

    async def deflate(request):
        return web.Response(body=deflated, headers={"Content-Type": "text/html", "Content-Encoding": "deflate"})

    async def audio(request):
        return web.Response(body=b"ID3" + b"\0" * (5 * 1024 * 1024), content_type="audio/mpeg")

    async def moved(request):
        return web.Response(status=301, headers={"Location": "/page"})

    async def cookie(request):
        resp = web.Response(text="<html>hi</html>", content_type="text/html")
        resp.set_cookie("tracker", "1" * 100)
        return resp

    app = web.Application()
    for path, h in (("/page", page), ("/gz", gz), ("/deflate", deflate), ("/audio", audio), ("/moved", moved),
                    ("/cookie", cookie)):
        app.router.add_get(path, h)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = Http(user_agent="test-agent", max_connections=8, dns_ttl=60)
    yield f"http://127.0.0.1:{port}", client
    await client.aclose()
    await runner.cleanup()


async def test_body_cap_cuts_a_large_page(hostile):
    base, client = hostile
    page, truncated = await fetch_page(client, base + "/page", max_bytes=100_000)
    assert truncated and len(page.body) == 100_000 and page.status == 200


@pytest.mark.parametrize("path", ["/gz", "/deflate"])
async def test_decompression_bomb_stops_at_the_cap(hostile, path):
    base, client = hostile
    page, truncated = await fetch_page(client, base + path, max_bytes=1_000_000)
    assert truncated and len(page.body) == 1_000_000


async def test_non_documents_are_only_sniffed(hostile):
    base, client = hostile
    page, truncated = await fetch_page(client, base + "/audio", max_bytes=10_000_000)
    assert page.content_type == "audio/mpeg" and len(page.body) == SNIFF_BYTES and not truncated
    assert page.body.startswith(b"ID3")


async def test_page_redirects_are_reported_not_followed(hostile):
    base, client = hostile
    page, _ = await fetch_page(client, base + "/moved#frag", max_bytes=1000)
    assert page.status == 301 and page.headers["location"] == "/page"
    assert page.url == base + "/moved#frag" and page.final_url == base + "/moved"


async def test_no_cookie_jar_grows(hostile):
    base, client = hostile
    await fetch_page(client, base + "/cookie", max_bytes=1000)
    r = await client.client.get(base + "/cookie")   # resolvers' path: the client, which keeps no jar either
    assert r.headers["set-cookie"].startswith("tracker=") and len(client.client.cookies.jar) == 0


async def test_unreachable_is_transient_and_bad_scheme_is_not(hostile):
    _, client = hostile
    with pytest.raises(FetchError) as e:
        await fetch_page(client, "http://127.0.0.1:1/", max_bytes=1000)
    assert e.value.transient
    with pytest.raises(FetchError) as e:
        await fetch_page(client, "ftp://127.0.0.1/x", max_bytes=1000)
    assert not e.value.transient


class CountingResolver(aiohttp.ThreadedResolver):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def resolve(self, host, port=0, family=0):
        self.calls += 1
        return await super().resolve(host, port, family)


async def test_host_names_are_resolved_once_per_ttl():
    async def closing(request):
        return web.Response(text="<html></html>", content_type="text/html", headers={"Connection": "close"})

    app = web.Application()
    app.router.add_get("/", closing)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    resolver = CountingResolver()
    client = Http(user_agent="t", max_connections=4, dns_ttl=300, resolver=resolver)
    try:
        for _ in range(3):     # a new connection each time: the server closes them
            page, _ = await fetch_page(client, f"http://localhost:{port}/", max_bytes=1000)
            assert page.status == 200
    finally:
        await client.aclose()
        await runner.cleanup()
    assert resolver.calls == 1


def pages(answers: dict[str, bytes]):
    """A RawServer handler answering each request on a kept-alive connection with the bytes for its path."""
    async def serve(server, reader, writer):
        while True:
            head = await read_request(server, reader)
            writer.write(answers[head.split(b" ", 2)[1].decode()])
            await writer.drain()
    return serve


def html(body: bytes, *headers: bytes) -> bytes:
    return answer(body, b"Content-Type: text/html", *headers)


async def test_page_fetches_share_keep_alive_connections_and_send_the_clients_headers():
    client = Http(user_agent="keep-agent", max_connections=4, dns_ttl=60)
    try:
        async with RawServer(pages({f"/p{i}": html(b"<html>%d</html>" % i) for i in range(5)})) as site:
            base = site.url
            for i in range(5):
                page, truncated = await fetch_page(client, f"{base}/p{i}", max_bytes=1000,
                                                   referrer=f"{base}/", validators=('"e1"', None))
                assert page.body == b"<html>%d</html>" % i and not truncated
    finally:
        await client.aclose()
    assert site.connections == 1
    head = site.requests[0].decode()
    assert head.startswith("GET /p0 HTTP/1.1\r\n")
    for line in ("User-Agent: keep-agent", f"Referer: {base}/", 'If-None-Match: "e1"'):    # names as written
        assert line in head.split("\r\n")
    assert "If-Modified-Since" not in head


async def test_a_cut_page_does_not_leave_its_connection_in_the_pool():
    client = Http(user_agent="t", max_connections=4, dns_ttl=60)
    try:
        async with RawServer(pages({"/big": html(b"<html>" + b"x" * 8_000_000), "/small": html(b"<html>ok")})) as site:
            base = site.url
            page, truncated = await fetch_page(client, f"{base}/big", max_bytes=1000)
            assert truncated and len(page.body) == 1000
            page, truncated = await fetch_page(client, f"{base}/small", max_bytes=1000)
            assert page.body == b"<html>ok" and not truncated
    finally:
        await client.aclose()
    assert site.connections == 2      # the rest of the big page was never read: its connection was closed


async def test_repeated_headers_are_joined_and_utf8_values_decoded_as_httpx_does():
    answers = {"/h": html(b"<html>", b"Link: <a>", b"link: <b>", "X-Name: Beyonc\u00e9".encode()),
               "/l": html(b"<html>", b"X-Name: caf\xe9")}
    client = Http(user_agent="t", max_connections=4, dns_ttl=60)
    try:
        async with RawServer(pages(answers)) as site:
            base = site.url
            page, _ = await fetch_page(client, f"{base}/h", max_bytes=1000)
            assert page.headers["link"] == "<a>, <b>" and page.headers["x-name"] == "Beyonc\u00e9"
            assert (b"link", b"<b>") in page.raw_headers
            page, _ = await fetch_page(client, f"{base}/l", max_bytes=1000)
            assert page.headers["x-name"] == "caf\u00e9"       # not UTF-8: Latin-1
    finally:
        await client.aclose()


async def test_a_page_says_what_was_sent_and_when_for_the_archive(hostile):
    client = Http(user_agent="sent-agent", max_connections=4, dns_ttl=60)
    try:
        async with RawServer(pages({"/p": html(b"<html>ok")})) as site:
            before = time.time()
            page, _ = await fetch_page(client, f"{site.url}/p#frag", max_bytes=1000, referrer="http://r.test/",
                                       validators=('"e1"', "Sat, 01 Jan 2026 00:00:00 GMT"))
    finally:
        await client.aclose()
    lines = [line for line in site.requests[0].split(b"\r\n")[1:] if line]
    assert [b"%s: %s" % pair for pair in page.sent] == lines        # Host first, every header as sent
    assert before <= page.started <= time.time() and not page.cut
    base, hostile_client = hostile
    audio, _ = await fetch_page(hostile_client, base + "/audio", max_bytes=10_000_000)
    assert audio.cut      # only its start was read: the archive says the record is cut
    big, _ = await fetch_page(hostile_client, base + "/page", max_bytes=100_000)
    assert big.cut
