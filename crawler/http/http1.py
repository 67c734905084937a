"""A lean HTTP/1.1 GET client for pages and audio downloads: a pool of keep-alive connections and a C parser.

A page or a small audio file costs little more to fetch than the request machinery around it: aiohttp's session
builds a request object, a response object, a timer handle, cookie and proxy look-ups and a payload stream per
request, about 0.1 ms of CPU against 0.03 ms for writing the request and parsing the answer with llhttp (measured
on loopback against nginx, 64 in flight), and httpx's request and response models as much again. Page fetches
and downloads ask for nothing else (no cookies, no redirects: a page reports its Location as a link, the
downloader follows redirects itself, each hop judged by its plan), so they take this path; resolvers' API calls
stay on aiohttp under httpx (transport.py).

Proxies (crawler/http/egress.py chooses one per origin): an http URL through an HTTP proxy is sent in absolute
form on a connection to the proxy, with its credentials; anything else goes through a tunnel (tunnel.py: CONNECT
or SOCKS5), TLS over it for https. Connections are pooled per (proxy, origin). When no proxy can apply, ``get``
reads one attribute and goes on as before.

What a fetch needs, and nothing more:

- connections to the addresses the crawl may reach: resolved by the caller's ``resolve`` (targets.py's
  TargetResolver: its DNS cache and its target policy, the same check as every other connection), TLS
  verified against the system's certificates with the host name;
- keep-alive: a connection goes back to its (scheme, host, port) pool once its answer was read to the end and
  neither side said ``Connection: close``; a pooled connection the server closed meanwhile is retried once on a
  new one (a GET is safe to send again) before any error is reported. Idle connections are bounded per host
  and in all, the least recently used closed first, and dropped after ``keepalive`` seconds;
- bounds: the answer's head at most ``MAX_HEAD`` bytes; a read timeout (no byte for that long while waiting),
  a connect timeout, and a total one over the whole exchange, body included; the body decoded and capped by
  crawler/http/bodies.py as the other transport does (past the cap BodyError, or for a page the body just ends);
- the body handed out in the pieces the socket gave, with reading paused while more than ``read_size`` bytes
  wait for the reader (a slow disk holds the sender back, not memory);
- a cut connection's bytes: every byte received before the cut is handed out before the error, so a download
  keeps them and resumes after them;
- an answer not read to its end (a page cut at its cap) closes its connection instead of going back to the pool.

The dialects of real servers, read as browsers read them (RFC 9112) without the framing that enables smuggling:

- a head llhttp refuses is read once more from its first byte, normalised (``unfold_head``): bare-LF line ends
  become CRLF and each folded line (obs-fold) joins its field with one space. Only the head is normalised, and
  only when the strict parse failed, so a well-formed answer costs nothing more; the body's framing (chunk lines)
  stays strict. llhttp's own leniencies are not used: ``lenient_headers`` (the one that unfolds) also takes a lone
  CR as a line end and any byte in a value, and ``lenient_optional_cr_before_lf`` also loosens the chunk lines;
- framing stays strict: two Content-Lengths, Content-Length with Transfer-Encoding (both llhttp's refusals),
  chunked applied twice or not last, and a folded Content-Length or Transfer-Encoding line are refused;
- trailer fields are never headers: they are dropped however the reads fall, and bounded like a head;
- a transfer coding that is not chunked (``identity``, or one we do not decode) frames the body to the
  connection's close, as RFC 9112 says for answers; one we do not decode is then refused as a coding (BodyError);
- an internet radio station's SHOUTcast answer (``ICY 200 OK``: HTTP/1.0 under another name, which llhttp, httpx
  and aiohttp refuse) is read as ``HTTP/1.0 200 OK``: only the status line's protocol is renamed, only the literal
  ``ICY``, at an answer's first bytes (however the reads split them), and everything after it is parsed as any
  answer is, strictly. Such a body has no length: it is read to the close as HTTP/1.0 says, which for a station is
  never (the reader stops it: crawler/worker/icy.py). The answer says so in its ``icy`` extension.

Errors are the httpx ones the fetcher and the downloader handle: ConnectError, ConnectTimeout, ReadTimeout,
RemoteProtocolError (not HTTP, or the server hung up before answering), ReadError (the body was cut).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import httptools
import httpx
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from crawler.http.bodies import BodyError, BoundedDecoder, content_coding
from crawler.http.egress import Egress, ProxyFailed, Unanswered, carry
from crawler.http.proxies import Proxy
from crawler.http.tunnel import proxy_authorization, proxy_socket
from crawler.web.memo import Memo

# The status line and headers of an answer: a server that sends more is not one we download from.
MAX_HEAD = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Headers that describe an encoded body on the wire; dropped once the body is decoded.
_WIRE_HEADERS = frozenset((b"content-encoding", b"content-length"))
# Where a head ends when its line ends may be bare LFs.
_HEAD_END = re.compile(rb"\n\r?\n")
# Fields whose folded value could frame the body differently for a parser that does not unfold.
_FRAMING = frozenset((b"content-length", b"transfer-encoding"))
_OWS = frozenset(b" \t")
# SHOUTcast's status line names this protocol; it is HTTP/1.0 otherwise (see the module's note).
_ICY, _AS_HTTP = b"ICY ", b"HTTP/1.0 "

# (connect, read, pool, total) in seconds, each None for no limit.
Timeouts = tuple[float | None, float | None, float | None, float | None]
RawHeaders = tuple[tuple[bytes, bytes], ...]


class Body(Protocol):
    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Answer:
    """An answer as a page fetch or a download reads it: status, headers (case-insensitive ``get``), extensions,
    body stream. httpx.Response offers the same names, so the downloader reads either. The headers are built from
    the raw ones when first asked for: a page fetch reads the raw ones only."""

    __slots__ = ("_headers", "extensions", "raw_headers", "status_code", "stream")

    def __init__(self, status_code: int, raw_headers: RawHeaders, extensions: dict[str, Any], stream: Body,
                 headers: CIMultiDictProxy[str] | None = None) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.extensions = extensions
        self.stream = stream
        self._headers = headers

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        headers = self._headers
        if headers is None:
            headers = self._headers = CIMultiDictProxy(CIMultiDict(     # from a list: faster than a generator
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]))
        return headers

    async def aclose(self) -> None:
        await self.stream.aclose()


def body_coding(raw: RawHeaders, extensions: dict[str, Any]) -> tuple[str, RawHeaders]:
    """The Content-Encoding the body is decoded from (bodies.py; BodyError for a stack it refuses), and the raw
    headers as handed out with the decoded body: without the ones that described the wire. The coding taken off
    is the ``content_encoding`` extension."""
    # Every Content-Encoding line counts: "gzip" twice is the same stack as "gzip, gzip".
    named = [v for k, v in raw if len(k) == 16 and k.lower() == b"content-encoding"]
    if not named:
        return "", raw
    coding = content_coding(",".join(v.decode("latin-1") for v in named))
    extensions["content_encoding"] = coding
    if coding:
        raw = tuple((k, v) for k, v in raw if k.lower() not in _WIRE_HEADERS)
    return coding, raw


def unfold_head(head: bytes) -> bytes:
    """A head (through its empty line) as RFC 9112 lets a user agent read it: CRLF line ends where there were bare
    LFs, each folded line joined to its field with one space. RemoteProtocolError for a fold before the first field
    (nothing to continue) or of a framing field (Content-Length, Transfer-Encoding), which a parser that does not
    unfold would frame differently."""
    lines: list[bytes] = []
    for line in head.split(b"\n"):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line[:1] in (b" ", b"\t") and line.strip(b" \t"):
            if len(lines) < 2:
                raise httpx.RemoteProtocolError("the answer's head folds its status line")
            field = lines[-1]
            if field.split(b":", 1)[0].strip().lower() in _FRAMING:
                raise httpx.RemoteProtocolError("the answer folds its framing header: "
                                                f"{field[:60].decode('latin-1')!r}")
            lines[-1] = field.rstrip(b" \t") + b" " + line.strip(b" \t")
        elif line[:1] in (b" ", b"\t"):
            continue        # a fold of nothing but blanks adds nothing to its field
        else:
            lines.append(line)
    return b"\r\n".join(lines)


def header_list(headers: httpx.Headers) -> list[tuple[str, str]]:
    """A client's headers as a request sends them: names as written (User-Agent, not user-agent), as browsers
    and httpx's own transport send them (Headers.items() would give them in lower case)."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw]


def parse_url(url: str) -> yarl.URL:
    """The URL a GET of this client takes; httpx.InvalidURL when it is not one."""
    try:
        return yarl.URL(url)
    except (ValueError, TypeError) as exc:
        raise httpx.InvalidURL(str(exc)[:200]) from None


Resolve = Callable[[str, int], Awaitable[Sequence[Mapping[str, Any]]]]
_Key = tuple[str, str, int, Proxy | None]     # scheme, host, port, the proxy it goes through (None: direct)


class _Connection(asyncio.Protocol):
    """One connection and the answer being read on it; the pool's unit. Callbacks from the loop fill it, the
    request's coroutine waits on it."""

    def __init__(self, key: _Key, loop: asyncio.AbstractEventLoop) -> None:
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self.high_water = 1 << 20
        self._begin()

    def _begin(self) -> None:
        self.raw: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.head_bytes = 0
        self.head_done = False
        self.head_in: list[bytes] = []    # this answer's reads until its head is in: replayed if llhttp refuses it
        self.opening: bytes | None = b""  # the answer's first bytes, until they tell whether it is ICY's
        self.icy = False                  # the status line said ICY (read as HTTP/1.0)
        self.held: bytearray | None = None    # while replaying: the head so far, waiting for its end
        self.framing = 0                  # bytes read since the last body bytes: chunk lines and trailers
        self.coding = b""                 # a transfer coding other than chunked and identity
        self.done = False                 # the answer's body ended where its framing said
        self.keep_alive = False           # and both sides let the connection carry another
        self.to_eof = False               # the body ends where the connection does (no length, not chunked)
        self.informational = False
        self.extra = False                # bytes came after the answer's end
        self.received = 0                 # bytes of this answer seen on the wire
        self.pieces: list[bytes] = []
        self.buffered = 0
        self.paused = False
        self.error: httpx.TransportError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.last_data = self.loop.time()

    # -- the loop's callbacks ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport      # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.done:
            # Bytes after the answer's end, or on an idle connection: nothing we asked for. Never reuse it.
            self.close()
            return
        self.received += len(data)
        self.last_data = self.loop.time()
        if self.opening is not None:
            data = self._protocol_name(data)
            if not data:
                return
        if self.head_done:
            self.framing += len(data)     # on_body sets it back to 0
        else:
            self.head_in.append(data)
        self._parse(data)
        if self.extra:
            self.close()
        elif not self.head_done and self.error is None:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD:
                self._fail(httpx.RemoteProtocolError(f"the answer's head is over {MAX_HEAD} bytes"))
        elif self.framing > MAX_HEAD and self.error is None and not self.done:
            # Trailers are dropped, but llhttp's binding gathers a field before handing it over: bound it.
            self._fail(httpx.RemoteProtocolError(f"over {MAX_HEAD} bytes of chunk lines or trailers"))

    def _protocol_name(self, data: bytes) -> bytes:
        """The answer's first bytes, with SHOUTcast's ``ICY `` renamed ``HTTP/1.0 ``; nothing (held) while the
        bytes so far could still be the start of ``ICY ``, so a status line split anywhere is read the same."""
        opening = (self.opening or b"") + data
        if len(opening) < len(_ICY) and _ICY.startswith(opening):
            self.opening = opening
            return b""
        self.opening = None
        if opening.startswith(_ICY):
            self.icy = True
            return _AS_HTTP + opening[len(_ICY):]
        return opening

    def _parse(self, data: bytes) -> None:
        try:
            if self.held is None:
                self.parser.feed_data(data)
            else:
                self._replay(data)
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            if (self.head_done or self.held is not None or self.error is not None
                    or b"".join(self.head_in[:8])[:7] != b"HTTP/1."):      # not HTTP at all: no waiting for more
                self._fail(httpx.RemoteProtocolError(f"not an HTTP answer: {str(exc)[:200]}"))
                return
            # llhttp refused the head: read the answer again from its first byte, its heads normalised.
            self.parser = httptools.HttpResponseParser(self)     # llhttp stays failed once it failed
            self.raw = []
            self.informational = False
            self.held = bytearray()
            for piece in self.head_in:
                self._parse(piece)
        except httpx.RemoteProtocolError as exc:         # unfold_head's refusals
            self._fail(exc)

    def _replay(self, data: bytes) -> None:
        """One read of a head being normalised: held until its end, which may fall between two reads; what
        follows the final head (the body) goes to the parser as it came, never copied."""
        view = memoryview(data)
        while self.held is not None and view and self.error is None:
            held = self.held
            tail, start = bytes(held[-2:]), view[:2].tobytes()      # an end split between two reads
            if tail[-1:] == b"\n" and start[:1] == b"\n":
                end = 1
            elif tail[-1:] == b"\n" and start == b"\r\n":
                end = 2
            elif tail == b"\n\r" and start[:1] == b"\n":
                end = 1
            else:
                found = _HEAD_END.search(view)
                if found is None:
                    held += view
                    return
                end = found.end()
            held += view[:end]
            view = view[end:]
            self.held = bytearray()
            self.parser.feed_data(unfold_head(bytes(held)))
            if self.head_done:                # the final answer's head, not a 1xx one
                self.held = None
                if view:
                    self.parser.feed_data(view)

    def eof_received(self) -> bool | None:
        return None      # close our side too: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done:
            return
        if self.head_done and self.to_eof and exc is None and self.error is None:
            # A body without a length ends with its connection; not with a close of our own making (a timeout,
            # a refusal), whose error stands: the body was cut, not whole.
            self.done = True
        elif self.error is None:
            if not self.head_done:
                self.error = httpx.RemoteProtocolError("the server closed the connection without answering")
            else:
                self.error = httpx.ReadError(f"the connection broke after {self.received} bytes of the answer"
                                             + (f": {exc}" if exc else ""))
        self._wake()

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass

    # -- the parser's callbacks -------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            self.extra = True       # a second answer to one request: nothing of it is read

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.head_done:            # after the head: trailer fields, never headers
            if value and value[-1] in _OWS:
                value = value.rstrip(b" \t")     # llhttp keeps a value's trailing blanks; they are not part of it
            self.raw.append((name, value))

    def on_headers_complete(self) -> None:
        if self.done:
            return
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.informational = True     # 100 Continue and the like: the answer proper follows
            self.raw = []
            return
        if self.head_bytes + sum(len(k) + len(v) for k, v in self.raw) > MAX_HEAD:
            # The head's end came in the same read as its bulk (the count below covers reads before the end).
            self._fail(httpx.RemoteProtocolError(f"the answer's head is over {MAX_HEAD} bytes"))
            return
        length, coding = False, b""
        for k, v in self.raw:
            if len(k) == 17 and k.lower() == b"transfer-encoding":
                coding = coding + b"," + v if coding else v
            elif len(k) == 14:
                length = length or k.lower() == b"content-length"
        if coding == b"chunked":          # nearly every Transfer-Encoding: no list to make of it
            self.to_eof = False
        elif coding:
            if not self._transfer_coding(coding):
                return
        else:
            self.to_eof = not length
        self.status = status
        self.head_done = True
        self.head_in = []
        self._wake()

    def _transfer_coding(self, header: bytes) -> bool:
        """The body's framing from Transfer-Encoding (llhttp has refused it with a Content-Length already):
        chunked once and last, or to the connection's close for any other coding (RFC 9112, 6.3). False, the
        answer failed, when chunked comes twice or before another coding: llhttp would read those to the close,
        which is where parsers disagree on an answer's end."""
        codings = [c for c in (part.strip(b" \t").lower() for part in header.split(b",")) if c]
        chunked = codings.count(b"chunked")
        if chunked > 1 or (chunked and codings[-1] != b"chunked"):
            self._fail(httpx.RemoteProtocolError(
                f"Transfer-Encoding {header[:80].decode('latin-1')!r}: chunked must come once, last"))
            return False
        self.to_eof = not chunked
        self.coding = b", ".join(c for c in codings if c not in (b"chunked", b"identity"))
        return True

    def on_body(self, body: bytes) -> None:
        if self.done:
            return
        self.framing = 0
        self.pieces.append(body)
        self.buffered += len(body)
        if self.buffered > self.high_water and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.done:
            return
        if self.informational:
            self.informational = False
            return
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()   # asked now: once the callback returns, it has reset
        self._wake()

    # -- the request's side -----------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def send(self, request: bytes, read_size: int) -> None:
        assert self.transport is not None
        if self.paused:        # the last answer ended while its reader was behind: read again
            self.transport.resume_reading()
        self._begin()
        self.high_water = read_size
        self.transport.write(request)

    async def wait(self, read_timeout: float | None, deadline: float | None) -> None:
        """Until the loop's callbacks have something new, or the timeouts say the server took too long."""
        loop = self.loop
        self.waiter = waiter = loop.create_future()
        timer = self._arm(waiter, read_timeout, deadline)
        try:
            await waiter
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()

    def _arm(self, waiter: asyncio.Future[None], read_timeout: float | None,
             deadline: float | None) -> asyncio.TimerHandle | None:
        at = None if read_timeout is None else self.last_data + read_timeout
        if deadline is not None and (at is None or deadline < at):
            at = deadline
        if at is None:
            return None
        return self.loop.call_at(at, self._timed_out, waiter, read_timeout, deadline)

    def _timed_out(self, waiter: asyncio.Future[None], read_timeout: float | None, deadline: float | None) -> None:
        if waiter.done():
            return
        now = self.loop.time()
        if deadline is not None and now >= deadline:
            self._fail(httpx.ReadTimeout("the download's exchange took longer than its total timeout"))
        elif read_timeout is not None and now - self.last_data >= read_timeout:
            self._fail(httpx.ReadTimeout(f"no data for {read_timeout:g} s"))
        else:     # bytes came meanwhile that did not wake the reader (a head in many pieces): wait on
            self._arm(waiter, read_timeout, deadline)

    def take(self) -> list[bytes]:
        pieces, self.pieces, self.buffered = self.pieces, [], 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return pieces

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Stream:
    """The body of one answer, as the downloader iterates it; gives the connection back when it is done."""

    __slots__ = ("_client", "_conn", "_deadline", "_decoder", "_read_timeout", "_released")

    def __init__(self, client: Http1Client, conn: _Connection, decoder: BoundedDecoder,
                 read_timeout: float | None, deadline: float | None) -> None:
        self._client, self._conn, self._decoder = client, conn, decoder
        self._read_timeout, self._deadline = read_timeout, deadline
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn, feed = self._conn, self._decoder.feed
        while True:
            if conn.pieces:
                for piece in conn.take():
                    out = feed(piece)
                    if out:
                        yield out
                    if self._decoder.full:
                        return
                continue
            if conn.done:
                return
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._read_timeout, self._deadline)

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._client._release(self._conn)


class Http1Client:
    def __init__(self, resolve: Resolve, *, max_idle_per_host: int = 8, max_idle: int = 64,
                 keepalive: float = 15.0, ssl_context: ssl.SSLContext | None = None,
                 egress: Egress | None = None, check_literal: Callable[[str, int], None] | None = None) -> None:
        """resolve(host, port) gives the addresses that host may be reached at (targets.ResolveResult
        dicts: "host", "port", "family"), or raises (TargetRefused, or a DNS error) for none.

        egress: the proxies that apply to a host (its ``route``) and their health; a request through a proxy
        is judged by ``check_literal`` alone (an IP literal the policy refuses is refused), as the proxy, not
        this node, resolves a name: the policy cannot see the address a name reaches through a proxy."""
        self._resolve = resolve
        self._egress = egress
        self._check_literal = check_literal
        self._idle: dict[_Key, list[_Connection]] = {}
        self._lru: OrderedDict[_Connection, None] = OrderedDict()     # every idle connection, oldest first
        self._max_idle_per_host, self._max_idle, self._keepalive = max_idle_per_host, max_idle, keepalive
        self._ssl = ssl_context
        self._closed = False

    async def get(self, url: yarl.URL, headers: list[tuple[str, str]], *, timeout: Timeouts, max_body: int,
                  read_size: int, cut: bool = False) -> Answer:
        """GET url; the answer once its head is in. timeout: (connect, read, pool, total) seconds; max_body caps
        the decoded body (past it BodyError, or with ``cut`` the body simply ends, one byte past the cap so the
        reader can tell); read_size bounds the bytes waiting for the reader."""
        scheme, host = url.scheme, url.raw_host
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"the URL's scheme is {scheme!r}, not http or https")
        if not host:
            raise httpx.UnsupportedProtocol("the URL has no host")
        port = url.port or _DEFAULT_PORTS[scheme]
        egress = self._egress
        if egress is not None and egress.route is not None:     # one attribute read when no proxy applies
            proxies = egress.route(host, port)
            if proxies:
                return await self._proxied(egress, proxies, url, headers, scheme, host, port, timeout, max_body,
                                           read_size, cut)
        return await self._exchange((scheme, host, port, None), _request(url, headers), timeout, max_body,
                                    read_size, cut)

    async def _proxied(self, egress: Egress, proxies: Sequence[Proxy], url: yarl.URL,
                       headers: list[tuple[str, str]], scheme: str, host: str, port: int, timeout: Timeouts,
                       max_body: int, read_size: int, cut: bool) -> Answer:
        """The GET through the proxies that apply to this host, failing over as egress.carry does."""
        if self._check_literal is not None:
            self._check_literal(host, port)

        async def send(proxy: Proxy) -> Answer:
            absolute = proxy.scheme == "http" and scheme == "http"
            request = _request(url, headers, proxy if absolute else None)
            answer = await self._exchange((scheme, host, port, proxy), request, timeout, max_body, read_size, cut)
            if absolute and answer.status_code == 407:
                await answer.aclose()
                raise ProxyFailed(proxy, "407: the proxy wants (other) credentials")
            return answer

        return await carry(egress, f"{host}:{port}", proxies, send, asyncio.get_running_loop().time)

    async def _exchange(self, key: _Key, request: bytes, timeout: Timeouts, max_body: int, read_size: int,
                        cut: bool) -> Answer:
        loop = asyncio.get_running_loop()
        connect_timeout, read_timeout, _, total = timeout
        deadline = None if total is None else loop.time() + total
        while True:
            conn = self._pooled(key, loop)
            fresh = conn is None
            if conn is None:
                conn = await self._connect(key, loop, connect_timeout)
            try:
                conn.send(request, read_size)
                while not conn.head_done and conn.error is None:
                    await conn.wait(read_timeout, deadline)
            except BaseException:
                conn.close()
                raise
            if conn.error is None:
                return self._answer(conn, max_body, cut, read_timeout, deadline)
            conn.close()
            if conn.received == 0 and not isinstance(conn.error, httpx.TimeoutException):
                if not fresh:
                    continue          # the server had closed the idle connection: once more on a new one
                if key[3] is not None:
                    raise Unanswered(conn.error)   # through another proxy (egress.carry)
            raise conn.error

    def _answer(self, conn: _Connection, max_body: int, cut: bool, read_timeout: float | None,
                deadline: float | None) -> Answer:
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if conn.icy:
            extensions["icy"] = True
        try:
            if conn.coding:
                raise BodyError(f"unsupported transfer coding {conn.coding[:40].decode('latin-1')!r}")
            coding, raw = body_coding(tuple(conn.raw), extensions)
        except BodyError:
            conn.close()
            raise
        decoder = BoundedDecoder(coding, max_body, cut=cut)
        return Answer(conn.status, raw, extensions, _Stream(self, conn, decoder, read_timeout, deadline))

    def _pooled(self, key: _Key, loop: asyncio.AbstractEventLoop) -> _Connection | None:
        idle = self._idle.get(key)
        now = loop.time()
        while idle:
            conn = idle.pop()
            del self._lru[conn]
            if not idle:
                del self._idle[key]
            if not conn.closed and now - conn.idle_since < self._keepalive:
                return conn
            conn.close()
        return None

    async def _connect(self, key: _Key, loop: asyncio.AbstractEventLoop,
                       connect_timeout: float | None) -> _Connection:
        scheme, host, port, proxy = key
        tls: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            tls = self._ssl
        if proxy is not None:
            return await self._connect_through(proxy, key, loop, connect_timeout, tls)
        error: Exception | None = None
        try:
            async with asyncio.timeout(connect_timeout):
                addresses = await self._resolve(host, port)
                for address in addresses:
                    try:
                        _, conn = await loop.create_connection(
                            lambda: _Connection(key, loop), address["host"], address["port"],
                            family=address.get("family", socket.AF_INET), ssl=tls,
                            server_hostname=host if tls is not None else None)
                        return conn
                    except (OSError, ssl.SSLError) as exc:
                        error = exc
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} took over {connect_timeout} s") from None
        except OSError as exc:       # DNS (getaddrinfo raises OSError subclasses)
            raise httpx.ConnectError(f"{host}:{port}: {exc}") from None
        raise httpx.ConnectError(f"cannot connect to {host}:{port}: {error or 'no address'}")

    async def _connect_through(self, proxy: Proxy, key: _Key, loop: asyncio.AbstractEventLoop,
                               connect_timeout: float | None, tls: ssl.SSLContext | None) -> _Connection:
        """A connection to the origin through the proxy: to the proxy itself for an http URL through an HTTP
        proxy (absolute-form requests), else a tunnel (CONNECT, SOCKS5) with TLS over it for https. A failure
        before the origin is reached is the proxy's (ProxyFailed); TLS with the origin is the origin's."""
        scheme, host, port, _ = key
        sock = await proxy_socket(proxy, host, port, connect_timeout,
                                  tunnel=not (proxy.scheme == "http" and scheme == "http"))
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(key, loop), sock=sock, ssl=tls,
                                                       server_hostname=host if tls is not None else None)
            return conn
        except TimeoutError:
            sock.close()
            raise httpx.ConnectTimeout(f"TLS with {host}:{port} through {proxy.label} took over "
                                       f"{connect_timeout} s") from None
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise httpx.ConnectError(f"cannot connect to {host}:{port} through {proxy.label}: {exc}") from None

    def _release(self, conn: _Connection) -> None:
        if self._closed or not conn.reusable():
            conn.close()
            return
        conn.idle_since = conn.loop.time()
        idle = self._idle.setdefault(conn.key, [])
        idle.append(conn)
        self._lru[conn] = None
        if len(idle) > self._max_idle_per_host:
            self._drop(idle[0])
        while len(self._lru) > self._max_idle:
            self._drop(next(iter(self._lru)))

    def _drop(self, conn: _Connection) -> None:
        del self._lru[conn]
        idle = self._idle[conn.key]
        idle.remove(conn)
        if not idle:
            del self._idle[conn.key]
        conn.close()

    def idle(self) -> int:
        """Connections waiting in the pool."""
        return len(self._lru)

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._lru):
            conn.close()
        self._idle.clear()
        self._lru.clear()


def sent_headers(url: yarl.URL, headers: list[tuple[str, str]]) -> RawHeaders:
    """The header fields ``get`` sends for these headers, in its order (Host first, a caller's Host dropped):
    what the archive records as sent."""
    host = url.host_port_subcomponent or ""
    key = tuple(headers)
    fields = _SENT_FIELDS.get(key)
    if fields is None:
        fields = _SENT_FIELDS.keep(key, tuple(
            (name.encode("latin-1", "replace"), value.encode("latin-1", "replace"))
            for name, value in headers if name.lower() != "host"))
    return ((b"Host", host.encode("latin-1", "replace")),) + fields


def _request(url: yarl.URL, headers: list[tuple[str, str]], proxy: Proxy | None = None) -> bytes:
    """The request's bytes; through an HTTP proxy (``proxy``, for an http URL) in absolute form, with the
    proxy's credentials."""
    if proxy is None:
        start = f"GET {url.raw_path_qs or '/'} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"
    else:
        target = f"http://{url.host_port_subcomponent}{url.raw_path_qs or '/'}"
        start = f"GET {target} HTTP/1.1\r\nHost: {url.host_port_subcomponent}\r\n"
        auth = proxy_authorization(proxy)
        if auth is not None:
            start += f"Proxy-Authorization: {auth}\r\n"
    # A client sends the same headers on nearly every request: their lines are made once.
    key = tuple(headers)
    fields = _FIELD_LINES.get(key)
    if fields is None:
        fields = _FIELD_LINES.keep(key, _field_lines(headers))
    try:
        return start.encode("latin-1") + fields
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("a header is not Latin-1") from None


def _field_lines(headers: list[tuple[str, str]]) -> bytes:
    """A request's header lines after Host (a caller's Host is dropped), and the empty line that ends its head."""
    lines = []
    for name, value in headers:
        if name.lower() == "host":
            continue
        line = f"{name}: {value}\r\n"
        if "\r" in line[:-2] or "\n" in line[:-2]:
            raise httpx.LocalProtocolError(f"the {name[:50]!r} header holds a line break")
        lines.append(line)
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise httpx.LocalProtocolError("a header is not Latin-1") from None


# Header lists as a client sends them -> their lines (_field_lines), and their fields as the archive records them.
_FIELD_LINES: Memo[tuple[tuple[str, str], ...], bytes] = Memo(256)
_SENT_FIELDS: Memo[tuple[tuple[str, str], ...], RawHeaders] = Memo(256)
