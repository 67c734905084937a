"""Every exchange through a stack's httpx client handed to an Archive: resolvers' API calls, HLS playlists and
segments, the master's robots.txt fetch.

A ``RecordingTransport`` sits between the client and the crawler's transport. It leaves the request alone; the
response's body stream is wrapped so the bytes are kept (or, for audio, only hashed) as the caller reads them, and
when the response is closed (httpx closes every response, read or not) the request and what was read of its
answer become one ``Exchange`` for the archive. Nothing is read that the caller did not read: a body the
transport cut at its cap, or one the caller stopped reading, is recorded as far as it went, marked truncated.
Each redirect hop the client follows is a request of its own, so an exchange of its own.

What an exchange is for (its role) and which page's chain it belongs to is a ``Recorded``, taken from, first
to last:

- the request's ``archive`` extension, for a caller that knows (the HLS downloader names playlists and
  segments and their item's page; the master names its robots.txt fetch); ``None`` there: not recorded;
- the ``Recorded`` set in the current context by ``recorded_as``: the worker sets it around a page's resolution,
  so a resolver's ``ctx.http.client.get(...)`` is recorded as an ``api`` exchange of that page without any
  resolver passing anything (a context variable follows the resolver into the tasks it starts, and is gone
  when the resolution ends);
- the stack's default (``build_stack(role=...)``), or not recorded when that is None.

The headers recorded are the ones sent: the crawler's transport reports what aiohttp wrote (Host, User-Agent,
Accept-Encoding, Cookie ...) when the request asks for them (``sent_headers``), and the response's headers as
received, before a content coding was taken off (``wire_headers``); another transport's answer is recorded from
httpx's own models. ``started`` is the stack's clock when the request went to the transport.

With archiving off there is no RecordingTransport at all (build_stack installs it only for a real Archive):
nothing is teed, nothing costs.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any

import httpx
import msgspec

from crawler.archive import Archive, Exchange, Headers
from crawler.http.bodies import BodyError
from crawler.http.scoped import Scoped

# The request extension naming the exchange's role and page (a Recorded, or None: not recorded).
EXTENSION = "archive"
# The response extension the record's id is left in once the response is closed (for a metadata record that
# refers to it).
RECORD_ID = "archive_record"


class Recorded(msgspec.Struct, frozen=True):
    """How an exchange is recorded: its role (crawler.archive.ROLES), the page whose chain it belongs to, and
    whether its body is kept (else only its digest and size: audio segments stored beside the archive). A Struct:
    one is made for every page's resolution, for a fifth of a frozen dataclass's cost."""

    role: str
    page: str = ""
    keep_body: bool = True


_CURRENT: ContextVar[Recorded | None] = ContextVar("crawler_recorded_as", default=None)
_UNSET = object()


def recorded_as(role: str, page: str, *, keep_body: bool = True) -> Scoped[Recorded]:
    """Requests made through a recording client within this block (and the tasks it starts) are recorded with
    this role and page, unless a request names its own."""
    return Scoped(_CURRENT, Recorded(role, page, keep_body))


def version_of(extensions: dict[str, Any]) -> str:
    """"1.1" from an answer's ``http_version`` extension (b"HTTP/1.1")."""
    raw = extensions.get("http_version", b"HTTP/1.1")
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return text.removeprefix("HTTP/") or "1.1"


def _raw(headers: Any) -> Headers:
    """Headers as (bytes, bytes) pairs, from a multidict of str (aiohttp's) or pairs of bytes already."""
    if isinstance(headers, tuple):
        return headers
    return tuple((k.encode("latin-1", "replace"), v.encode("latin-1", "replace")) for k, v in headers.items())


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, archive: Archive, *, role: str | None = "api",
                 clock: Callable[[], float] = time.time) -> None:
        """inner: the transport that does the work; role: what an exchange nobody named is (None: not recorded);
        clock: wall-clock time, for ``started``."""
        self.inner = inner
        self.archive = archive
        self._default = Recorded(role) if role is not None else None
        self._clock = clock

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        how = request.extensions.get(EXTENSION, _UNSET)
        if how is _UNSET:
            how = _CURRENT.get() or self._default
        if not isinstance(how, Recorded):
            return await self.inner.handle_async_request(request)
        request.extensions["sent_headers"] = True
        started = self._clock()
        response = await self.inner.handle_async_request(request)
        response.stream = _Tee(response.stream, _Pending(self.archive, how, request, response, started))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Pending:
    """One exchange while its answer is read: the bytes (or their hash) so far, and how the reading ended."""

    __slots__ = ("archive", "hasher", "how", "pieces", "request", "response", "size", "started", "truncated")

    def __init__(self, archive: Archive, how: Recorded, request: httpx.Request, response: httpx.Response,
                 started: float) -> None:
        self.archive, self.how, self.request, self.response, self.started = archive, how, request, response, started
        self.pieces: list[bytes] = []
        self.hasher = None if how.keep_body else hashlib.sha256()
        self.size = 0
        self.truncated = "length"      # until the body is read to its end

    def take(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.hasher is None:
            self.pieces.append(piece)
        else:
            self.hasher.update(piece)

    def record(self) -> str:
        request, response, how = self.request, self.response, self.how
        ext = response.extensions
        sent = ext.get("request_headers")
        wire = ext.get("wire_headers")
        try:
            request_body = request.content
        except httpx.RequestNotRead:
            request_body = b""
        if self.size == 0 and (response.status_code in (204, 304) or request.method == "HEAD"
                               or response.headers.get("content-length") == "0"):
            self.truncated = ""        # nothing to read: none of it is missing
        digest, size = "", -1
        if self.hasher is not None:
            digest, size = f"sha256:{self.hasher.hexdigest()}", self.size
        return self.archive.exchange(Exchange(
            role=how.role, method=request.method, url=str(request.url),
            request_headers=_raw(sent) if sent is not None else tuple(request.headers.raw),
            status=response.status_code,
            response_headers=_raw(wire) if wire is not None else tuple(response.headers.raw),
            body=b"".join(self.pieces), started=self.started, page=how.page, request_body=request_body,
            http_version=version_of(ext), truncated=self.truncated, payload_digest=digest, payload_size=size))


class _Tee(httpx.AsyncByteStream):
    """The answer's body as the caller reads it, each piece also handed to the pending exchange; closing it
    records the exchange (once)."""

    __slots__ = ("_inner", "_pending")

    def __init__(self, inner: httpx.AsyncByteStream | httpx.SyncByteStream, pending: _Pending) -> None:
        self._inner = inner
        self._pending: _Pending | None = pending

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = self._pending
        assert pending is not None and isinstance(self._inner, httpx.AsyncByteStream)
        try:
            async for piece in self._inner:
                pending.take(piece)
                yield piece
        except BodyError:
            pending.truncated = "length"
            raise
        except httpx.TimeoutException:
            pending.truncated = "time"
            raise
        except httpx.TransportError:
            pending.truncated = "disconnect"
            raise
        # The crawler's transport ends a body cut at its cap (cut_body) as if it were whole: it says so here.
        pending.truncated = "length" if getattr(self._inner, "cut", False) else ""

    async def aclose(self) -> None:
        pending, self._pending = self._pending, None
        try:
            if isinstance(self._inner, httpx.AsyncByteStream):
                await self._inner.aclose()
        finally:
            if pending is not None:
                pending.response.extensions[RECORD_ID] = pending.record()
