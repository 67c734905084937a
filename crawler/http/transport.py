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

aiohttp's errors become the httpx errors callers already handle: connect failures ConnectError, timeouts
ConnectTimeout/ReadTimeout, a server that hangs up or sends garbage RemoteProtocolError, a cut body ReadError,
a URL that is not http(s) UnsupportedProtocol.
"""

from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import aiohttp
import aiohttp.abc
import httpx
import yarl

from crawler.http.bodies import ACCEPT_ENCODING, BodyError, BoundedDecoder
from crawler.http.egress import Egress, ProxyFailed, carry
from crawler.http.http1 import Answer, Http1Client, Timeouts, body_coding
from crawler.http.proxies import MAX_PROXIES, Proxy
from crawler.http.targets import TargetPolicy, TargetResolver
from crawler.http.tunnel import proxy_authorization, proxy_socket

_SCHEMES = frozenset(("http", "https"))
# Host names whose addresses are remembered (for dns_ttl), least recently used out.
DNS_CACHE_SIZE = 10_000


def map_error(exc: BaseException) -> httpx.TransportError:
    """The httpx error for one raised by aiohttp (or by the loop's timeout)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return httpx.TimeoutException(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, (aiohttp.NonHttpUrlClientError, aiohttp.InvalidURL)):
        return httpx.UnsupportedProtocol(message)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return httpx.ReadError(message)
    return httpx.TransportError(message)


_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError)


class _Body(httpx.AsyncByteStream):
    __slots__ = ("_chunk", "_decoder", "_response")
    CHUNK = 16 * 1024

    def __init__(self, response: aiohttp.ClientResponse, decoder: BoundedDecoder, chunk: int = CHUNK) -> None:
        self._response = response
        self._decoder = decoder
        self._chunk = chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        feed = self._decoder.feed
        chunk_size = self._chunk
        try:
            if chunk_size > self.CHUNK:
                # Large reads: each piece as one socket read gave it, never joined with the next into a copy,
                # and socket reads of that size too (asyncio's default is 256 KiB): a quarter of the wake-ups.
                connection = self._response.connection
                transport = connection.transport if connection is not None else None
                if transport is not None and getattr(transport, "max_size", chunk_size) < chunk_size:
                    cast(Any, transport).max_size = chunk_size   # asyncio's selector transports read it
                readchunk = content.readchunk
                while True:
                    chunk, _ = await readchunk()
                    if not chunk:
                        if content.at_eof():
                            return
                        continue     # the end of an HTTP chunk, not of the body
                    out = feed(chunk)
                    if out:
                        yield out
                    if self._decoder.full:
                        return
            read = content.read
            while chunk := await read(chunk_size):
                out = feed(chunk)
                if out:
                    yield out
                if self._decoder.full:
                    return
        except _FAILURES as e:
            # aiohttp raises a cut connection's error before handing out what it had already received; those
            # bytes are valid data (a download resumes after them), so an undecoded body yields them first.
            rest = b"" if self._decoder.coding else _salvage(self._response.content)
            if rest and (out := feed(rest)):
                yield out
            raise map_error(e) from e

    async def aclose(self) -> None:
        # Back to the pool when the body was read to the end; closed when it was not (a capped page).
        self._response.release()

    @property
    def cut(self) -> bool:
        """The body passed its cap and was cut there (``cut_body``): what was handed out is not all of it."""
        return self._decoder.full


def _salvage(content: aiohttp.StreamReader) -> bytes:
    """The bytes a failed StreamReader still buffers. aiohttp offers no public call for them once its
    exception is set, so this reads its buffer (a deque of bytes, the first consumed up to an offset): the one
    place the crawler touches another library's private attributes. tests/test_transport.py's
    test_the_bytes_a_failed_aiohttp_stream_holds_are_salvaged fails if aiohttp changes them."""
    buffer = getattr(content, "_buffer", None)
    if not buffer:
        return b""
    offset = getattr(content, "_buffer_offset", 0)
    data = b"".join(buffer)[offset:]
    buffer.clear()
    content._buffer_offset = 0
    content._size = 0
    return data


class _ProxyConnector(aiohttp.TCPConnector):
    """aiohttp's connector for the requests through one proxy. For an HTTP proxy aiohttp speaks the proxy's
    protocol itself and asks this connector for a connection to the proxy (made here, without the target
    resolver); for SOCKS5 every connection is a tunnel through the proxy to the request's origin. aiohttp offers
    no public hook for either: this overrides its one method that makes a connection, as aiohttp-socks does."""

    def __init__(self, proxy: Proxy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.proxy = proxy

    async def _create_direct_connection(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout, *,
                                        client_error: type[Exception] = aiohttp.ClientConnectorError,
                                        ) -> tuple[asyncio.Transport, Any]:
        proxy = self.proxy
        loop = asyncio.get_running_loop()
        host, port = req.url.raw_host or "", req.port or 0
        # For an HTTP proxy aiohttp asks for the proxy itself (and speaks CONNECT over it): no tunnel, no TLS here.
        tunnel = proxy.scheme != "http"
        sock = await proxy_socket(proxy, host, port, timeout.sock_connect, tunnel=tunnel)
        tls = self._get_ssl_context(req) if tunnel else None
        try:
            async with asyncio.timeout(timeout.sock_connect):
                made: tuple[asyncio.Transport, Any] = await loop.create_connection(
                    self._factory, sock=sock, ssl=tls, server_hostname=host if tls else None)
                return made
        except ssl.SSLCertVerificationError as exc:     # TLS with the origin: the origin's failure, not the proxy's
            sock.close()
            raise aiohttp.ClientConnectorCertificateError(req.connection_key, exc) from exc
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise client_error(req.connection_key, OSError(getattr(exc, "errno", None), str(exc))) from exc
        except BaseException:
            sock.close()
            raise


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, resolver: TargetResolver, *, max_connections: int, max_body: int,
                 total_timeout: float | None = None, egress: Egress | None = None) -> None:
        """resolver: DNS and the target policy of every connection, aiohttp's and the lean client's; the aiohttp
        session is made on the first request, inside the running loop.

        max_body bounds every body (decoded) unless a request's ``max_body`` extension says otherwise;
        total_timeout bounds every exchange, body included, unless a request's ``total_timeout`` does.
        """
        self.resolver = resolver
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._lean: Http1Client | None = None
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}
        self.max_body = max_body
        self.total_timeout = total_timeout
        self.egress = egress
        self._proxied: dict[Proxy, aiohttp.ClientSession] = {}

    def _through(self, proxy: Proxy) -> aiohttp.ClientSession:
        session = self._proxied.get(proxy)
        if session is None:
            if len(self._proxied) >= MAX_PROXIES:
                # Bounded: the oldest session goes (its requests in flight end on their own connections).
                old = self._proxied.pop(next(iter(self._proxied)))
                asyncio.get_running_loop().create_task(old.close())
            connector = _ProxyConnector(proxy, limit=self._max_connections, limit_per_host=0,
                                        enable_cleanup_closed=True, use_dns_cache=False)
            session = self._proxied[proxy] = aiohttp.ClientSession(connector=connector,
                                                                   cookie_jar=aiohttp.DummyCookieJar())
        return session

    def _open(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            # aiohttp's DNS cache off: the resolver keeps its own, and checks every answer, cached or not.
            connector = aiohttp.TCPConnector(resolver=self.resolver, use_dns_cache=False,
                                             limit=self._max_connections, limit_per_host=0,
                                             enable_cleanup_closed=True)
            session = self._session = aiohttp.ClientSession(connector=connector,
                                                            cookie_jar=aiohttp.DummyCookieJar())
        return session

    def _timeout(self, key: Timeouts) -> aiohttp.ClientTimeout:
        """key: (connect, read, pool, total) in seconds, each None for no limit."""
        timeout = self._timeouts.get(key)
        if timeout is None:
            if len(self._timeouts) > 64:   # callers use a handful of settings; stay bounded anyway
                self._timeouts.clear()
            # aiohttp's connect covers waiting for a pooled connection and connecting; sock_connect the latter.
            # Its total runs until the body is read to the end or released.
            pool_and_connect = None if key[2] is None or key[0] is None else key[2] + key[0]
            timeout = aiohttp.ClientTimeout(total=key[3], connect=pool_and_connect, sock_connect=key[0],
                                            sock_read=key[1])
            self._timeouts[key] = timeout
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in _SCHEMES:
            raise httpx.UnsupportedProtocol(f"the URL's scheme is {url.scheme!r}, not http or https")
        body = await request.aread()
        ext = request.extensions
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        t = ext.get("timeout") or {}
        answer = await self._send(request.method, yarl.URL(str(url), encoded=True), headers, body or None,
                                  (t.get("connect"), t.get("read"), t.get("pool"),
                                   ext.get("total_timeout", self.total_timeout)),
                                  ext.get("max_body", self.max_body), ext.get("cut_body", False),
                                  ext.get("read_size") or _Body.CHUNK, ext.get("sent_headers", False))
        return httpx.Response(answer.status_code, headers=answer.raw_headers, stream=cast(_Body, answer.stream),
                              request=request, extensions=answer.extensions)

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

    async def _send(self, method: str, url: yarl.URL, headers: list[tuple[str, str]], body: bytes | None,
                    timeout: Timeouts, max_body: int, cut: bool, read_size: int, sent: bool = False) -> Answer:
        """sent: the answer's extensions also carry the request's headers as aiohttp sent them
        (``request_headers``) and the answer's as received (``wire_headers``), for the archive (recording.py)."""
        # aiohttp asks no resolver about an IP literal: the policy judges it here, on every hop. Through a proxy
        # this is all the policy can judge: the proxy resolves a name, and what address it reaches is its own.
        self.resolver.check_literal(url.raw_host or "", url.port or 0)
        egress = self.egress
        proxies = () if egress is None or egress.route is None else egress.route(url.raw_host or "", url.port or 0)
        if proxies:
            assert egress is not None
            response = await self._proxied_request(egress, proxies, method, url, headers, body, timeout)
        else:
            try:
                response = await self._open().request(
                    method, url, headers=headers, data=body, allow_redirects=False, auto_decompress=False,
                    timeout=self._timeout(timeout))
            except _FAILURES as e:
                raise map_error(e) from e
        raw_headers = response.raw_headers
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        if sent:
            extensions["request_headers"] = response.request_info.headers
            extensions["wire_headers"] = raw_headers
        try:
            coding, raw_headers = body_coding(raw_headers, extensions)
        except BodyError:
            response.close()
            raise
        decoder = BoundedDecoder(coding, max_body, cut=cut)
        # aiohttp's own headers serve while nothing was taken off; else they are built from the raw ones left.
        return Answer(response.status, raw_headers, extensions, _Body(response, decoder, read_size),
                      None if coding else response.headers)

    async def _proxied_request(self, egress: Egress, proxies: Sequence[Proxy], method: str, url: yarl.URL,
                               headers: list[tuple[str, str]], body: bytes | None,
                               timeout: Timeouts) -> aiohttp.ClientResponse:
        """The request through the proxies that apply to its host, failing over as egress.carry does (as
        http1.py's lean path does)."""

        async def send(proxy: Proxy) -> aiohttp.ClientResponse:
            sent = headers
            extra: dict[str, Any] = {}
            if proxy.scheme == "http":
                extra["proxy"] = proxy.label
                auth = proxy_authorization(proxy)
                if auth is not None:
                    # aiohttp sends proxy_headers on CONNECT only: an absolute-form request carries its own.
                    if url.scheme == "http":
                        sent = [*headers, ("Proxy-Authorization", auth)]
                    else:
                        extra["proxy_headers"] = {"Proxy-Authorization": auth}
            try:
                response = await self._through(proxy).request(
                    method, url, headers=sent, data=body, allow_redirects=False, auto_decompress=False,
                    timeout=self._timeout(timeout), **extra)
            except (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError) as exc:
                raise ProxyFailed(proxy, str(exc)[:300] or type(exc).__name__) from None
            except ProxyFailed:
                raise
            except _FAILURES as e:
                raise map_error(e) from e
            if proxy.scheme == "http" and url.scheme == "http" and response.status == 407:
                response.close()
                raise ProxyFailed(proxy, "407: the proxy wants (other) credentials")
            return response

        return await carry(egress, f"{url.raw_host or ''}:{url.port or 0}", proxies, send,
                           asyncio.get_running_loop().time)

    async def aclose(self) -> None:
        for proxied in self._proxied.values():
            await proxied.close()
        self._proxied.clear()
        if self._lean is not None:
            await self._lean.aclose()
            self._lean = None
        if self._session is not None:
            await self._session.close()
            self._session = None
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
                    resolver: aiohttp.abc.AbstractResolver | None = None,
                    egress: Egress | None = None) -> AiohttpTransport:
    """The transport; max_body bounds every body it hands out (decoded), total_timeout every exchange, policy
    the addresses it connects to (None: any; only tests of the transport itself go without); resolver the DNS
    behind the transport's cache (aiohttp's default when None)."""
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
