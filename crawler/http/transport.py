"""An httpx transport over one aiohttp session: the httpx API, aiohttp's connection handling.

Plain httpx gets slower as connections grow (measured on one local site: 676 pages/s at 8 connections, 299 at 64,
206 at 256; httpx issue #3215); aiohttp stays flat. httpx-aiohttp does the
same job, but builds a timeout object, re-parses the URL and enters an exception-mapping context manager for
every request and every body chunk. On the worker's page path that glue cost a tenth of the CPU of a page, so
this one keeps only what a crawler needs. (Page fetches and downloads now skip httpx and aiohttp both, on the
lean path ``get`` opens to http1.py; the httpx path serves resolvers' API calls.)

- one ClientTimeout per distinct (connect, read, pool, total) setting, not one per request;
- the URL handed over already encoded (httpx has done that), so aiohttp does not quote it again;
- header names sent as written (User-Agent, not user-agent), as browsers and httpx's own transport do;
- the body read in chunks of at most 16 KiB, with aiohttp's errors mapped to httpx's only when one happens;
  a request's ``read_size`` extension sets both that and aiohttp's buffer (downloads read large chunks, so a
  gigabyte costs a few thousand iterations, not sixty thousand);
- when a connection breaks mid-body, the bytes aiohttp had already received are handed out before the error
  (an undecoded body only): a download keeps every byte it got and resumes where they end;
- every body bounded after decoding (crawler/http/bodies.py): the transport decodes the one Content-Encoding it
  accepts itself, refuses stacks of them, and hands httpx the decoded body without the Content-Encoding and
  Content-Length headers (they described the wire, not these bytes; the original coding is in the response's
  ``content_encoding`` extension). The limit is the transport's ``max_body``, or a request's ``max_body``
  extension; past it the body raises BodyError, or with the ``cut_body`` extension simply ends (one byte past
  the limit, so the reader can tell);
- a total deadline for the whole exchange, body included (``total_timeout``, per transport or per request), so
  a server that trickles a byte at a time is cut off;
- no cookies (the session's jar is a DummyCookieJar), no decompression by aiohttp;
- proxies as the egress (crawler/http/egress.py) chooses them per host: one aiohttp session per proxy (so
  connections are pooled per proxy and origin), HTTP proxies by aiohttp's own proxy support (absolute-form for
  http, CONNECT for https), SOCKS5 by a tunnel (tunnel.py) under aiohttp's connector, which aiohttp has no
  support for itself. The connection to the proxy is made by tunnel.py too, never by the target resolver: the
  proxy's address is the operator's choice.
- for the archive (crawler/http/recording.py), when a request asks (``sent_headers``): the headers as aiohttp
  sent them (Host and its defaults included) and the answer's as received, before a coding was taken off.

The aiohttp side (its sessions, body streams and error mapping) is crawler/http/aio.py, imported by the first
request that needs it: a worker whose pages and downloads all take the lean path never loads aiohttp.

aiohttp's errors become the httpx errors callers already handle: connect failures ConnectError, timeouts
ConnectTimeout/ReadTimeout, a server that hangs up or sends garbage RemoteProtocolError, a cut body ReadError,
a URL that is not http(s) UnsupportedProtocol.
"""

from __future__ import annotations

import functools
import http.cookiejar
import socket
from typing import TYPE_CHECKING, Any, cast

import httpx
import yarl

from crawler.http.bodies import ACCEPT_ENCODING, READ_CHUNK
from crawler.http.egress import Egress
from crawler.http.http1 import Answer, Http1Client, Timeouts
from crawler.http.targets import Dns, TargetPolicy, TargetResolver

if TYPE_CHECKING:
    from crawler.http.aio import Sessions

_SCHEMES = frozenset(("http", "https"))
# Host names whose addresses are remembered (for dns_ttl), least recently used out.
DNS_CACHE_SIZE = 10_000


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, resolver: TargetResolver, *, max_connections: int, max_body: int,
                 total_timeout: float | None = None, egress: Egress | None = None) -> None:
        """resolver: DNS and the target policy of every connection, aiohttp's and the lean client's; aiohttp is
        imported and its session made on the first request that needs them, inside the running loop.

        max_body bounds every body (decoded) unless a request's ``max_body`` extension says otherwise;
        total_timeout bounds every exchange, body included, unless a request's ``total_timeout`` does.
        """
        self.resolver = resolver
        self._max_connections = max_connections
        self._sessions: Sessions | None = None
        self._lean: Http1Client | None = None
        self.max_body = max_body
        self.total_timeout = total_timeout
        self.egress = egress

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in _SCHEMES:
            raise httpx.UnsupportedProtocol(f"the URL's scheme is {url.scheme!r}, not http or https")
        body = await request.aread()
        ext = request.extensions
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        t = ext.get("timeout") or {}
        sessions = self._sessions
        if sessions is None:
            from crawler.http import aio   # aiohttp: imported by the first request that needs it

            sessions = self._sessions = aio.Sessions(self.resolver, max_connections=self._max_connections,
                                                 egress=self.egress)
        answer = await sessions.send(request.method, yarl.URL(str(url), encoded=True), headers, body or None,
                                     (t.get("connect"), t.get("read"), t.get("pool"),
                                      ext.get("total_timeout", self.total_timeout)),
                                     ext.get("max_body", self.max_body), ext.get("cut_body", False),
                                     ext.get("read_size") or READ_CHUNK, ext.get("sent_headers", False))
        return httpx.Response(answer.status_code, headers=answer.raw_headers,
                              stream=cast(httpx.AsyncByteStream, answer.stream), request=request,
                              extensions=answer.extensions)

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts,
                  max_body: int, read_size: int, cut: bool = False) -> Answer:
        """A GET without httpx's models or aiohttp's request machinery: what a page fetch or a download reads.

        A page or a small audio file costs little more to fetch than the client objects built around the
        request: page fetches and downloads use this (http1.py: its own keep-alive pool, the same DNS cache and
        target policy as this transport's connections), resolvers' API calls the httpx path. timeout is
        (connect, read, pool, total); max_body, read_size and cut as the extensions max_body, read_size and
        cut_body."""
        if self._lean is None:
            # The same resolver (DNS cache and target check) as aiohttp's connections; as many idle connections as
            # the transport may hold open.
            idle = self._max_connections or 100
            self._lean = Http1Client(functools.partial(self.resolver.resolve, family=socket.AF_UNSPEC),
                                     max_idle=idle, max_idle_per_host=idle, egress=self.egress,
                                     check_literal=self.resolver.check_literal)
        return await self._lean.get(url, headers, timeout=timeout, max_body=max_body, read_size=read_size, cut=cut)

    async def aclose(self) -> None:
        if self._sessions is not None:
            await self._sessions.aclose()
            self._sessions = None
        if self._lean is not None:
            await self._lean.aclose()
            self._lean = None
        await self.resolver.close()


class _NoCookieJar(http.cookiejar.CookieJar):
    """A crawler keeps no cookie jar: it would grow with every site visited, and parsing every response's
    Set-Cookie costs more than parsing some pages. Resolvers that need cookies send them per request.

    httpx takes a CookieJar as its jar (``cookies=``) and asks it to extract and to store; this one does
    neither, so nothing is parsed and the jar stays empty (an empty jar adds no Cookie header).
    """

    def extract_cookies(self, response: Any, request: Any) -> None:
        pass

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        pass


def build_transport(*, max_connections: int, dns_ttl: float, max_body: int = 5 * 1024 * 1024,
                    total_timeout: float | None = None, policy: TargetPolicy | None = None,
                    dns_cache_size: int = DNS_CACHE_SIZE,
                    resolver: Dns | None = None,
                    egress: Egress | None = None) -> AiohttpTransport:
    """The transport; max_body bounds every body it hands out (decoded), total_timeout every exchange, policy
    the addresses it connects to (None: any; only tests of the transport itself go without); resolver the DNS
    behind the transport's cache (getaddrinfo in the loop's threads when None)."""
    return AiohttpTransport(TargetResolver(policy, ttl=dns_ttl, max_size=dns_cache_size, resolver=resolver),
                            max_connections=max_connections, max_body=max_body, total_timeout=total_timeout,
                            egress=egress)


def build_client(transport: httpx.AsyncBaseTransport, *, user_agent: str, connect_timeout: float, read_timeout: float,
                 max_redirects: int) -> httpx.AsyncClient:
    """The client for resolvers' API calls and downloads: redirects followed up to the limit."""
    timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout, pool=None)
    # Accept-Encoding names exactly the codings the transport decodes within its bounds (crawler/http/bodies.py).
    return httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=True,
                             max_redirects=max_redirects, cookies=_NoCookieJar(),
                             headers={"User-Agent": user_agent, "Accept-Encoding": ACCEPT_ENCODING})
