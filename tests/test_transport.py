"""The worker's httpx transport over aiohttp, against raw loopback servers that misbehave on purpose."""

import asyncio
import subprocess
import sys

import aiohttp
import aiohttp.base_protocol
import httpx
import pytest

from crawler.http.aio import salvage
from crawler.http.transport import build_client, build_transport


class RawServer:
    """A TCP server answering each connection with handler(reader, writer); counts connections."""

    def __init__(self, handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            await self.handler(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


async def read_request(server: RawServer, reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    body = await reader.readexactly(length) if length else b""
    server.requests.append(head + body)
    return head


def client(read_timeout: float = 5) -> httpx.AsyncClient:
    return build_client(build_transport(max_connections=4, dns_ttl=60), user_agent="t-agent", connect_timeout=2,
                        read_timeout=read_timeout, max_redirects=2)


async def keep_alive(server, reader, writer):
    while True:
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()


async def test_bodies_headers_and_pooled_connections():
    async with RawServer(keep_alive) as server, client() as c:
        for _ in range(3):
            r = await c.get(server.url + "/a?b=%20c")
            assert r.status_code == 200 and r.text == "hello" and r.reason_phrase == "OK"
        r = await c.post(server.url + "/form", data={"k": "v w"})
        assert r.status_code == 200
    assert server.connections == 1          # every response went back to the pool
    first, post = server.requests[0], server.requests[-1]
    assert first.startswith(b"GET /a?b=%20c HTTP/1.1\r\n")          # not quoted twice
    assert b"User-Agent: t-agent" in first and b"Cookie" not in first
    assert post.startswith(b"POST /form ") and post.endswith(b"\r\n\r\nk=v+w")


async def test_an_unread_body_does_not_poison_the_pool():
    async def big(server, reader, writer):
        while True:
            await read_request(server, reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1_000_000)
            await writer.drain()

    async with RawServer(big) as server, client() as c:
        for _ in range(3):
            async with c.stream("GET", server.url) as r:
                async for _chunk in r.aiter_raw():
                    break                       # a capped page: the rest is never read
        r = await c.get(server.url)
        assert len(r.content) == 1_000_000


async def test_refused_connection_is_a_connect_error():
    async with RawServer(keep_alive) as server:
        url = server.url
    async with client() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(url)


async def test_silent_server_is_a_read_timeout():
    async def silent(server, reader, writer):
        await read_request(server, reader)
        await reader.read()            # not a byte, until the client gives up

    async with RawServer(silent) as server, client(read_timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.get(server.url)


@pytest.mark.parametrize("answer, error", [
    (b"", httpx.RemoteProtocolError),                                            # hangs up instead
    (b"SPAM SPAM SPAM\r\n\r\n", httpx.RemoteProtocolError),                      # not HTTP
    (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000, httpx.ReadError),   # body cut short
])
async def test_broken_answers_become_httpx_errors(answer, error):
    async def broken(server, reader, writer):
        await read_request(server, reader)
        writer.write(answer)
        await writer.drain()

    async with RawServer(broken) as server, client() as c:
        with pytest.raises(error):
            await c.get(server.url)


async def test_only_http_and_https():
    async with client() as c:
        with pytest.raises(httpx.UnsupportedProtocol):
            await c.get("ftp://127.0.0.1/x")


@pytest.mark.parametrize("read_size", [None, 1024 * 1024], ids=["page-reads", "download-reads"])
async def test_a_cut_body_hands_out_every_byte_received_before_the_error(read_size):
    """aiohttp raises a cut connection's error before returning what it had buffered; those bytes are valid
    data (a download resumes after them), so the transport yields all of them first."""
    # 99,840 bytes of a promised 1,000,000: less than aiohttp buffers before it stops reading, so it sees the cut
    sent = bytes(range(256)) * 390
    arrived = asyncio.Event()

    async def cut(server, reader, writer):
        await read_request(server, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + sent)
        await writer.drain()
        writer.close()          # FIN after the bytes: all of them reach the client
        arrived.set()

    async with RawServer(cut) as srv:
        transport = build_transport(max_connections=4, dns_ttl=60)
        ext = {"read_size": read_size} if read_size else {}
        response = await transport.handle_async_request(httpx.Request("GET", srv.url + "/", extensions=ext))
        await arrived.wait()
        # Read only once aiohttp has taken in the bytes and seen the cut (its buffer's error is set): the case
        # where it used to drop them.
        content = response.stream._response.content
        for _ in range(1000):
            if content.exception() is not None:
                break
            await asyncio.sleep(0.01)
        assert content.exception() is not None
        got = bytearray()
        with pytest.raises(httpx.TransportError):
            async for piece in response.stream:
                got += piece
        await response.aclose()
        await transport.aclose()
    assert bytes(got) == sent


async def test_the_bytes_a_failed_aiohttp_stream_holds_are_salvaged():
    """aiohttp offers no public call for what a StreamReader buffered once its exception is set; the transport reads
    its buffer (aio.salvage). If aiohttp changes that buffer, this fails, not a download's resume."""
    loop = asyncio.get_running_loop()
    content = aiohttp.StreamReader(aiohttp.base_protocol.BaseProtocol(loop), 2**16, loop=loop)
    content.feed_data(b"abc")
    content.feed_data(b"def")
    assert await content.read(1) == b"a"
    content.set_exception(aiohttp.ClientPayloadError("cut"))
    assert salvage(content) == b"bcdef"
    assert salvage(content) == b""


_LOADS_AIOHTTP_LATE = r"""
import asyncio, sys
import yarl
import crawler.worker.cli, crawler.worker.server
from crawler.http.transport import build_client, build_transport

assert "aiohttp" not in sys.modules, "imported by the worker itself"

async def answer(reader, writer):
    while (await reader.readline()).strip():
        pass
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    transport = build_transport(max_connections=4, dns_ttl=60)
    got = await transport.get(yarl.URL(url), [], timeout=(5, 5, 5, 10), max_body=1024, read_size=1024)
    body = b"".join([chunk async for chunk in got.stream])
    assert (got.status_code, body) == (200, b"ok"), (got.status_code, body)
    assert "aiohttp" not in sys.modules, "imported by a request on the lean path"
    async with build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=0) as c:
        assert (await c.get(url)).text == "ok"
    assert "aiohttp" in sys.modules
    server.close()

asyncio.run(main())
print("ok")
"""


def test_a_worker_loads_aiohttp_only_for_a_request_off_the_lean_path():
    """The worker's start and its page and download path (the lean client) never import aiohttp, about a tenth
    of a second of CPU per process; the first request through the httpx client does."""
    done = subprocess.run([sys.executable, "-c", _LOADS_AIOHTTP_LATE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
