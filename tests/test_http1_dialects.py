"""The dialects of real servers through the lean HTTP/1.1 client (crawler/http/http1.py): unusual answers a
browser reads are read, framing that enables smuggling is refused, trailers are never headers. Every answer is
served by a raw loopback server whole and one byte a write, and fed to the connection one byte a read."""

from __future__ import annotations

import asyncio
import gzip

import aiohttp
import httpx
import pytest
import yarl

from crawler.http import http1
from crawler.http.bodies import BodyError
from crawler.http.transport import build_transport
from tests.test_transport import RawServer, read_request

TIMEOUTS = (2.0, 2.0, 2.0, None)
# The headers the comparison looks at (the framing ones differ by design: ours describe the decoded body).
WATCH = ("x-folded", "x-a", "x-empty", "x-trailer", "content-encoding")
GZ = gzip.compress(b"hello", mtime=0)
OK = (200, {}, b"hello")

# Unusual answers, legal or met on the real web: (name, answer, ours, httpx's, aiohttp's). A result is
# (status, the WATCH headers seen, body), or the name of the error raised. Deliberate differences:
# - fold: aiohttp keeps the fold's blanks ('a  b\tc'); RFC 9112 5.2 says each fold becomes a space, as httpx and
#   browsers read it.
# - te_identity, identity_chunked: h11 (httpx) refuses every transfer coding but chunked; RFC 9112 6.3 frames a
#   non-chunked coding of an answer to the connection's close, and chunked last as chunked, as aiohttp does.
# - te_gzip: a transfer coding we do not decode is refused as a coding (BodyError), where aiohttp hands out the
#   gzip bytes as if they were the file; its framing is read all the same (to the close).
# - cl_list: RFC 9110 8.6 lets a recipient take "5, 5" as 5 (httpx does); llhttp and aiohttp refuse a list of
#   lengths, and so do we: it is how two parsers are made to disagree on where an answer ends.
# - fold_cl: both libraries unfold a folded Content-Length; we refuse a folded framing field for the same reason.
# - lf_chunks: a bare LF is taken in the head only; the chunk lines stay strict, as in both libraries.
# - gzip_ce: we hand out the decoded body without the Content-Encoding that described the wire (bodies.py).
CASES = [
    ("fold", b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n  b\r\n\tc\r\nContent-Length: 5\r\n\r\nhello",
     (200, {"x-folded": "a b c"}, b"hello"), (200, {"x-folded": "a b c"}, b"hello"),
     (200, {"x-folded": "a  b\tc"}, b"hello")),
    ("bare_lf", b"HTTP/1.1 200 OK\nX-A: 1\nContent-Length: 5\n\nhello",
     (200, {"x-a": "1"}, b"hello"), (200, {"x-a": "1"}, b"hello"), (200, {"x-a": "1"}, b"hello")),
    ("mixed_lf", b"HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 5\r\n\nhello",
     (200, {"x-a": "1"}, b"hello"), (200, {"x-a": "1"}, b"hello"), (200, {"x-a": "1"}, b"hello")),
    ("trailers", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n"
                 b"5\r\nhello\r\n0\r\nX-Trailer: t\r\nContent-Encoding: gzip\r\n\r\n", OK, OK, OK),
    ("te_identity", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nConnection: close\r\n\r\nhello",
     OK, "RemoteProtocolError", OK),
    ("identity_chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity, chunked\r\n\r\n"
                         b"5\r\nhello\r\n0\r\n\r\n", OK, "RemoteProtocolError", OK),
    ("te_gzip", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" + GZ,
     "BodyError", "RemoteProtocolError", (200, {}, GZ)),
    ("chunk_ext", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=value\r\nhello\r\n0\r\n\r\n",
     OK, OK, OK),
    ("te_case", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", OK, OK, OK),
    ("no_reason", b"HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello", OK, OK, OK),
    ("odd_status", b"HTTP/1.1 299 Whatever it is\r\nContent-Length: 5\r\n\r\nhello",
     (299, {}, b"hello"), (299, {}, b"hello"), (299, {}, b"hello")),
    ("http10_to_close", b"HTTP/1.0 200 OK\r\n\r\nhello", OK, OK, OK),
    ("early_hints", b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", OK, OK, OK),
    ("ows", b"HTTP/1.1 200 OK\r\nX-A:v \t\r\nX-Empty:\r\nContent-Length: 5\r\n\r\nhello",
     (200, {"x-a": "v", "x-empty": ""}, b"hello"), (200, {"x-a": "v", "x-empty": ""}, b"hello"),
     (200, {"x-a": "v", "x-empty": ""}, b"hello")),
    ("cl_zeros", b"HTTP/1.1 200 OK\r\nContent-Length: 005\r\n\r\nhello", OK, OK, OK),
    ("dup_field", b"HTTP/1.1 200 OK\r\nX-A: 1\r\nX-A: 2\r\nContent-Length: 5\r\n\r\nhello",
     (200, {"x-a": "1,2"}, b"hello"), (200, {"x-a": "1,2"}, b"hello"), (200, {"x-a": "1,2"}, b"hello")),
    ("gzip_ce", b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(GZ) + GZ,
     OK, (200, {"content-encoding": "gzip"}, b"hello"), (200, {"content-encoding": "gzip"}, b"hello")),
    ("cl_list", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
     "RemoteProtocolError", OK, "ClientResponseError"),
    ("fold_cl", b"HTTP/1.1 200 OK\r\nContent-Length:\r\n 5\r\n\r\nhello", "RemoteProtocolError", OK, OK),
    ("lf_chunks", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
     "RemoteProtocolError", "RemoteProtocolError", "ClientResponseError"),
]
CASE_IDS = [c[0] for c in CASES]


def seen(status: int, items, body: bytes):
    headers: dict[str, list[str]] = {}
    for name, value in items:
        if name.lower() in WATCH:
            headers.setdefault(name.lower(), []).append(value)
    return status, {k: ",".join(v) for k, v in headers.items()}, body


def server_of(reply: bytes, bytewise: bool):
    """A server answering each connection's first request with reply, whole or one byte a write, then closing."""
    async def serve(server, reader, writer):
        await read_request(server, reader)
        if bytewise:
            for i in range(len(reply)):
                writer.write(reply[i:i + 1])
                await writer.drain()
                for _ in range(2):            # loop turns: the client reads each byte before the next is written
                    await asyncio.sleep(0)
        else:
            writer.write(reply)
            await writer.drain()
    return RawServer(serve)


async def ours(reply: bytes, bytewise: bool):
    async with server_of(reply, bytewise) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        try:
            answer = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20,
                                         read_size=1 << 20)
            try:
                body = b"".join([piece async for piece in answer.stream])
            finally:
                await answer.aclose()
            return seen(answer.status_code, answer.headers.items(), body)
        except (httpx.TransportError, httpx.DecodingError) as exc:
            return type(exc).__name__
        finally:
            await transport.aclose()


class _Transport:
    """Enough of an asyncio transport for a connection fed by hand."""

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def fed(reply: bytes, step: int):
    """The answer fed to one connection ``step`` bytes a read, then its close: (status, raw headers, body, error)."""
    loop = asyncio.new_event_loop()
    try:
        conn = http1._Connection(("http", "h", 80), loop)
        conn.transport = _Transport()          # type: ignore[assignment]
        for i in range(0, len(reply), step):
            conn.data_received(reply[i:i + step])
        conn.connection_lost(None)
    finally:
        loop.close()
    return conn.status, conn.raw, b"".join(conn.pieces), conn.error


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("name, reply, expected, _httpx, _aiohttp", CASES, ids=CASE_IDS)
async def test_unusual_answers_read_as_the_table_says(name, reply, expected, _httpx, _aiohttp, bytewise):
    assert await ours(reply, bytewise) == expected


@pytest.mark.parametrize("name, reply, _ours, expected_httpx, expected_aiohttp", CASES, ids=CASE_IDS)
async def test_the_table_records_what_httpx_and_aiohttp_make_of_each_answer(name, reply, _ours, expected_httpx,
                                                                            expected_aiohttp):
    async with server_of(reply, False) as server:
        try:
            async with httpx.AsyncClient() as client:
                r = await client.get(server.url)
                got_httpx = seen(r.status_code, r.headers.multi_items(), r.content)
        except httpx.HTTPError as exc:
            got_httpx = type(exc).__name__
    async with server_of(reply, False) as server:
        try:
            async with aiohttp.ClientSession() as session, session.get(server.url) as resp:
                got_aiohttp = seen(resp.status, resp.headers.items(), await resp.read())
        except aiohttp.ClientError as exc:
            got_aiohttp = type(exc).__name__
    assert (got_httpx, got_aiohttp) == (expected_httpx, expected_aiohttp)


# -- each answer of the issue, whole and one byte a read --------------------------------------------------------

FOLDED = (b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\nX-Folded: first\r\n   second\r\n\tthird\r\n"
          b"Content-Length: 5\r\n\r\nhello")
BARE_LF = b"HTTP/1.1 200 OK\nContent-Type: audio/mpeg\nETag: \"v1\"\nContent-Length: 5\n\nhello"
TRAILERS = (b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"
            b"3\r\nhel\r\n2\r\nlo\r\n0\r\nX-Sum: 42\r\nContent-Encoding: gzip\r\n\r\n")
MIXED = b"HTTP/1.1 100 Continue\n\r\nHTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\nContent-Length: 5\r\n\nhello"
IDENTITY = b"HTTP/1.1 200 OK\r\nContent-Type: audio/mpeg\r\nTransfer-Encoding: identity\r\n\r\n" + b"i" * 70_000


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("reply, headers", [
    (FOLDED, {"content-type": "audio/mpeg", "x-folded": "first second third"}),
    (BARE_LF, {"content-type": "audio/mpeg", "etag": '"v1"'}),
    (MIXED, {"content-type": "audio/mpeg"}),
    (TRAILERS, {"content-type": "audio/mpeg", "x-sum": None, "content-encoding": None}),
], ids=["obs-fold", "bare-lf", "mixed-after-1xx", "trailers"])
async def test_answers_a_browser_reads_are_read(reply, headers, bytewise):
    async with server_of(reply, bytewise) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        answer = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
        body = b"".join([piece async for piece in answer.stream])
        await answer.aclose()
        await transport.aclose()
    assert (answer.status_code, body) == (200, b"hello")
    assert {name: answer.headers.get(name) for name in headers} == headers
    assert all(b"\n" not in v and b"\r" not in v for _, v in answer.raw_headers)


@pytest.mark.parametrize("step", [1, 2, 7, 1 << 20])
@pytest.mark.parametrize("reply, headers", [
    (FOLDED, [(b"Content-Type", b"audio/mpeg"), (b"X-Folded", b"first second third"), (b"Content-Length", b"5")]),
    (BARE_LF, [(b"Content-Type", b"audio/mpeg"), (b"ETag", b'"v1"'), (b"Content-Length", b"5")]),
    (MIXED, [(b"Content-Type", b"audio/mpeg"), (b"Content-Length", b"5")]),
    (TRAILERS, [(b"Content-Type", b"audio/mpeg"), (b"Transfer-Encoding", b"chunked"), (b"Trailer", b"X-Sum")]),
], ids=["obs-fold", "bare-lf", "mixed-after-1xx", "trailers"])
def test_every_split_of_the_reads_gives_the_same_answer(reply, headers, step):
    assert fed(reply, step) == (200, headers, b"hello", None)


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
async def test_a_non_chunked_transfer_coding_is_read_to_the_close(bytewise):
    async with server_of(IDENTITY if not bytewise else IDENTITY[:-65_000], bytewise) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        answer = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
        body = b"".join([piece async for piece in answer.stream])
        await answer.aclose()
        assert transport._lean is not None and transport._lean.idle() == 0     # it ended with its connection
        await transport.aclose()
    assert (answer.status_code, body) == (200, b"i" * (5_000 if bytewise else 70_000))
    assert fed(IDENTITY, 1 if bytewise else 1 << 20) == (200, [(b"Content-Type", b"audio/mpeg"),
                                                                (b"Transfer-Encoding", b"identity")],
                                                           b"i" * 70_000, None)


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("coding", [b"gzip", b"x-unknown", b"gzip, chunked"])
async def test_a_transfer_coding_we_do_not_decode_is_refused_as_a_coding(coding, bytewise):
    body = b"3\r\nabc\r\n0\r\n\r\n" if coding.endswith(b"chunked") else GZ
    reply = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + coding + b"\r\n\r\n" + body
    assert await ours(reply, bytewise) == "BodyError"
    with pytest.raises(BodyError, match="transfer coding"):
        async with server_of(reply, bytewise) as server:
            transport = build_transport(max_connections=4, dns_ttl=60)
            try:
                await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
            finally:
                await transport.aclose()


async def test_a_connection_that_needed_a_normalised_head_carries_the_next_answer():
    async def serve(server, reader, writer):
        for reply in (FOLDED, BARE_LF, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain"):
            await read_request(server, reader)
            writer.write(reply)
            await writer.drain()

    async with RawServer(serve) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        bodies = []
        for _ in range(3):
            got = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
            bodies.append(b"".join([piece async for piece in got.stream]))
            await got.aclose()
        await transport.aclose()
    assert bodies == [b"hello", b"hello", b"again"] and server.connections == 1


async def test_a_normalised_head_is_bounded_like_any_other():
    async def endless(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\n")
        for _ in range(1000):                    # 1 MB of bare-LF and folded lines, if nobody stops it
            writer.write(b"X-Filler: " + b"f" * 500 + b"\n " + b"g" * 500 + b"\n")
            await writer.drain()

    async with RawServer(endless) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.RemoteProtocolError, match="head is over"):
            await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
        await transport.aclose()


@pytest.mark.parametrize("banner", [b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/2 200\n"])
async def test_a_server_that_does_not_speak_http_1_is_refused_at_once(banner):
    async def waits(server, reader, writer):
        await read_request(server, reader)
        writer.write(banner)                    # and no end of head: only a refusal ends the wait at once
        await writer.drain()
        await reader.read()

    async with RawServer(waits) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.RemoteProtocolError, match="not an HTTP answer"):
            await transport.get(yarl.URL(server.url), [], timeout=(2.0, 30.0, 2.0, None), max_body=1 << 20,
                                read_size=1 << 20)
        await transport.aclose()


async def test_trailers_are_bounded_like_a_head():
    async def endless_trailer(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Pad: ")
        for _ in range(1000):                    # 1 MB of one trailer field, if nobody stops it
            writer.write(b"p" * 1024)
            await writer.drain()
            await asyncio.sleep(0)
        writer.write(b"\r\n\r\n")
        await writer.drain()

    async with RawServer(endless_trailer) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        answer = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1 << 20)
        with pytest.raises(httpx.RemoteProtocolError, match="trailers"):
            async for _ in answer.stream:
                pass
        await answer.aclose()
        await transport.aclose()


# -- framing that enables smuggling stays refused, however the reads fall ------------------------------------------

H = b"HTTP/1.1 200 OK\r\n"
REFUSED = [
    ("two_lengths", H + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    ("same_length_twice", H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
    ("length_list", H + b"Content-Length: 5, 5\r\n\r\nhello"),
    ("length_signed", H + b"Content-Length: +5\r\n\r\nhello"),
    ("length_negative", H + b"Content-Length: -1\r\n\r\nhello"),
    ("length_not_a_number", H + b"Content-Length: 5x\r\n\r\nhello"),
    ("length_overflow", H + b"Content-Length: 99999999999999999999999\r\n\r\nhello"),
    ("length_then_chunked", H + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("chunked_then_length", H + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"),
    ("identity_with_length", H + b"Transfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhello"),
    ("chunked_not_last", H + b"Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    ("chunked_not_last_split", H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
    ("chunked_twice", H + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"),
    ("chunked_twice_split", H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("folded_length", H + b"Content-Length: 1\r\n 5\r\n\r\nhello"),
    ("folded_coding", H + b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n"),
    ("folded_coding_lf", H.replace(b"\r", b"") + b"Transfer-Encoding: gzip,\n\tchunked\n\n0\r\n\r\n"),
    ("folded_status_line", b"HTTP/1.1 200 OK\r\n chunked\r\nContent-Length: 5\r\n\r\nhello"),
    ("space_before_colon", H + b"Content-Length : 5\r\n\r\nhello"),
    ("tab_in_name", H + b"Content-Length\t: 5\r\n\r\nhello"),
    ("lone_cr_line_end", H + b"X-A: 1\rContent-Length: 5\r\n\r\nhello"),
    ("lone_cr_ends_head", H + b"Content-Length: 5\r\r\n\r\nhello"),
    ("nul_in_value", H + b"X-A: a\x00b\r\nContent-Length: 5\r\n\r\nhello"),
    ("nul_in_name", H + b"X-\x00A: b\r\nContent-Length: 5\r\n\r\nhello"),
    ("no_colon", H + b"Content-Length 5\r\n\r\nhello"),
    ("bad_chunk_size", H + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"),
    ("chunk_size_overflow", H + b"Transfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nhello\r\n0\r\n\r\n"),
    ("chunk_size_signed", H + b"Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"),
    ("chunk_size_lone_cr", H + b"Transfer-Encoding: chunked\r\n\r\n5\rhello\r\n0\r\n\r\n"),
    ("chunk_data_too_long", H + b"Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"),
    ("chunk_size_bare_lf", H + b"Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n"),
    ("not_http", b"HTTP/1.1 OK 200\r\nContent-Length: 5\r\n\r\nhello"),
    ("version_junk", b"HTTP/1.x 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    ("switching_protocols", b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nhi"),
]


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("reply", [r for _, r in REFUSED], ids=[n for n, _ in REFUSED])
async def test_framing_that_enables_smuggling_is_refused(reply, bytewise):
    assert await ours(reply, bytewise) in ("RemoteProtocolError", "ReadError")
    status, raw, body, error = fed(reply, 1 if bytewise else 1 << 20)
    assert isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError))


def test_unfolding_a_head():
    assert http1.unfold_head(b"HTTP/1.1 200 OK\nA: 1\n  2 \n\t3\nB:\r\n x\r\n \r\n\n") == \
        b"HTTP/1.1 200 OK\r\nA: 1 2 3\r\nB: x\r\n\r\n"
    for head in (b"HTTP/1.1 200 OK\n x\n\n", b"HTTP/1.1 200 OK\nContent-length: 1\n 2\n\n",
                 b"HTTP/1.1 200 OK\nTRANSFER-ENCODING :\n chunked\n\n"):
        with pytest.raises(httpx.RemoteProtocolError):
            http1.unfold_head(head)
