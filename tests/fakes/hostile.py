"""A hostile web site on loopback: a small legitimate music site with an attack beside it.

Every crawl of it starts at ``/s/<scenario>/``: an index of ``LEGIT`` ordinary pages, each with one real (tiny)
MP3, plus the hostile pages of that scenario. The legitimate part must come through whole whatever the hostile
part does; the hostile part must cost the crawler bounded memory and time and be recorded for what it is.

Scenarios (the classes of attack a crawler meets on the open web):

- ``encoding``: ``Content-Encoding: gzip, gzip`` (one header line, and two) over a body that inflates to
  256 MiB per layer.
- ``markup``: 40,000 nested ``<div>`` (quadratic in lexbor), the same with stray end tags between, and a page
  of 150,000 links.
- ``trickle``: a page and an audio file sent a byte at a time, for ever.
- ``ssrf``: audio links and a redirect to a "private service" on another loopback port, by address and by name,
  and a link to it that the scope must drop. The private service counts the requests it gets (none, if the
  crawler holds).
- ``not_audio``: an HTML error page and an executable served as ``audio/mpeg``.
- ``xml``: gzip sitemaps of a few KiB that inflate to 15 MiB of XML nested 2.2 million deep, or to one
  element with a million attributes, each after a few real ``<url>`` entries (``sitemap_pages``) that only it names.

``robots`` chooses the site's robots.txt: ``None`` (404), ``"stacked"`` (a stacked-encoding bomb),
``"huge"`` (500 KiB of rules, most of them noise), ``"trickle"``, ``"private"`` (a redirect to the private
service).
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import zlib
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

from crawler.politeness import ROBOTS_MAX_BYTES

LEGIT = 12
MiB = 1024 * 1024


@functools.cache
def gzip_zeros(size: int) -> bytes:
    """gzip of `size` zero bytes, made in pieces (never `size` bytes in memory)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    piece = b"\0" * MiB
    out = [c.compress(piece) for _ in range(size // MiB)]
    out.append(c.flush())
    return b"".join(out)


def mp3(n: int) -> bytes:
    """A tiny file that starts like an MP3 (an ID3 tag, then an MPEG frame header)."""
    return b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x64" + bytes([n % 256]) * 2000


@dataclass
class HostileSite:
    robots: str | None = None
    hits: Counter = field(default_factory=Counter)           # path -> requests, on the site
    private_hits: Counter = field(default_factory=Counter)   # path -> requests, on the private service
    url: str = ""
    private_url: str = ""
    _runners: list = field(default_factory=list)
    _bomb: bytes = b""

    def legit_pages(self, scenario: str) -> list[str]:
        return [f"/s/{scenario}/ok/{i}.html" for i in range(LEGIT)]

    def legit_audio(self, scenario: str) -> dict[str, bytes]:
        return {f"/s/{scenario}/ok/{i}.mp3": mp3(i) for i in range(LEGIT)}

    async def __aenter__(self) -> HostileSite:
        # Two gzip layers over 256 MiB of zeros: about 250 KiB on the wire, 256 MiB after one layer, and
        # 256 MiB again per layer for anything that decodes both.
        self._bomb = stacked_bomb()
        private = web.Application()
        private.router.add_route("*", "/{tail:.*}", self._private)
        site = web.Application()
        site.router.add_route("*", "/{tail:.*}", self._site)
        for app in (private, site):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
        self.private_url = f"http://127.0.0.1:{self._runners[0].addresses[0][1]}"
        self.url = f"http://127.0.0.1:{self._runners[1].addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()

    # ------------------------------------------------------------------ the private service
    async def _private(self, request: web.Request) -> web.Response:
        self.private_hits[request.path] += 1
        return web.Response(body=mp3(99), content_type="audio/mpeg")   # "secret" data that looks like audio

    # ------------------------------------------------------------------ the site
    async def _site(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.hits[path] += 1
        if path == "/robots.txt":
            return await self._robots(request)
        parts = path.split("/")
        if len(parts) >= 4 and parts[1] == "s":
            scenario = parts[2]
            rest = "/".join(parts[3:])
            if rest == "":
                return self._index(scenario)
            if rest.startswith("ok/") and rest.endswith(".html"):
                n = rest[3:-5]
                return _html(f'<html><head><title>Song {n}</title></head><body><h1>Song {n}</h1>'
                             f'<a href="/s/{scenario}/ok/{n}.mp3" data-title="Song {n}">listen</a></body></html>')
            if rest.startswith("from-") and rest.endswith(".html"):
                return _html(f"<html><body><h1>{rest}</h1></body></html>")
            if rest.startswith("ok/") and rest.endswith(".mp3"):
                return web.Response(body=mp3(int(rest[3:-4])), content_type="audio/mpeg")
            handler = getattr(self, "_" + rest.replace("-", "_").replace(".", "_"), None)
            if handler is not None:
                return await handler(request)
        return web.Response(status=404, text="not found")

    def _index(self, scenario: str) -> web.Response:
        links = [f'<a href="{p}">page</a>' for p in self.legit_pages(scenario)]
        links += [f'<a href="/s/{scenario}/{p}">x</a>' for p in HOSTILE_PAGES[scenario]]
        if scenario == "ssrf":
            links.append(f'<a href="{self.private_url}/admin.html">admin</a>')      # out of scope: dropped
        return _html("<html><body>" + "\n".join(links) + "</body></html>")

    # encoding
    async def _stacked_html(self, request: web.Request) -> web.Response:
        return web.Response(body=self._bomb, headers={"Content-Type": "text/html",
                                                      "Content-Encoding": "gzip, gzip"})

    async def _stacked_lines_html(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self._bomb, headers={"Content-Type": "text/html"})
        resp.headers.add("Content-Encoding", "gzip")
        resp.headers.add("Content-Encoding", "gzip")
        return resp

    async def _one_layer_html(self, request: web.Request) -> web.Response:
        # One honest layer of 256 MiB: cut at the page cap, the page itself kept.
        return web.Response(body=gzip_zeros(256 * MiB),
                            headers={"Content-Type": "text/html", "Content-Encoding": "gzip"})

    # markup
    async def _deep_html(self, request: web.Request) -> web.Response:
        return _html("<html><body>" + "<div>" * 40_000 + "</body></html>")

    async def _deep_stray_html(self, request: web.Request) -> web.Response:
        return _html("<html><body>" + "<div></x>" * 40_000 + "</body></html>")

    async def _links_html(self, request: web.Request) -> web.Response:
        return _html("<html><body>" + "".join(f'<a href="/n/{i}">{i}</a>' for i in range(150_000))
                     + "</body></html>")

    # trickle
    async def _trickle_html(self, request: web.Request) -> web.StreamResponse:
        return await _trickle(request, "text/html", None, b"<html><body>")

    async def _trickle_page_html(self, request: web.Request) -> web.Response:
        return _html('<html><body><a href="trickle.mp3">slow song</a></body></html>')

    async def _trickle_mp3(self, request: web.Request) -> web.StreamResponse:
        return await _trickle(request, "audio/mpeg", 10 * MiB, mp3(1))

    # ssrf
    async def _ssrf_html(self, request: web.Request) -> web.Response:
        p = self.private_url
        named = p.replace("127.0.0.1", "localhost")
        return _html('<html><body>'
                     f'<a href="redirect.mp3">one</a><a href="{p}/direct.mp3">two</a>'
                     f'<a href="{named}/named.mp3">three</a>'
                     '<audio src="redirect-wav.wav"></audio></body></html>')

    async def _redirect_mp3(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(self.private_url + "/redirected.mp3")

    async def _redirect_wav_wav(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(self.private_url.replace("127.0.0.1", "localhost") + "/redirected.wav")

    # xml
    def sitemap_pages(self, name: str) -> list[str]:
        return [f"/s/xml/from-{name}/{i}.html" for i in range(3)]

    async def _deep_xml_gz(self, request: web.Request) -> web.Response:
        return await self._sitemap("deep")

    async def _attrs_xml_gz(self, request: web.Request) -> web.Response:
        return await self._sitemap("attrs")

    async def _sitemap(self, kind: str) -> web.Response:
        # Made in a thread: compressing 15 MiB must not stall the legitimate pages served beside it.
        body = await asyncio.to_thread(hostile_sitemap, self.url, tuple(self.sitemap_pages(kind)), kind)
        # Typed as XML so that the worker reads it whole; the name's .gz says it is compressed.
        return web.Response(body=body, headers={"Content-Type": "application/xml"})

    # not audio
    async def _fake_html(self, request: web.Request) -> web.Response:
        return _html('<html><body><a href="error.mp3">a</a><a href="tool.mp3">b</a></body></html>')

    async def _error_mp3(self, request: web.Request) -> web.Response:
        return web.Response(body=b"<!doctype html><html><body>Error 404: no such song</body></html>",
                            content_type="audio/mpeg")

    async def _tool_mp3(self, request: web.Request) -> web.Response:
        return web.Response(body=b"MZ\x90\x00\x03" + b"\0" * 4000, content_type="audio/mpeg")

    # robots.txt
    async def _robots(self, request: web.Request) -> web.StreamResponse:
        if self.robots == "stacked":
            return web.Response(body=self._bomb, headers={"Content-Type": "text/plain",
                                                          "Content-Encoding": "gzip, gzip"})
        if self.robots == "huge":
            return web.Response(body=_HUGE_ROBOTS, headers={"Content-Type": "text/plain"})
        if self.robots == "trickle":
            return await _trickle(request, "text/plain", None, b"User-agent: *\n")
        if self.robots == "private":
            raise web.HTTPFound(self.private_url + "/robots.txt")
        return web.Response(status=404)


HOSTILE_PAGES = {
    "encoding": ["stacked.html", "stacked-lines.html", "one-layer.html"],
    "markup": ["deep.html", "deep-stray.html", "links.html"],
    "trickle": ["trickle.html", "trickle-page.html"],
    "ssrf": ["ssrf.html"],
    "not_audio": ["fake.html"],
    "xml": ["deep.xml.gz", "attrs.xml.gz"],
}


@functools.cache
def _hostile_body(kind: str) -> bytes:
    """15 MiB of XML (under the worker's 16 MiB bound for a decompressed feed or sitemap): nesting for ever, or
    one element's attributes; gzip makes it a few KiB on the wire."""
    size = 15 * MiB
    if kind == "deep":
        half = size // 7
        return b"<url>" + b"<x>" * half + b"</x>" * half + b"</url>"
    n = size // 14
    return b"<url " + b"".join(b'a%07d=">" ' % i for i in range(n)) + b"/>"


@functools.cache
def hostile_sitemap(base: str, pages: tuple[str, ...], kind: str) -> bytes:
    """The gzip-compressed sitemap: ``pages`` first, then the attack."""
    head = b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">' + b"".join(
        b"<url><loc>%s%s</loc></url>" % (base.encode(), page.encode()) for page in pages)
    return gzip.compress(head + _hostile_body(kind) + b"</urlset>", 9)


@functools.cache
def stacked_bomb() -> bytes:
    return gzip.compress(gzip_zeros(256 * MiB))


# As much robots.txt as the crawler reads: one real rule for us, then noise rules for other paths.
_HUGE_ROBOTS = (b"User-agent: *\nDisallow: /private/\n"
                + b"".join(b"Disallow: /noise/%d/*.php$\n" % i for i in range(20_000)))[:ROBOTS_MAX_BYTES]


def _html(text: str) -> web.Response:
    return web.Response(text=text, content_type="text/html")


async def _trickle(request: web.Request, content_type: str, length: int | None, head: bytes) -> web.StreamResponse:
    headers = {"Content-Type": content_type}
    if length is not None:
        headers["Content-Length"] = str(length)
    resp = web.StreamResponse(headers=headers)
    await resp.prepare(request)
    await resp.write(head)
    try:
        while True:      # a byte now and then: every read timeout is met, the body never ends
            await asyncio.sleep(0.2)
            await resp.write(b" ")
    except (ConnectionError, RuntimeError):
        pass
    return resp
