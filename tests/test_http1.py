"""The downloads' HTTP/1.1 client (crawler/http/http1.py) through the worker's transport, against raw loopback
servers that misbehave on purpose, and a TLS server with a certificate made here."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
import yarl
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crawler.http import http1
from crawler.http.targets import TargetPolicy, TargetRefused
from crawler.http.transport import build_transport
from crawler.http.transport import AiohttpTransport
from tests.test_transport import RawServer, read_request

TIMEOUTS = (2.0, 2.0, 2.0, None)


async def get(transport: AiohttpTransport, url: str, *, headers: list[tuple[str, str]] | None = None,
              timeout: http1.Timeouts = TIMEOUTS, read_size: int = 1 << 20,
              max_body: int = 1 << 30) -> tuple[int, bytes, http1.Answer]:
    answer = await transport.get(yarl.URL(url), headers or [("User-Agent", "t-agent")], timeout=timeout,
                                 max_body=max_body, read_size=read_size)
    body = bytearray()
    try:
        async for piece in answer.stream:
            body += piece
    finally:
        await answer.aclose()
    return answer.status_code, bytes(body), answer


def answer(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n" % len(body) + b"".join(h + b"\r\n" for h in extra)
    return head + b"\r\n" + body


async def test_answers_come_back_whole_and_the_connection_is_reused():
    async def serve(server, reader, writer):
        while True:
            await read_request(server, reader)
            writer.write(answer(b"hello", b"ETag: \"v1\"", b"Content-Type: audio/mpeg"))
            await writer.drain()

    async with RawServer(serve) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        for i in range(3):
            status, body, got = await get(transport, server.url + f"/a%20b.mp3?i={i}",
                                          headers=[("User-Agent", "t-agent"), ("Range", "bytes=0-")])
            assert (status, body) == (200, b"hello")
            assert got.headers.get("etag") == '"v1"' and got.headers.get("CONTENT-TYPE") == "audio/mpeg"
        await transport.aclose()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"GET /a%20b.mp3?i=0 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nUser-Agent: t-agent\r\n" in first and b"\r\nRange: bytes=0-\r\n" in first


async def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error():
    hung_up = asyncio.Event()

    async def one_answer_per_connection(server, reader, writer):
        await read_request(server, reader)
        writer.write(answer(b"x" * 10))          # says nothing of closing, then closes
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        hung_up.set()

    async with RawServer(one_answer_per_connection) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        for _ in range(3):
            assert (await get(transport, server.url))[:2] == (200, b"x" * 10)
            await asyncio.wait_for(hung_up.wait(), 5)      # the server has hung up on the pooled connection
            hung_up.clear()
        await transport.aclose()
    assert server.connections == 3


async def test_chunked_answers_answers_to_the_end_of_the_connection_and_1xx_before_the_answer():
    async def chunked(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
        await writer.drain()
        await read_request(server, reader)         # still open: the answer was framed
        writer.write(answer(b"again"))
        await writer.drain()

    async def to_eof(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: audio/ogg\r\n\r\n" + b"z" * 100_000)
        await writer.drain()

    async with RawServer(chunked) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        assert (await get(transport, server.url))[:2] == (200, b"abcdefg")
        assert (await get(transport, server.url))[:2] == (200, b"again")
        await transport.aclose()
    assert server.connections == 1
    async with RawServer(to_eof) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        assert (await get(transport, server.url))[:2] == (200, b"z" * 100_000)
        assert transport._lean is not None and transport._lean.idle() == 0     # it ended with its connection
        await transport.aclose()


@pytest.mark.parametrize("reply, error", [
    (b"", httpx.RemoteProtocolError),                                             # hangs up instead
    (b"SPAM SPAM SPAM\r\n\r\n", httpx.RemoteProtocolError),                       # not HTTP
    (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 100_000 + b"\r\n\r\n", httpx.RemoteProtocolError),  # huge head
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", httpx.RemoteProtocolError),
])
async def test_broken_answers_become_httpx_errors(reply, error):
    async def broken(server, reader, writer):
        await read_request(server, reader)
        writer.write(reply)
        await writer.drain()
        if reply:
            await reader.read()        # the connection stays open until the client gives up on the answer

    async with RawServer(broken) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(error):
            await get(transport, server.url)
        await transport.aclose()


async def test_a_head_that_never_ends_costs_bounded_memory():
    async def endless(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(10_000):              # 10 MB of headers, if nobody stops it
            writer.write(b"X-Filler: " + b"f" * 1000 + b"\r\n")
            await writer.drain()

    async with RawServer(endless) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.RemoteProtocolError, match="head is over"):
            await get(transport, server.url)
        await transport.aclose()


async def test_silence_is_a_read_timeout_and_the_total_timeout_covers_the_body():
    async def silent(server, reader, writer):
        await read_request(server, reader)
        await reader.read()            # not a byte, until the client gives up

    async def trickle(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):
            writer.write(b"t")
            await writer.drain()
            await asyncio.sleep(0.05)      # the behaviour under test: each byte in time, the whole too slow

    async with RawServer(silent) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.ReadTimeout):
            await get(transport, server.url, timeout=(2.0, 0.3, 2.0, None))
        await transport.aclose()
    async with RawServer(trickle) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(httpx.ReadTimeout, match="total timeout"):
            await get(transport, server.url, timeout=(2.0, 0.3, 2.0, 0.8))   # each byte in time, the whole not
        assert loop.time() - started < 10      # far short of the trickle's 50 s: a loaded machine passes too
        await transport.aclose()


async def test_a_cut_body_hands_out_every_byte_received_before_the_error():
    sent = bytes(range(256)) * 390

    async def cut(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + sent)
        await writer.drain()

    async with RawServer(cut) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        got = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 30, read_size=1 << 20)
        body = bytearray()
        with pytest.raises(httpx.ReadError):
            async for piece in got.stream:
                body += piece
        await got.aclose()
        await transport.aclose()
    assert bytes(body) == sent


async def test_a_reader_that_does_not_read_holds_the_sender_back():
    total = 64 * 1024 * 1024
    sent = 0

    async def flood(server, reader, writer):
        nonlocal sent
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        block = b"f" * 65536
        while sent < total:
            writer.write(block)
            await writer.drain()
            sent += len(block)

    async with RawServer(flood) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        got = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 30, read_size=1 << 20)
        await asyncio.sleep(1.0)     # the behaviour under test: nobody reads the body for a while
        conn = got.stream._conn
        assert conn.buffered < 4 * 1024 * 1024 and sent < total / 2
        read = 0
        async for piece in got.stream:
            read += len(piece)
        assert read == total
        await got.aclose()
        await transport.aclose()


async def test_bytes_after_the_answer_keep_the_connection_out_of_the_pool():
    async def chatty(server, reader, writer):
        while True:
            await read_request(server, reader)
            writer.write(answer(b"ok") + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil")
            await writer.drain()

    async with RawServer(chatty) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        for _ in range(2):
            assert (await get(transport, server.url))[:2] == (200, b"ok")
        await transport.aclose()
    assert server.connections == 2


async def test_the_target_policy_and_header_injection_are_refused_before_anything_is_sent():
    async def serve(server, reader, writer):
        await read_request(server, reader)
        writer.write(answer(b"secret"))
        await writer.drain()

    async with RawServer(serve) as server:
        guarded = build_transport(max_connections=4, dns_ttl=60, policy=TargetPolicy())
        with pytest.raises(TargetRefused):
            await get(guarded, server.url)
        await guarded.aclose()
        transport = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.LocalProtocolError):
            await get(transport, server.url, headers=[("User-Agent", "a\r\nX-Injected: 1")])
        with pytest.raises(httpx.UnsupportedProtocol):
            await get(transport, "ftp://127.0.0.1/x")
        await transport.aclose()
    assert server.requests == []


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_is_verified_against_the_trusted_certificates_and_the_host_name(tmp_path, monkeypatch):
    cert, key = _certificate(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    requests: list[bytes] = []

    async def serve(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head)
                writer.write(answer(b"over tls"))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/a.mp3"
    try:
        # The system's certificates do not vouch for this one: no connection.
        untrusted = build_transport(max_connections=4, dns_ttl=60)
        with pytest.raises(httpx.ConnectError):
            await get(untrusted, url)
        await untrusted.aclose()
        # Trusted the way an operator adds a private CA (OpenSSL reads SSL_CERT_FILE): the production path.
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        transport = build_transport(max_connections=4, dns_ttl=60)
        for _ in range(2):
            assert (await get(transport, url))[:2] == (200, b"over tls")
        assert transport._lean.idle() == 1
        await transport.aclose()
    finally:
        server.close()
    assert len(requests) == 2 and requests[0].startswith(b"GET /a.mp3 HTTP/1.1\r\n")


async def test_a_connection_whose_answer_ended_while_reading_was_paused_reads_the_next_one():
    async def serve(server, reader, writer):
        while True:
            await read_request(server, reader)
            writer.write(answer(b"a" * 20_000))     # one read: past read_size, and the answer's end
            await writer.drain()

    async with RawServer(serve) as server:
        transport = build_transport(max_connections=4, dns_ttl=60)
        unread = await transport.get(yarl.URL(server.url), [], timeout=TIMEOUTS, max_body=1 << 20, read_size=1024)
        await unread.aclose()                        # the body was never asked for (a redirect's, say)
        assert transport._lean is not None and transport._lean.idle() == 1
        assert (await get(transport, server.url, read_size=1024))[:2] == (200, b"a" * 20_000)
        await transport.aclose()
    assert server.connections == 1
