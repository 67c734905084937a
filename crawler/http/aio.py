"""The transport's aiohttp side (transport.py): its sessions, body streams and error mapping.

Imported on the first request that leaves the lean path (a resolver's API call, a request through the httpx
client), not when the transport is built: a worker whose pages and downloads all go the lean way (http1.py) never
loads aiohttp: a worker's imports took 0.55 s of CPU with it, 0.35 s without (its connector builds TLS contexts
as it is imported).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import aiohttp
import aiohttp.abc
import httpx
import yarl

from crawler.http.bodies import READ_CHUNK, BodyError, BoundedDecoder
from crawler.http.egress import Egress, ProxyFailed, carry
from crawler.http.http1 import Answer, Timeouts, body_coding
from crawler.http.proxies import MAX_PROXIES, Proxy
from crawler.http.targets import TargetResolver
from crawler.http.tunnel import proxy_authorization, proxy_socket

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


class Body(httpx.AsyncByteStream):
    __slots__ = ("_chunk", "_decoder", "_response")

    def __init__(self, response: aiohttp.ClientResponse, decoder: BoundedDecoder,
                 chunk: int = READ_CHUNK) -> None:
        self._response = response
        self._decoder = decoder
        self._chunk = chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        feed = self._decoder.feed
        chunk_size = self._chunk
        try:
            if chunk_size > READ_CHUNK:
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
            rest = b"" if self._decoder.coding else salvage(self._response.content)
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


def salvage(content: aiohttp.StreamReader) -> bytes:
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


class _Resolver(aiohttp.abc.AbstractResolver):
    """The transport's TargetResolver as aiohttp's connector takes a resolver. Closing it closes nothing: the
    resolver is the transport's (the lean path's too), closed with it."""

    def __init__(self, targets: TargetResolver) -> None:
        self._targets = targets

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[aiohttp.abc.ResolveResult]:
        return await self._targets.resolve(host, port, family)     # ResolveResult: aiohttp's keys

    async def close(self) -> None:
        pass


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


class Sessions:
    """The aiohttp sessions of one transport: one direct (made on its first request, inside the running loop),
    and one per proxy in use, at most MAX_PROXIES of them."""

    def __init__(self, resolver: TargetResolver, *, max_connections: int, egress: Egress | None) -> None:
        self.resolver = resolver
        self._max_connections = max_connections
        self._egress = egress
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}
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
            connector = aiohttp.TCPConnector(resolver=_Resolver(self.resolver), use_dns_cache=False,
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

    async def send(self, method: str, url: yarl.URL, headers: list[tuple[str, str]], body: bytes | None,
                   timeout: Timeouts, max_body: int, cut: bool, read_size: int, sent: bool = False) -> Answer:
        """sent: the answer's extensions also carry the request's headers as aiohttp sent them
        (``request_headers``) and the answer's as received (``wire_headers``), for the archive (recording.py)."""
        # aiohttp asks no resolver about an IP literal: the policy judges it here, on every hop. Through a proxy
        # this is all the policy can judge: the proxy resolves a name, and what address it reaches is its own.
        self.resolver.check_literal(url.raw_host or "", url.port or 0)
        egress = self._egress
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
        return Answer(response.status, raw_headers, extensions, Body(response, decoder, read_size),
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
        if self._session is not None:
            await self._session.close()
            self._session = None
