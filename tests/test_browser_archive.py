"""The browser resolver's view as evidence: a real headless Chromium against the player site on loopback records
the exchanges it made (the signed API call whose answer held the audio address among them), the media request it
was refused, the rendered DOM, a screenshot and a summary of the visit, all tied to the page; a worker that keeps
no archive pays nothing for it. The bounds' decisions are checked without a browser."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from crawler.archive import NO_ARCHIVE, Exchange
from crawler.http.getter import Stack
from crawler.http.targets import TargetPolicy
from crawler.http.transport import build_client, build_transport
from crawler.resolvers import browser as browser_module
from crawler.resolvers.base import ResolveContext, ResolverConfigError
from crawler.resolvers.browser import BrowserResolver
from crawler.resolvers.browsercapture import (
    DOM_TARGET,
    Capture,
    VIEW_TARGET,
    body_allowance,
    declared_length,
    kept_body,
    visit_fields,
)
from crawler.resolvers.browserproxy import BrowserProxy, HostRules
from crawler.resolvers.chromium import LOOPBACK_ONLY_ARGS
from crawler.worker.fetcher import PageFetcher
from testkit import playersite
from testkit.browser import TEST_BROWSER_USER
from tests.fakes.archive import Collected

pytestmark = pytest.mark.timeout(180)

UA = "SiteTestBrowser/1.0"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# -- decisions ---------------------------------------------------------------------------------------------


def test_a_body_is_read_only_within_its_bounds():
    assert body_allowance(100, left=1000, per_response=500) == 100
    assert body_allowance(None, left=1000, per_response=500) == 500         # unknown size: read, then cut
    assert body_allowance(None, left=300, per_response=500) == 300          # what is left of the page's bound
    assert body_allowance(600, left=1000, per_response=500) is None         # declared too big: never read
    assert body_allowance(10, left=0, per_response=500) is None             # the page's bound is spent
    assert body_allowance(0, left=0, per_response=500) == 0                 # an empty body costs nothing
    assert kept_body(b"abcdef", 4) == (b"abcd", "length") and kept_body(b"abc", 4) == (b"abc", "")
    assert declared_length(((b"Content-Length", b" 42 "),)) == 42
    assert declared_length(((b"content-length", b"-1"),)) is None and declared_length(()) is None


def test_the_visit_record_is_one_line_a_field():
    fields = visit_fields(browser_version="131.0", user_agent="UA", started=0.5, ended=1.25, outcome="complete",
                          found=[("audio", "http://a.test/x.mp3"), ("hls", "http://a.test/i.m3u8")],
                          kept={"dom": "whole", "note": "two\r\nlines"})
    assert ("visit-started", "1970-01-01T00:00:00.500000Z") in fields
    assert [v for n, v in fields if n == "found"] == ["audio http://a.test/x.mp3", "hls http://a.test/i.m3u8"]
    assert ("note", "two lines") in fields


def test_archive_bounds_are_checked():
    with pytest.raises(ResolverConfigError, match=r"browser\.archive_max_bytes"):
        BrowserResolver({"archive_max_bytes": -1})


# -- real Chromium -----------------------------------------------------------------------------------------


@pytest.fixture
async def site():
    s = playersite.PlayerSite()
    async with playersite.serve(s) as base:
        s.base = base
        yield s


@pytest.fixture
async def stack(site):
    transport = build_transport(max_connections=8, dns_ttl=60)
    http = build_client(transport, user_agent=UA, connect_timeout=5, read_timeout=10, max_redirects=3)
    yield Stack(transport, http)
    await http.aclose()


async def visit(r: BrowserResolver, site, stack, path: str, archive):
    page, _ = await PageFetcher(stack).fetch(site.base + path, max_bytes=1 << 20)
    ctx = ResolveContext(http=stack, user_agent=UA, targets=TargetPolicy.for_crawl([site.base + "/"], []),
                         archive=archive)
    return page.final_url, await r.resolve(site.base + path, page, ctx)


class Broken(Collected):
    """An archive whose disk fails on every call."""

    def exchange(self, ex):
        raise OSError("disk full")

    def metadata(self, *args, **kwargs):
        raise OSError("disk full")

    def resource(self, *args, **kwargs):
        raise OSError("disk full")


class FakeRequest:
    """What a Capture reads of a Playwright request, for the decisions a browser seldom shows."""

    method, resource_type, post_data_buffer, failure = "POST", "fetch", b"x", None
    timing = {"startTime": 1_700_000_000_000.0}

    def __init__(self, url: str) -> None:
        self.url = url
        self.headers = {"user-agent": UA}

    async def headers_array(self):
        return [{"name": "User-Agent", "value": UA}]

    async def sizes(self):
        return {"responseBodySize": 5}


class FakeResponse:
    def __init__(self, request: FakeRequest, status: int, headers: dict[str, str], body: bytes) -> None:
        self.request, self.url, self.status, self.headers, self._body = request, request.url, status, headers, body

    async def headers_array(self):
        return [{"name": k, "value": v} for k, v in self.headers.items()]

    async def body(self):
        return self._body


async def test_the_proxys_own_answers_are_not_a_sites():
    archive = Collected()
    capture = Capture(archive, "http://a.test/p", max_bytes=100, max_body_bytes=100, screenshot=False,
                      clock=lambda: 1.0, proxy_mark="m1")
    capture.on_response(FakeResponse(FakeRequest("http://b.test/x"), 403, {"x-crawler-proxy": "m1"}, b""))
    # A site that sends the header without the proxy's mark is recorded like any site.
    capture.on_response(FakeResponse(FakeRequest("http://b.test/y"), 403, {"x-crawler-proxy": "guess"}, b"no"))
    await capture.settle(5)
    (forged,) = archive.exchanges
    assert forged.url == "http://b.test/y" and forged.body == b"no" and forged.started == 1_700_000_000.0
    ((target, fields, *_),) = archive.metadatas
    assert target == "http://b.test/x" and dict(fields)["fetched"].startswith("no: the worker's proxy answered 403")


async def test_the_proxy_marks_its_own_answers():
    policy = TargetPolicy()                      # the public internet only
    proxy = BrowserProxy(lambda: policy, HostRules.from_args(list(LOOPBACK_ONLY_ARGS)))
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET http://127.0.0.1:9/x HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(65536), 10)
        writer.close()
    finally:
        await proxy.aclose()
    assert answer.startswith(b"HTTP/1.1 403 ") and f"X-Crawler-Proxy: {proxy.mark}\r\n".encode() in answer


class EndlessResponse(FakeResponse):
    async def body(self):
        await asyncio.Event().wait()      # a long poll: its body never ends


async def test_a_body_unread_when_the_visit_ends_is_kept_without_it():
    archive = Collected()
    capture = Capture(archive, "http://a.test/p", max_bytes=100, max_body_bytes=100, screenshot=False,
                      clock=lambda: 1.0)
    capture.on_response(EndlessResponse(FakeRequest("http://a.test/poll"), 200, {"content-length": "4"}, b""))
    await capture.settle(0.05)
    await capture.stop()
    (ex,) = archive.exchanges
    assert ex.url == "http://a.test/poll" and ex.body == b"" and ex.truncated == "time" and ex.request_body == b"x"
    assert capture.left == 100                 # what it had reserved is given back


class NoResources(Collected):
    def resource(self, *args, **kwargs):
        raise OSError("disk full")


def test_a_record_that_cannot_be_written_loses_only_itself():
    archive = NoResources()
    capture = Capture(archive, "http://a.test/p", max_bytes=100, max_body_bytes=100, screenshot=True,
                      clock=lambda: 2.0)
    capture.png = PNG_SIGNATURE
    capture.finish(dom=b"<html></html>", dom_cut=False, found=[("audio", "http://a.test/a.mp3")], started=1.0,
                   outcome="complete", browser_version="1", user_agent=UA)
    ((target, fields, refers_to, page, role),) = archive.metadatas
    values = dict(fields)
    assert target == page == "http://a.test/p" and role == "browser" and refers_to == ""
    assert values["dom"] == values["screenshot"] == "not kept" and values["failed"] == "2"


def by_url(exchanges: list[Exchange], part: str) -> list[Exchange]:
    return [e for e in exchanges if part in e.url]


@pytest.fixture
async def internal():
    async with playersite.serve_internal() as served:
        yield served


async def test_a_visit_keeps_the_browsers_view_and_none_without_an_archive(site, stack, internal, monkeypatch):
    # One browser for the module's visits: starting one is the slow part.
    r = BrowserResolver({"args": list(LOOPBACK_ONLY_ARGS), "user": TEST_BROWSER_USER, "page_timeout": 30})
    try:
        archive = Collected()
        before = time.time()
        page_url, got = await visit(r, site, stack, "/song/2", archive)
        token = next(iter(site.sessions.values()))
        assert [i.url for i in got.items] == [f"{site.base}/stream/{token}"]

        assert archive.exchanges and all(e.role == "browser" and e.page == page_url for e in archive.exchanges)
        # The signed API call that produced the address: the request as sent, the answer with its cookie and body.
        (api,) = by_url(archive.exchanges, "/api/play?")
        assert api.method == "GET" and api.status == 200 and not api.truncated
        assert json.loads(api.body) == {"url": f"/stream/{token}"}
        assert any(name.lower() == b"set-cookie" and b"play_session=" in value for name, value in api.response_headers)
        assert any(name.lower() == b"referer" for name, _ in api.request_headers)
        assert before - 1 <= api.started <= time.time()
        # The document as the browser got it, and the script that made the call.
        (document,) = [e for e in archive.exchanges if e.url == page_url]
        assert document.status == 200 and b'class="play-button"' in document.body
        assert b"fnv(" in by_url(archive.exchanges, "/static/song2.js")[0].body
        # The media request it was refused: the request is kept, with word that it went unanswered.
        assert not by_url(archive.exchanges, "/stream/")
        refused = [m for m in archive.metadatas if "/stream/" in m[0]]
        assert len(refused) == 1 and ("fetched", "no: its bytes are left to the downloader") in refused[0][1]
        assert refused[0][3] == page_url and refused[0][2] == "<urn:uuid:exchange-1>"    # the document's record

        # The rendered DOM (the player's state after the click), then the screenshot, tied to it.
        dom, shot = archive.resources
        assert dom[:2] == (DOM_TARGET + page_url, "text/html; charset=utf-8")
        assert b"Signed Song" in dom[2] and f"/stream/{token}".encode() in dom[2]     # the src the script set
        assert dom[3] == "<urn:uuid:exchange-1>" and dom[4] == page_url and dom[5] == "browser"
        assert shot[:2] == (VIEW_TARGET + page_url, "image/png") and shot[2].startswith(PNG_SIGNATURE)
        assert shot[3] == "<urn:uuid:resource-1>" and shot[4] == page_url
        # The visit's summary: what it found, with what, when, and how it ended.
        target, fields, refers_to, page, role = archive.metadatas[-1]
        assert (target, refers_to, page, role) == (page_url, "<urn:uuid:resource-1>", page_url, "browser")
        values = dict(fields)
        assert ("found", f"audio {site.base}/stream/{token}") in fields
        assert values["outcome"] == "complete" and values["user-agent"] == UA and values["browser"]
        assert values["visit-started"] <= values["visit-ended"] and values["screenshot"] == "viewport"
        assert int(values["exchanges"]) == len(archive.exchanges) and values["not-fetched"] == "1"

        # An HLS player: the manifests and the key as read, the segment it was not let fetch as a request only.
        hls_url, streamed = await visit(r, site, stack, "/song/3", archive := Collected())
        assert [i.url for i in streamed.items] == [site.base + "/hls/s3/index.m3u8"]
        for name in ("/hls/s3/index.m3u8", "/hls/s3/audio/index.m3u8"):
            (manifest,) = by_url(archive.exchanges, name)
            assert manifest.body.startswith(b"#EXTM3U") and manifest.page == hls_url
        assert by_url(archive.exchanges, "/hls/s3/key.bin")[0].body == playersite.HLS_KEY
        assert [m[0] for m in archive.metadatas[:-1]] == [site.base + "/hls/s3/audio/seg0.aac"]
        assert ("found", f"hls {site.base}/hls/s3/index.m3u8") in archive.metadatas[-1][1]

        # What the worker's proxy refused is no site's answer: kept as requests that went unanswered.
        port, hits = internal
        reach_url, _ = await visit(r, site, stack, f"/reach?port={port}", archive := Collected())
        assert hits == [] and "/static/reached" in site.paths()
        assert not by_url(archive.exchanges, "/secret") and by_url(archive.exchanges, "/static/reached")
        refused = {m[0]: dict(m[1]) for m in archive.metadatas if m[0].endswith("/secret")}
        assert set(refused) == {f"http://internal.test:{port}/secret", f"http://127.0.0.1:{port}/secret"}
        # (Chromium ends these no-cors requests on the proxy's 403 without a response of its own.)
        assert all(f["fetched"].startswith("no: ") and f["method"] == "POST" for f in refused.values()), refused

        # An archive that fails: the page is resolved all the same.
        _, despite = await visit(r, site, stack, "/song/1", Broken())
        assert [i.url for i in despite.items] == [site.base + "/m/a7f3.mp3"]

        # A worker without an archive: the same visit, and no capture at all (no body read, no screenshot).
        def no_capture(*args, **kwargs):
            raise AssertionError("a visit without an archive must capture nothing")

        monkeypatch.setattr(browser_module, "Capture", no_capture)
        _, again = await visit(r, site, stack, "/song/1", NO_ARCHIVE)
        assert [i.url for i in again.items] == [site.base + "/m/a7f3.mp3"]
    finally:
        await r.aclose()


async def test_a_visit_cut_by_its_deadline_keeps_what_it_saw(site, stack):
    r = BrowserResolver({"args": list(LOOPBACK_ONLY_ARGS), "user": TEST_BROWSER_USER, "page_timeout": 4,
                         "archive_max_bytes": 200})
    try:
        archive = Collected()
        started = time.monotonic()
        page_url, got = await visit(r, site, stack, "/hang", archive)
        assert time.monotonic() - started < 4 + 30         # the deadline, a tab close, and a loaded machine
        assert [i.url for i in got.items] == [site.base + "/m/hang.mp3"]
        # The page's bodies shared 200 bytes: the document (bigger) is kept cut, and marked so. Its body is read
        # through the tab, whose script hangs it at once: on a loaded machine the hang can come first, and then
        # the document is kept without its body, marked as cut by the visit's end. Either way it is recorded,
        # and never past the allowance.
        (document,) = [e for e in archive.exchanges if e.url == page_url]
        assert len(document.body) <= 200
        assert document.truncated == "length" or (document.truncated == "time" and document.body == b""), \
            (document.truncated, len(document.body))
        assert sum(len(e.body) for e in archive.exchanges) <= 200
        assert [m[0] for m in archive.metadatas] == [site.base + "/m/hang.mp3", page_url]
        values = dict(archive.metadatas[-1][1])
        assert values["outcome"] == "cut: its 4 s deadline" and values["dom"] == "none"
        assert archive.resources == []                     # a hung tab is neither read nor drawn
    finally:
        await r.aclose()
