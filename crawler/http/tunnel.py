"""Through a proxy to an origin: HTTP CONNECT, SOCKS5 (RFC 1928, RFC 1929), and the bytes of both, sans-IO.

The parsers take bytes and say what to send or that the way is open; they never hold more than a proxy's answer
may be (MAX_CONNECT_HEAD for CONNECT's answer, a SOCKS reply's fixed bound), so a hostile proxy costs bounded
memory; the asyncio shell (``open_tunnel``) bounds the time with the request's connect timeout over the whole
exchange. Every failure of the proxy is ProxyFailed (crawler/http/egress.py): the request may go through another.

SOCKS5 is asked for names, not addresses (ATYP 3): the proxy resolves them, as socks5h means elsewhere, so a
crawl's DNS answers are the exit's.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket

from crawler.http.egress import ProxyFailed
from crawler.http.proxies import Proxy

# A proxy's answer to CONNECT is a status line and a few fields; one longer than this is not a proxy's.
MAX_CONNECT_HEAD = 16 * 1024
_READ = 4096


class TunnelError(Exception):
    """The proxy's answer was not what the protocol allows, or refused the tunnel."""


def proxy_authorization(proxy: Proxy) -> str | None:
    """The Proxy-Authorization value (Basic) for an HTTP proxy with credentials."""
    if proxy.username is None:
        return None
    token = f"{proxy.username}:{proxy.password or ''}".encode()
    return "Basic " + base64.b64encode(token).decode("ascii")


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect_request(proxy: Proxy, host: str, port: int) -> bytes:
    authority = _authority(host, port)
    lines = [f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"]
    auth = proxy_authorization(proxy)
    if auth is not None:
        lines.append(f"Proxy-Authorization: {auth}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


class ConnectAnswer:
    """A proxy's answer to CONNECT: ``feed`` until it returns True (the tunnel is open), or TunnelError."""

    def __init__(self) -> None:
        self._head = bytearray()

    def feed(self, data: bytes) -> bool:
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_CONNECT_HEAD:
                raise TunnelError(f"the answer to CONNECT is over {MAX_CONNECT_HEAD} bytes")
            if len(self._head) >= 8 and not self._head.startswith(b"HTTP/1."):
                raise TunnelError("the answer to CONNECT is not HTTP")
            return False
        if end + 4 != len(self._head):
            raise TunnelError("the proxy sent bytes after its answer to CONNECT, before the origin spoke")
        status_line = bytes(self._head[:self._head.find(b"\r\n")])
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise TunnelError(f"not an HTTP status line: {status_line[:80]!r}")
        status = int(parts[1])
        if status == 407:
            raise TunnelError("407: the proxy wants (other) credentials")
        if not 200 <= status < 300:
            raise TunnelError(f"the proxy refused the tunnel: {status_line[:120].decode('latin-1')}")
        return True


# SOCKS5 (RFC 1928): method negotiation, then RFC 1929's user/password when chosen, then CONNECT.
_REPLIES = {1: "general failure", 2: "connection not allowed by ruleset", 3: "network unreachable",
            4: "host unreachable", 5: "connection refused", 6: "TTL expired", 7: "command not supported",
            8: "address type not supported"}


class Socks5:
    """The client side of a SOCKS5 CONNECT. ``start`` gives the first bytes to send; ``feed`` takes the proxy's
    bytes and gives the next to send (b"" for none yet); ``open`` once the origin is reached. TunnelError for
    any answer the protocol does not allow."""

    def __init__(self, proxy: Proxy, host: str, port: int) -> None:
        self._proxy, self._host, self._port = proxy, host, port
        self._buf = bytearray()
        self._step = "method"
        self.open = False

    def start(self) -> bytes:
        methods = b"\x00\x02" if self._proxy.username is not None else b"\x00"
        return bytes((5, len(methods))) + methods

    def _request(self) -> bytes:
        try:
            ip = ipaddress.ip_address(self._host)
        except ValueError:
            name = self._host.encode("idna")
            if not 0 < len(name) < 256:
                raise TunnelError(f"{self._host[:80]!r} is not a host name SOCKS5 can carry") from None
            address = b"\x03" + bytes((len(name),)) + name
        else:
            address = (b"\x01" if ip.version == 4 else b"\x04") + ip.packed
        return b"\x05\x01\x00" + address + self._port.to_bytes(2, "big")

    def feed(self, data: bytes) -> bytes:
        if self.open:
            raise TunnelError("the SOCKS proxy sent bytes before the origin spoke")
        self._buf += data
        buf = self._buf
        if self._step == "method":
            if len(buf) < 2:
                return b""
            if buf[0] != 5:
                raise TunnelError(f"not a SOCKS5 answer (version {buf[0]})")
            method = buf[1]
            if len(buf) > 2:
                raise TunnelError("the SOCKS proxy sent more than its method choice")
            del buf[:2]
            if method == 0:
                self._step = "reply"
                return self._request()
            if method == 2 and self._proxy.username is not None:
                self._step = "auth"
                user = self._proxy.username.encode()
                password = (self._proxy.password or "").encode()
                return bytes((1, len(user))) + user + bytes((len(password),)) + password
            if method == 0xFF:
                raise TunnelError("the SOCKS proxy accepts none of our methods (credentials wanted?)")
            raise TunnelError(f"the SOCKS proxy chose a method we did not offer ({method})")
        if self._step == "auth":
            if len(buf) < 2:
                return b""
            if len(buf) > 2 or buf[0] != 1:
                raise TunnelError("not an RFC 1929 answer")
            if buf[1] != 0:
                raise TunnelError("the SOCKS proxy refused the credentials")
            del buf[:2]
            self._step = "reply"
            return self._request()
        # the reply: VER REP RSV ATYP BND.ADDR BND.PORT
        if len(buf) < 5:
            return b""
        if buf[0] != 5 or buf[2] != 0:
            raise TunnelError("not a SOCKS5 reply")
        if buf[1] != 0:
            raise TunnelError(f"the SOCKS proxy could not connect: {_REPLIES.get(buf[1], f'reply {buf[1]}')}")
        atyp = buf[3]
        if atyp == 1:
            size = 4 + 4 + 2
        elif atyp == 4:
            size = 4 + 16 + 2
        elif atyp == 3:
            size = 4 + 1 + buf[4] + 2
        else:
            raise TunnelError(f"the SOCKS reply's address type {atyp} is not one RFC 1928 has")
        if len(buf) < size:
            return b""
        if len(buf) > size:
            raise TunnelError("the SOCKS proxy sent bytes before the origin spoke")
        buf.clear()
        self.open = True
        return b""


async def connect_proxy(proxy: Proxy, loop: asyncio.AbstractEventLoop) -> socket.socket:
    """A connected socket to the proxy itself. Its address is the operator's choice: no target policy judges
    it. ProxyFailed when it cannot be reached."""
    try:
        infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ProxyFailed(proxy, f"cannot resolve: {exc}") from None
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise ProxyFailed(proxy, f"cannot connect: {error or 'no address'}")


async def _exchange(proxy: Proxy, sock: socket.socket, host: str, port: int,
                    loop: asyncio.AbstractEventLoop) -> None:
    if proxy.scheme == "http":
        answer = ConnectAnswer()
        await loop.sock_sendall(sock, connect_request(proxy, host, port))
        while True:
            data = await loop.sock_recv(sock, _READ)
            if not data:
                raise TunnelError("the proxy closed the connection during CONNECT")
            if answer.feed(data):
                return
    socks = Socks5(proxy, host, port)
    await loop.sock_sendall(sock, socks.start())
    while not socks.open:
        data = await loop.sock_recv(sock, _READ)
        if not data:
            raise TunnelError("the SOCKS proxy closed the connection")
        out = socks.feed(data)
        if out:
            await loop.sock_sendall(sock, out)


async def open_tunnel(proxy: Proxy, host: str, port: int, timeout: float | None) -> socket.socket:
    """A socket through the proxy to host:port, ready for TLS or HTTP; the whole exchange within ``timeout``.
    ProxyFailed for every failure of the proxy (unreachable, slow, refusing, not speaking its protocol)."""
    loop = asyncio.get_running_loop()
    sock: socket.socket | None = None
    try:
        async with asyncio.timeout(timeout):
            sock = await connect_proxy(proxy, loop)
            await _exchange(proxy, sock, host, port, loop)
            return sock
    except TimeoutError:
        if sock is not None:
            sock.close()
        raise ProxyFailed(proxy, f"no tunnel to {_authority(host, port)} within {timeout} s") from None
    except (TunnelError, OSError) as exc:
        if sock is not None:
            sock.close()
        raise ProxyFailed(proxy, str(exc)[:300]) from None
    except BaseException:
        if sock is not None:
            sock.close()
        raise


async def proxy_socket(proxy: Proxy, host: str, port: int, timeout: float | None, *, tunnel: bool) -> socket.socket:
    """A socket for a request to host:port through proxy: a tunnel to the origin (CONNECT or SOCKS5), or, with
    ``tunnel`` false (an http URL through an HTTP proxy, sent in absolute form), a connection to the proxy
    itself; within ``timeout``. ProxyFailed for any failure of the proxy."""
    if tunnel:
        return await open_tunnel(proxy, host, port, timeout)
    try:
        async with asyncio.timeout(timeout):
            return await connect_proxy(proxy, asyncio.get_running_loop())
    except TimeoutError:
        raise ProxyFailed(proxy, f"no connection within {timeout} s") from None
