"""Tunnels through proxies (crawler/http/tunnel.py): the sans-IO CONNECT and SOCKS5 parsers fed whole, byte by byte
and garbage, and the asyncio shell against hostile loopback proxies (huge heads, garbage, silence, 407)."""

import asyncio
import time

import pytest

from crawler.http.egress import ProxyFailed
from crawler.http.proxies import Proxy
from crawler.http.tunnel import (MAX_CONNECT_HEAD, ConnectAnswer, Socks5, TunnelError, connect_request,
                                 open_tunnel)
from tests.test_transport import RawServer

HTTP = Proxy("http", "127.0.0.1", 1, "us er", "pä:ss")
SOCKS = Proxy("socks5", "127.0.0.1", 1)
SOCKS_AUTH = Proxy("socks5", "127.0.0.1", 1, "user", "pw")


def test_connect_request_names_the_origin_and_carries_basic_credentials():
    req = connect_request(HTTP, "example.com", 443)
    assert req.startswith(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n")
    assert b"Proxy-Authorization: Basic dXMgZXI6cMOkOnNz\r\n" in req and req.endswith(b"\r\n\r\n")
    assert b"Proxy-Authorization" not in connect_request(SOCKS, "::1", 8443)
    assert connect_request(SOCKS, "::1", 8443).startswith(b"CONNECT [::1]:8443 ")


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_2xx_answer_opens_the_tunnel_whole_or_byte_by_byte(bytewise):
    answer = ConnectAnswer()
    data = b"HTTP/1.1 200 Connection established\r\nVia: x\r\n\r\n"
    pieces = [data[i:i + 1] for i in range(len(data))] if bytewise else [data]
    results = [answer.feed(p) for p in pieces]
    assert results[-1] is True and not any(results[:-1])


@pytest.mark.parametrize("data, message", [
    (b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", "407"),
    (b"HTTP/1.1 403 Forbidden\r\n\r\n", "refused"),
    (b"SSH-2.0-OpenSSH_9.0\r\n\r\n", "status line"),
    (b"\x00\xff garbage garbage", "not HTTP"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\n\r\nHTTP/1.1 200 early bytes", "bytes after"),
])
def test_answers_that_are_not_an_open_tunnel_are_refused(data, message):
    with pytest.raises(TunnelError, match=message):
        ConnectAnswer().feed(data)


def test_a_huge_head_is_refused_at_its_bound():
    answer = ConnectAnswer()
    answer.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(TunnelError, match="over"):
        for _ in range(MAX_CONNECT_HEAD // 1000 + 2):
            answer.feed(b"X-Pad: " + b"a" * 990 + b"\r\n")


def socks_run(proxy, replies, host="example.com", port=443):
    s = Socks5(proxy, host, port)
    sent = [s.start()]
    for reply in replies:
        for i in range(len(reply)):        # byte by byte: every split of every message
            out = s.feed(reply[i:i + 1])
            if out:
                sent.append(out)
    return s, sent


OK_REPLY = b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50"


def test_socks5_without_credentials_asks_the_proxy_to_resolve_the_name():
    s, sent = socks_run(SOCKS, [b"\x05\x00", OK_REPLY])
    assert s.open
    assert sent == [b"\x05\x01\x00", b"\x05\x01\x00\x03\x0bexample.com\x01\xbb"]


def test_socks5_with_credentials_and_a_domain_or_ipv6_bound_address():
    s, sent = socks_run(SOCKS_AUTH, [b"\x05\x02", b"\x01\x00", b"\x05\x00\x00\x03\x04host\x00\x50"], "::1", 80)
    assert s.open
    assert sent == [b"\x05\x02\x00\x02", b"\x01\x04user\x02pw",
                    b"\x05\x01\x00\x04" + b"\x00" * 15 + b"\x01\x00\x50"]
    s, _ = socks_run(SOCKS, [b"\x05\x00", b"\x05\x00\x00\x04" + b"\x00" * 16 + b"\x00\x50"])
    assert s.open


@pytest.mark.parametrize("proxy, replies, message", [
    (SOCKS, [b"\x04\x5a"], "not a SOCKS5"),
    (SOCKS, [b"\x05\xff"], "accepts none"),
    (SOCKS, [b"\x05\x02"], "did not offer"),
    (SOCKS_AUTH, [b"\x05\x02", b"\x01\x01"], "refused the credentials"),
    (SOCKS, [b"\x05\x00", b"\x05\x05\x00\x01\0\0\0\0\0\0"], "connection refused"),
    (SOCKS, [b"\x05\x00", b"\x05\x00\x00\x09\0\0"], "address type"),
    (SOCKS, [b"\x05\x00", OK_REPLY + b"x"], "before the origin"),
    (SOCKS, [b"\x05\x00\x00"], "more than its method"),
])
def test_socks5_answers_the_protocol_does_not_allow_are_refused(proxy, replies, message):
    s = Socks5(proxy, "example.com", 443)
    s.start()
    with pytest.raises(TunnelError, match=message):
        for reply in replies:
            s.feed(reply)


# -- the shell against hostile proxies ---------------------------------------------------------------------

async def endless_head(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\n")
    for _ in range(10_000):
        writer.write(b"X-Pad: " + b"a" * 1000 + b"\r\n")
        await writer.drain()


async def silent(reader, writer):
    await reader.read(100)
    await asyncio.sleep(60)


async def trickle(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    for byte in b"HTTP/1.1 200 OK\r\n" * 100:
        writer.write(bytes((byte,)))
        await writer.drain()
        await asyncio.sleep(0.05)


async def garbage(reader, writer):
    await reader.read(100)
    writer.write(b"\xde\xad\xbe\xef" * 64)
    await writer.drain()
    await asyncio.sleep(5)


async def auth_required(reader, writer):
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n")
    await writer.drain()


@pytest.mark.parametrize("kind, handler, message", [
    ("http", endless_head, "over"), ("http", silent, "within"), ("http", trickle, "within"),
    ("http", garbage, "not"), ("http", auth_required, "407"),
    ("socks5", silent, "within"), ("socks5", garbage, "not a SOCKS5"),
])
async def test_a_hostile_proxy_costs_bounded_time_and_is_a_proxy_failure(kind, handler, message):
    async with RawServer(lambda _, reader, writer: handler(reader, writer)) as server:
        proxy = Proxy(kind, "127.0.0.1", int(server.url.rsplit(":", 1)[1]))
        started = time.monotonic()
        with pytest.raises(ProxyFailed, match=message) as e:
            await open_tunnel(proxy, "example.com", 443, 1.0)
        assert time.monotonic() - started < 3
        assert e.value.proxy == proxy and "127.0.0.1" in str(e.value)


async def test_a_refused_connection_to_the_proxy_is_a_proxy_failure():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ProxyFailed, match="cannot connect"):
        await open_tunnel(Proxy("http", "127.0.0.1", port), "example.com", 443, 2.0)
