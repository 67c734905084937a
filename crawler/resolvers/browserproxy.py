"""The browser's only way out: a forward proxy on loopback that resolves names itself and connects only where the
crawl's target policy allows (``crawler/http/targets.py``, the rule every connection of the worker's own client obeys).

Chromium is started with ``--proxy-server=http://127.0.0.1:PORT --proxy-bypass-list=<-loopback>``, so every
request it makes goes here, loopback ones included: documents, scripts, fetch/XHR, WebSockets (Chromium tunnels
``ws:`` and ``wss:`` through CONNECT), HTTPS (CONNECT). Chromium resolves no name of a page itself: the proxy does,
and checks each address after resolution against the policy (public internet, the seeds' ``host:port``,
``crawl.allowed_networks``), then connects to that very address, so a name that resolves elsewhere on a second
look (DNS rebinding) gains nothing. Refused: a 403 answer and nothing sent anywhere.

The proxy's own answers (403 refused, 502 no connection, 400 no request it takes) carry ``X-Crawler-Proxy`` with
a value made for this proxy (``mark``), so the browser's archive (browsercapture.py) records them as requests
that were not let out, not as a site's answers; a site cannot forge the mark, so it cannot pass its own answers
off as ours. Responses relayed for plain ``http:`` keep their heads but for ``Connection: close``.

Through the worker's proxies: when the worker's egress (crawler/http/egress.py) says proxies apply to a host,
the connection is a tunnel through the one it chooses (CONNECT for an HTTP proxy, SOCKS5), with the same
failover and counters as the worker's own requests; the proxy then resolves the name, so the policy judges only
an IP literal (a name's address is the exit's business). A plain ``http:`` request goes through the tunnel too.

Host rules: the same ``--host-resolver-rules`` switch that keeps a test's browser off DNS (``MAP * ~NOTFOUND,
EXCLUDE 127.0.0.1``, ``MAP name 127.0.0.1``) is applied here, since the names are now resolved here.

Bounds: a request head of at most ``MAX_HEAD`` bytes read within ``HEAD_TIMEOUT``; name resolution and the
connection within ``CONNECT_TIMEOUT``; at most ``MAX_CONNECTIONS`` at once (more are closed at once); bytes
are relayed in chunks of ``CHUNK`` with back-pressure, so a connection holds at most a few chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import logging
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from crawler.http.egress import Egress, ProxiesUnavailable, carry
from crawler.http.proxies import Proxy
from crawler.http.targets import TargetPolicy
from crawler.http.tunnel import open_tunnel

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024
HEAD_TIMEOUT = 10.0
CONNECT_TIMEOUT = 10.0
MAX_CONNECTIONS = 256
CHUNK = 64 * 1024
EXITS_KEPT = 1024
RULES_SWITCH = "--host-resolver-rules="
# Hop-by-hop headers of the browser's request to its proxy: not the origin server's business.
_HOP = frozenset({b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"})

Resolve = Callable[[str, int], Awaitable[list[str]]]


class Refused(Exception):
    """The target is not one the browser may reach: its name does not resolve, or no address is allowed."""


@dataclass(frozen=True)
class HostRules:
    """Chromium's ``--host-resolver-rules`` (``MAP pattern replacement`` and ``EXCLUDE pattern``, comma
    separated; ``~NOTFOUND`` as a replacement: no address). An excluded host is resolved as it is; otherwise the
    first MAP whose pattern matches names what to resolve instead; no rule: the host itself."""

    maps: tuple[tuple[str, str], ...] = ()
    excludes: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: Sequence[str]) -> HostRules:
        maps: list[tuple[str, str]] = []
        excludes: list[str] = []
        for arg in args:
            if not arg.startswith(RULES_SWITCH):
                continue
            for rule in arg[len(RULES_SWITCH):].strip('"').split(","):
                words = rule.split()
                if len(words) == 3 and words[0].upper() == "MAP":
                    maps.append((words[1].lower(), words[2]))
                elif len(words) == 2 and words[0].upper() == "EXCLUDE":
                    excludes.append(words[1].lower())
                elif words:
                    raise ValueError(f"host rule {rule.strip()!r}: expected MAP pattern replacement or EXCLUDE "
                                     "pattern")
        return cls(tuple(maps), tuple(excludes))

    def lookup(self, host: str) -> str | None:
        """What to resolve for ``host``; None: nothing (``~NOTFOUND``)."""
        host = host.lower()
        if any(fnmatch.fnmatchcase(host, p) for p in self.excludes):
            return host
        for pattern, replacement in self.maps:
            if fnmatch.fnmatchcase(host, pattern):
                return None if replacement.upper() == "~NOTFOUND" else replacement
        return host


def parse_target(head: bytes) -> tuple[str, str, int, bytes | None]:
    """The request line and headers of one proxy request -> (method, host, port, head to send upstream).

    CONNECT host:port: no head to send (a tunnel). Absolute form (``GET http://host:port/path HTTP/1.1``): the
    head rewritten to origin form, hop-by-hop headers dropped, ``Connection: close`` added so that neither side
    reuses the connection for another host. ValueError for anything else."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1 request line")
    method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    if method == "CONNECT":
        host, _, port_text = target.rpartition(":")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"bad CONNECT target {target[:100]!r}")
        return method, host.strip("[]").lower(), int(port_text), None
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        raise ValueError(f"not an absolute http address: {target[:100]!r}")
    port = url.port or 80      # ValueError for a bad one
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in _HOP]
    upstream = b"\r\n".join([f"{method} {path} HTTP/1.1".encode("ascii"), *kept, b"Connection: close", b"", b""])
    return method, url.hostname.lower(), port, upstream


def close_response_head(head: bytes) -> bytes:
    """The origin's response head with its connection headers replaced by ``Connection: close``: the browser
    then never sends a second request, meant for another host, down this connection."""
    lines = head.split(b"\r\n")
    kept = [line for line in lines[1:] if line and line.split(b":", 1)[0].strip().lower() not in _HOP]
    return b"\r\n".join([lines[0], *kept, b"Connection: close", b"", b""])


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class BrowserProxy:
    """The proxy; ``policy`` is read at every connection (the worker learns its crawl's from the master)."""

    def __init__(self, policy: Callable[[], TargetPolicy], rules: HostRules = HostRules(),
                 resolve: Resolve | None = None, egress: Callable[[], Egress | None] = lambda: None) -> None:
        """egress: the worker's (read at every connection, as it learns its proxies from the master)."""
        self._egress = egress
        self._policy = policy
        self._rules = rules
        self._resolve = resolve or _system_resolve
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.stats = {"connections": 0, "refused": 0}
        self.mark = secrets.token_hex(12)
        # The proxy each origin's last connection went through ("host:port" -> Proxy.label), the most recent
        # EXITS_KEPT: what the browser found there is pinned to it (RequestIdentity.exit).
        self._exits: OrderedDict[str, str] = OrderedDict()

    def exit_of(self, host: str, port: int) -> str | None:
        return self._exits.get(f"{host}:{port}")

    def _answer(self, status: bytes) -> bytes:
        """One of the proxy's own answers: no body, the connection closed, and the proxy's mark."""
        return (b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\nConnection: close\r\nX-Crawler-Proxy: "
                + self.mark.encode() + b"\r\n\r\n")

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()

    async def open(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to ``host:port`` if the policy allows an address it resolves to; Refused otherwise."""
        name = self._rules.lookup(host)
        if name is None:
            raise Refused(f"{host}: no address")
        egress = self._egress()
        if egress is not None and egress.route is not None:
            proxies = egress.route(host, port)
            if proxies:
                return await self._through(egress, proxies, host, name, port)
        async with asyncio.timeout(CONNECT_TIMEOUT):
            try:
                addresses = [name] if _literal(name) else await self._resolve(name, port)
            except OSError as exc:
                raise Refused(f"{host}: {exc}") from None
            policy = self._policy()
            allowed = [a for a in addresses if policy.permits(host, port, a)]
            if not allowed:
                raise Refused(f"{host}:{port} resolves to {addresses[0] if addresses else 'no address'}, "
                              "outside the public internet and not named by the crawl")
            return await asyncio.open_connection(allowed[0], port, limit=MAX_HEAD)

    async def _through(self, egress: Egress, proxies: Sequence[Proxy], host: str, name: str,
                       port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if _literal(name) and not self._policy().permits(host, port, name):
            raise Refused(f"{host}:{port} is outside the public internet and not named by the crawl")
        origin = f"{host}:{port}"

        async def send(proxy: Proxy) -> socket.socket:
            sock = await open_tunnel(proxy, name, port, CONNECT_TIMEOUT)
            self._exits[origin] = proxy.label
            self._exits.move_to_end(origin)
            if len(self._exits) > EXITS_KEPT:
                self._exits.popitem(last=False)
            return sock

        try:
            sock = await carry(egress, origin, proxies, send, asyncio.get_running_loop().time)
        except ProxiesUnavailable as exc:
            raise Refused(str(exc)) from None
        return await asyncio.open_connection(sock=sock, limit=MAX_HEAD)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self._writers.add(writer)
        self.stats["connections"] += 1
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT):
                    head = await reader.readuntil(b"\r\n\r\n")
                method, host, port, request = parse_target(head)
            except (ValueError, UnicodeDecodeError, asyncio.LimitOverrunError):   # no head we take
                writer.write(self._answer(b"400 Bad Request"))
                return
            try:
                up_reader, upstream = await self.open(host, port)
            except Refused as exc:
                self.stats["refused"] += 1
                log.info("browser: refused %s %s:%d: %s", method, host, port, exc)
                writer.write(self._answer(b"403 Forbidden"))
                return
            self._writers.add(upstream)
            if request is None:
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await _relay(reader, writer, up_reader, upstream, None)
            else:
                upstream.write(request)
                await _relay(reader, writer, up_reader, upstream, close_response_head)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            with contextlib.suppress(Exception):
                if upstream is None:
                    writer.write(self._answer(b"502 Bad Gateway"))
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                first: Callable[[bytes], bytes] | None = None) -> None:
    if first is not None:
        try:
            head = await src.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            head = exc.partial
        dst.write(first(head) if head.endswith(b"\r\n\r\n") else head)
        await dst.drain()
    while data := await src.read(CHUNK):
        dst.write(data)
        await dst.drain()


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                 upstream: asyncio.StreamWriter, response_head: Callable[[bytes], bytes] | None) -> None:
    # Both ways until either side is done: an HTTP exchange ends when the origin closes (Connection: close),
    # a tunnel when either end does.
    tasks = [asyncio.ensure_future(_pipe(reader, upstream)),
             asyncio.ensure_future(_pipe(up_reader, writer, response_head))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
