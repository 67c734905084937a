"""An httpx transport over one aiohttp session: the httpx API, aiohttp's connection handling.

Plain httpx gets slower as connections grow (see the design notes); aiohttp stays flat. httpx-aiohttp does the
same job, but builds a timeout object, re-parses the URL and enters an exception-mapping context manager for
every request and every body chunk. On the worker's page path that glue cost a tenth of the CPU of a page, so
this one keeps only what a crawler needs:

- one ClientTimeout per distinct (connect, read, pool) triple, not one per request;
- the URL handed over already encoded (httpx has done that), so aiohttp does not quote it again;
- header names sent as written (User-Agent, not user-agent), as browsers and httpx's own transport do;
- the body read in chunks of at most 16 KiB (a compressed chunk then expands to at most about 16 MiB before
  the fetcher's cap is checked), with aiohttp's errors mapped to httpx's only when one happens;
- no proxies, no cookies (the session's jar is a DummyCookieJar), no decompression (httpx decodes, so the
  fetcher's cap counts decoded bytes).

aiohttp's errors become the httpx errors callers already handle: connect failures ConnectError, timeouts
ConnectTimeout/ReadTimeout, a server that hangs up or sends garbage RemoteProtocolError, a cut body ReadError,
a URL that is not http(s) UnsupportedProtocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import httpx
import yarl

_SCHEMES = frozenset(("http", "https"))


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
    __slots__ = ("_response",)
    CHUNK = 16 * 1024

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = self._response.content.read
        chunk_size = self.CHUNK
        try:
            while chunk := await read(chunk_size):
                yield chunk
        except _FAILURES as e:
            raise map_error(e) from e

    async def aclose(self) -> None:
        # Back to the pool when the body was read to the end; closed when it was not (a capped page).
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, session: Callable[[], aiohttp.ClientSession]) -> None:
        """session makes the aiohttp session; it is called on the first request, inside the running loop."""
        self._make_session = session
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple, aiohttp.ClientTimeout] = {}

    def _timeout(self, request: httpx.Request) -> aiohttp.ClientTimeout:
        t = request.extensions.get("timeout") or {}
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            if len(self._timeouts) > 64:   # callers use a handful of settings; stay bounded anyway
                self._timeouts.clear()
            # aiohttp's connect covers waiting for a pooled connection and connecting; sock_connect the latter.
            pool_and_connect = None if key[2] is None or key[0] is None else key[2] + key[0]
            timeout = aiohttp.ClientTimeout(total=None, connect=pool_and_connect, sock_connect=key[0],
                                            sock_read=key[1])
            self._timeouts[key] = timeout
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in _SCHEMES:
            raise httpx.UnsupportedProtocol(f"the URL's scheme is {url.scheme!r}, not http or https")
        session = self._session
        if session is None:
            session = self._session = self._make_session()
        body = await request.aread()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
        try:
            response = await session.request(
                request.method, yarl.URL(str(url), encoded=True), headers=headers, data=body or None,
                allow_redirects=False, auto_decompress=False, timeout=self._timeout(request))
        except _FAILURES as e:
            raise map_error(e) from e
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(response.status, headers=response.raw_headers, stream=_Body(response),
                              request=request, extensions=extensions)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
