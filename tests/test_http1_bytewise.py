"""The lean HTTP/1.1 client's reading of answers (crawler/http/http1.py), one byte a read and in random splits.

As h11's tests do, every answer is fed to the connection whole, one byte at a time and in seeded random pieces,
and must read the same however the reads fall: status line, headers, Content-Length and chunked bodies (chunk
extensions, trailers), answers to the connection's close, a second answer on a kept-alive connection, a close
before the end, and malformed input, each refused with its own clear error. The connection is driven through its
protocol callbacks (data_received, connection_lost: no socket); the last tests go through the client and a loopback
server that writes one byte at a time.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import yarl

from crawler.http import http1

SEEDS = range(6)
SPLITS = ["whole", "bytewise"] + [f"random{seed}" for seed in SEEDS]


def pieces(data: bytes, split: str) -> Iterator[bytes]:
    """The reads one answer arrives in: all at once, one byte each, or random sizes (seeded, 1 to 23 bytes)."""
    if split == "whole":
        yield data
    elif split == "bytewise":
        yield from (data[i:i + 1] for i in range(len(data)))
    else:
        rng = random.Random(int(split.removeprefix("random")))
        i = 0
        while i < len(data):
            n = rng.randint(1, 23)
            yield data[i:i + n]
            i += n


class _Transport:
    """Enough of an asyncio transport for a connection fed by hand: what was written, and whether it was cut."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@dataclass(frozen=True)
class Read:
    """What the connection made of the bytes fed so far."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    done: bool              # the answer ended where its framing said (or with the close, for one to the close)
    reusable: bool          # the connection may carry another request
    error: str | None       # the error's type and message


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def connection(loop: asyncio.AbstractEventLoop) -> tuple[http1._Connection, _Transport]:
    conn = http1._Connection(("http", "h", 80), loop)
    transport = _Transport()
    conn.transport = transport       # type: ignore[assignment]
    return conn, transport


def read(conn: http1._Connection) -> Read:
    error = None if conn.error is None else f"{type(conn.error).__name__}: {conn.error}"
    return Read(conn.status, list(conn.raw), b"".join(conn.take()), conn.done, conn.reusable(), error)


def feed(loop: asyncio.AbstractEventLoop, reply: bytes, split: str, *, close: bool = False,
         exc: Exception | None = None) -> Read:
    """One answer fed to a fresh connection in the given reads; then, if asked, the connection's close."""
    conn, _ = connection(loop)
    for piece in pieces(reply, split):
        conn.data_received(piece)
    if close:
        conn.connection_lost(exc)
    return read(conn)


def ok(body: bytes, headers: list[tuple[bytes, bytes]], *, status: int = 200, reusable: bool = True) -> Read:
    return Read(status, headers, body, True, reusable, None)


# -- well-formed answers: the same whatever the reads -------------------------------------------------------------

CL = b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\nContent-Length: 11\r\n\r\nhello world"
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
           b"5;name=value\r\nhello\r\n"                 # a chunk extension
           b"1;a=b;quoted=\"x;y\"\r\n \r\n"              # several, one quoted with a ';' inside
           b"A\r\n0123456789\r\n"                       # hex, upper case
           b"b\r\nabcdefghijk\r\n"                      # hex, lower case
           b"0;last=yes\r\nX-Sum: 42\r\nContent-Encoding: gzip\r\n\r\n")     # trailers: never headers
WELL_FORMED = [
    ("content-length", CL, ok(b"hello world", [(b"Content-Type", b"audio/mpeg"), (b"Content-Length", b"11")])),
    ("chunked", CHUNKED, ok(b"hello 0123456789abcdefghijk",
                            [(b"Transfer-Encoding", b"chunked"), (b"Trailer", b"X-Sum")])),
    ("empty-chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     ok(b"", [(b"Transfer-Encoding", b"chunked")])),
    ("no-reason", b"HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n", ok(b"", [(b"Content-Length", b"0")], status=404)),
    ("long-reason", b"HTTP/1.1 503 Service Unavailable: try later\r\nContent-Length: 2\r\n\r\nno",
     ok(b"no", [(b"Content-Length", b"2")], status=503)),
    ("204-no-body", b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n", ok(b"", [(b"X-A", b"1")], status=204)),
    ("304-length-is-not-a-body", b"HTTP/1.1 304 Not Modified\r\nETag: \"v\"\r\nContent-Length: 500\r\n\r\n",
     ok(b"", [(b"ETag", b'"v"'), (b"Content-Length", b"500")], status=304)),
    ("headers", b"HTTP/1.1 200 OK\r\nx-lower: a\r\nX-MiXeD: b\r\nX-Ows:   spaced out \t \r\nX-Empty:\r\n"
                b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 1\r\n\r\n!",
     ok(b"!", [(b"x-lower", b"a"), (b"X-MiXeD", b"b"), (b"X-Ows", b"spaced out"), (b"X-Empty", b""),
               (b"Set-Cookie", b"a=1"), (b"Set-Cookie", b"b=2"), (b"Content-Length", b"1")])),
    ("connection-close", b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
     ok(b"hi", [(b"Connection", b"close"), (b"Content-Length", b"2")], reusable=False)),
    ("http10-keep-alive", b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
     ok(b"hi", [(b"Connection", b"keep-alive"), (b"Content-Length", b"2")])),
    ("http10-length", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
     ok(b"hi", [(b"Content-Length", b"2")], reusable=False)),
    ("1xx-first", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
                  b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", ok(b"hi", [(b"Content-Length", b"2")])),
]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("reply, expected", [c[1:] for c in WELL_FORMED], ids=[c[0] for c in WELL_FORMED])
def test_an_answer_reads_the_same_however_its_bytes_arrive(loop, reply, expected, split):
    assert feed(loop, reply, split) == expected


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("reply", [CL, CHUNKED], ids=["content-length", "chunked"])
def test_an_answer_ends_at_its_last_byte_and_not_before(loop, reply, split):
    conn, _ = connection(loop)
    fed = 0
    for piece in pieces(reply, split):
        assert not conn.done and conn.error is None, f"ended after {fed} of {len(reply)} bytes"
        conn.data_received(piece)
        fed += len(piece)
    assert conn.done and conn.reusable()


@pytest.mark.parametrize("split", SPLITS)
def test_the_head_is_in_once_its_empty_line_is_and_the_body_comes_as_it_arrives(loop, split):
    head, body = CL[:CL.index(b"\r\n\r\n") + 4], CL[CL.index(b"\r\n\r\n") + 4:]
    conn, _ = connection(loop)
    for piece in pieces(head[:-1], split):
        conn.data_received(piece)
    assert not conn.head_done and conn.status == 0
    conn.data_received(head[-1:])
    assert conn.head_done and conn.status == 200
    got = b""
    for piece in pieces(body, split):
        conn.data_received(piece)
        got += b"".join(conn.take())
        assert body.startswith(got) and len(got) >= 1      # every byte handed out at once, in order
    assert got == body


@pytest.mark.parametrize("split", SPLITS)
def test_an_answer_without_a_length_ends_with_the_connection(loop, split):
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\n\r\n" + bytes(range(256)) * 4
    conn, _ = connection(loop)
    for piece in pieces(reply, split):
        conn.data_received(piece)
    assert not conn.done
    conn.connection_lost(None)
    assert read(conn) == Read(200, [(b"Content-Type", b"audio/mpeg")], bytes(range(256)) * 4, True, False, None)


# -- internet radio: SHOUTcast's ICY status line --------------------------------------------------------------------

ICY = (b"ICY 200 OK\r\nicy-notice1:<BR>This stream requires Winamp<BR>\r\nicy-name:Loopback FM\r\n"
       b"icy-br:128\r\ncontent-type:audio/mpeg\r\nicy-metaint:16\r\n\r\n" + bytes(range(256)) * 4)
ICY_HEADERS = [(b"icy-notice1", b"<BR>This stream requires Winamp<BR>"), (b"icy-name", b"Loopback FM"),
               (b"icy-br", b"128"), (b"content-type", b"audio/mpeg"), (b"icy-metaint", b"16")]


@pytest.mark.parametrize("split", SPLITS)
def test_an_icy_answer_reads_as_http10_without_a_length_however_its_bytes_arrive(loop, split):
    conn, _ = connection(loop)
    body = b""
    for piece in pieces(ICY, split):
        conn.data_received(piece)
        body += b"".join(conn.take())
        assert conn.error is None and not conn.done       # a station's body has no end but the close
    assert conn.head_done and conn.icy
    conn.connection_lost(None)
    got = read(conn)
    assert got == Read(200, ICY_HEADERS, b"", True, False, None)
    assert body == bytes(range(256)) * 4


@pytest.mark.parametrize("split", SPLITS)
def test_an_icy_answer_is_read_only_while_its_framing_is_strict(loop, split):
    got = feed(loop, b"ICY 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", split)
    assert got.error is not None and got.error.startswith(NOT_HTTP)
    # A length, when one is given, frames the body as in any answer.
    got = feed(loop, b"ICY 200 OK\r\nContent-Length: 2\r\n\r\nhi", split)
    assert got == Read(200, [(b"Content-Length", b"2")], b"hi", True, False, None)


def test_an_http_answer_is_not_taken_for_icy(loop):
    conn, _ = connection(loop)
    for piece in pieces(CL, "bytewise"):
        conn.data_received(piece)
    assert conn.done and not conn.icy


def test_a_timeout_on_an_answer_without_a_length_is_an_error_not_its_end(loop):
    # The close a timeout makes (the transport aborted, then connection_lost without an error) must not read as
    # the end of a body that ends with its connection: a stalled station, or a file sent without a length.
    for reply in (ICY, b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\n\r\npartial"):
        conn, transport = connection(loop)
        conn.data_received(reply)
        conn._fail(httpx.ReadTimeout("no data"))
        conn.connection_lost(None)
        got = read(conn)
        assert not got.done and got.error == "ReadTimeout: no data" and transport.aborted


@pytest.mark.parametrize("split", ["bytewise", "whole"])
def test_a_close_in_the_middle_of_the_icy_protocol_name_is_no_answer(loop, split):
    for cut in range(1, 4):
        got = feed(loop, b"ICY"[:cut], split, close=True)
        assert got.error == "RemoteProtocolError: the server closed the connection without answering"


# -- keep-alive ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("split", SPLITS)
def test_a_kept_alive_connection_reads_a_second_answer_after_the_first(loop, split):
    conn, transport = connection(loop)
    answers = [(CL, b"hello world"), (CHUNKED, b"hello 0123456789abcdefghijk"),
               (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", b"")]
    for i, (reply, body) in enumerate(answers):
        conn.send(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i, 1 << 20)
        for piece in pieces(reply, split):
            conn.data_received(piece)
        got = read(conn)
        assert (got.body, got.done, got.reusable, got.error) == (body, True, True, None)
    assert [r.split(b" ")[1] for r in transport.written] == [b"/0", b"/1", b"/2"]
    assert not transport.aborted


@pytest.mark.parametrize("split", SPLITS)
def test_bytes_after_the_answer_keep_the_connection_out_of_the_pool(loop, split):
    # A second answer to one request (or a smuggled one): the connection is cut, never reused.
    conn, transport = connection(loop)
    for piece in pieces(CL + b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", split):
        conn.data_received(piece)
    got = read(conn)
    assert got.body == b"hello world" and not got.reusable and transport.aborted


# -- a close before the end ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("reply", [CL, CHUNKED], ids=["content-length", "chunked"])
def test_a_close_before_the_end_keeps_every_byte_read_and_says_where(loop, reply, split):
    start = reply.index(b"\r\n\r\n") + 4
    whole = feed(loop, reply, "whole").body
    for cut in range(1, len(reply)):
        got = feed(loop, reply[:cut], split, close=True)
        assert not got.done and not got.reusable
        if cut < start:
            assert got.error == "RemoteProtocolError: the server closed the connection without answering"
        else:
            assert got.error == f"ReadError: the connection broke after {cut} bytes of the answer"
            assert whole.startswith(got.body)     # what came before the cut, to resume after


def test_a_reset_is_named_in_the_error(loop):
    got = feed(loop, CL[:-3], "bytewise", close=True, exc=ConnectionResetError("reset by peer"))
    assert got.body == b"hello wo"
    assert got.error == f"ReadError: the connection broke after {len(CL) - 3} bytes of the answer: reset by peer"


def test_a_connection_reset_cuts_an_answer_without_a_length(loop):
    reply = b"HTTP/1.1 200 OK\r\n\r\npartial"
    got = feed(loop, reply, "bytewise", close=True, exc=ConnectionResetError("reset"))
    assert not got.done and got.error is not None and got.error.startswith("ReadError")


# -- malformed answers: refused, each with its own clear error -----------------------------------------------------

NOT_HTTP = "RemoteProtocolError: not an HTTP answer: "
MALFORMED = [
    ("ssh-banner", b"SSH-2.0-OpenSSH_9.6\r\n", NOT_HTTP),
    ("html-without-head", b"<html><body>hi</body></html>\r\n\r\n", NOT_HTTP),
    ("http2-preface", b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64\r\n\r\n", NOT_HTTP),
    ("status-not-a-number", b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n", NOT_HTTP),
    ("status-too-short", b"HTTP/1.1 20 OK\r\nContent-Length: 0\r\n\r\n", NOT_HTTP),
    ("version-unknown", b"HTTP/1.7 200 OK\r\nContent-Length: 0\r\n\r\n", NOT_HTTP),
    ("space-in-field-name", b"HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 0\r\n\r\n", NOT_HTTP),
    ("space-before-colon", b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nhi", NOT_HTTP),
    ("length-not-a-number", b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\nh", NOT_HTTP),
    ("length-negative", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", NOT_HTTP),
    ("two-lengths", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", NOT_HTTP),
    ("length-and-chunked", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"2\r\nhi\r\n0\r\n\r\n", NOT_HTTP),
    ("chunked-twice", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
     "RemoteProtocolError: Transfer-Encoding 'chunked, chunked': chunked must come once, last"),
    ("chunked-not-last", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nhi",
     "RemoteProtocolError: Transfer-Encoding 'chunked, gzip': chunked must come once, last"),
    ("chunk-size-not-hex", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhi\r\n0\r\n\r\n",
     NOT_HTTP),
    ("chunk-without-crlf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiX\r\n0\r\n\r\n",
     NOT_HTTP),
    # A framing field among the trailers (RFC 9110 6.5.1 forbids them there): llhttp refuses the answer.
    ("length-in-trailers", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n"
                           b"Content-Length: 2\r\n\r\n", NOT_HTTP),
    ("chunk-bare-lf", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\nhi\n0\n\n", NOT_HTTP),
    ("folded-length", b"HTTP/1.1 200 OK\r\nContent-Length:\r\n 2\r\n\r\nhi",
     "RemoteProtocolError: the answer folds its framing header: 'Content-Length:'"),
    ("folded-status-line", b"HTTP/1.1 200 OK\r\n folded\r\nContent-Length: 0\r\n\r\n",
     "RemoteProtocolError: the answer's head folds its status line"),
    # Only the literal ICY, and only as the whole protocol name of the status line.
    ("icy-lower-case", b"icy 200 OK\r\nicy-name: x\r\n\r\n", NOT_HTTP),
    ("icy-versioned", b"ICY/1.0 200 OK\r\nicy-name: x\r\n\r\n", NOT_HTTP),
    ("icy-no-space", b"ICY200 OK\r\nicy-name: x\r\n\r\n", NOT_HTTP),
    ("icy-after-a-space", b" ICY 200 OK\r\nicy-name: x\r\n\r\n", NOT_HTTP),
    ("icy-status-not-a-number", b"ICY 2OO OK\r\nicy-name: x\r\n\r\n", NOT_HTTP),
    ("upgrade", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
     "RemoteProtocolError: the server switched protocols"),
]


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("reply, error", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_a_malformed_answer_is_refused_with_a_clear_error_however_its_bytes_arrive(loop, reply, error, split):
    conn, transport = connection(loop)
    for piece in pieces(reply, split):
        conn.data_received(piece)
        if conn.error is not None:
            break
    got = read(conn)
    assert got.error is not None and got.error.startswith(error), got.error
    assert transport.aborted and not got.reusable


def test_the_parsers_own_words_are_in_the_error(loop):
    error = feed(loop, b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\nh", "bytewise").error
    assert error is not None and re.search(r"content-length", error, re.IGNORECASE), error


@pytest.mark.parametrize("split", ["whole", "bytewise", "random0"])
def test_a_head_without_an_end_is_refused_past_the_bound(loop, split):
    reply = b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"x" * (http1.MAX_HEAD + 10) + b"\r\n"
    got = feed(loop, reply, split)
    assert got.error == f"RemoteProtocolError: the answer's head is over {http1.MAX_HEAD} bytes"


# Counted over the reads after the head's: one read is bounded by the read size already.
@pytest.mark.parametrize("split", ["bytewise", "random1"])
def test_trailers_without_an_end_are_refused_past_the_bound(loop, split):
    reply = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n"
             + b"X-T: " + b"t" * (http1.MAX_HEAD + 10) + b"\r\n")
    got = feed(loop, reply, split)
    assert got.body == b"hi"
    assert got.error == f"RemoteProtocolError: over {http1.MAX_HEAD} bytes of chunk lines or trailers"


# -- through the client, from a server that writes one byte at a time --------------------------------------------

async def _resolve(host: str, port: int) -> list[dict[str, object]]:
    return [{"host": "127.0.0.1", "port": port, "family": 2}]


class _BytewiseServer:
    """Answers each request on a connection with the next reply, one byte a write, each write drained."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                reply = self.replies.pop(0)
                for i in range(len(reply)):
                    writer.write(reply[i:i + 1])
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> yarl.URL:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return yarl.URL(f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/")

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


async def _get(client: http1.Http1Client, url: yarl.URL) -> tuple[int, bytes]:
    answer = await client.get(url, [("User-Agent", "t")], timeout=(2.0, 2.0, 2.0, 10.0), max_body=1 << 20,
                              read_size=1 << 20)
    try:
        return answer.status_code, b"".join([piece async for piece in answer.stream])
    finally:
        await answer.aclose()


async def test_the_client_reuses_a_connection_whose_answers_came_one_byte_a_write():
    server = _BytewiseServer(CL, CHUNKED, b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nend")
    client = http1.Http1Client(_resolve)
    try:
        async with server as url:
            assert await _get(client, url / "a") == (200, b"hello world")
            assert client.idle() == 1
            assert await _get(client, url / "b") == (200, b"hello 0123456789abcdefghijk")
            assert await _get(client, url / "c") == (200, b"end")
            assert client.idle() == 0          # it said close
        assert server.connections == 1
        assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/c"]
    finally:
        await client.aclose()


async def test_the_client_reports_an_early_close_with_the_bytes_before_it():
    server = _BytewiseServer(CL[:-4])          # then the connection closes
    client = http1.Http1Client(_resolve)
    try:
        async with server as url:
            answer = await client.get(url, [], timeout=(2.0, 2.0, 2.0, 10.0), max_body=1 << 20, read_size=1 << 20)
            got = b""
            with pytest.raises(httpx.ReadError, match=f"after {len(CL) - 4} bytes"):
                async for piece in answer.stream:
                    got += piece
            await answer.aclose()
        assert got == b"hello w" and client.idle() == 0
    finally:
        await client.aclose()


async def test_the_client_reads_a_station_that_answers_icy_one_byte_a_write():
    server = _BytewiseServer(ICY)              # then the connection closes, as a station that hangs up
    client = http1.Http1Client(_resolve)
    try:
        async with server as url:
            answer = await client.get(url, [("Icy-MetaData", "1")], timeout=(2.0, 2.0, 2.0, 10.0),
                                      max_body=1 << 20, read_size=1 << 20)
            assert answer.status_code == 200 and answer.extensions.get("icy") is True
            assert answer.headers["icy-name"] == "Loopback FM"
            body = b"".join([piece async for piece in answer.stream])
            await answer.aclose()
        assert body == bytes(range(256)) * 4 and client.idle() == 0
        assert b"Icy-MetaData: 1\r\n" in server.requests[0]
    finally:
        await client.aclose()
