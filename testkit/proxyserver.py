"""A real proxy on loopback for tests and benchmarks: HTTP (absolute-form requests and CONNECT) or SOCKS5 (RFC 1928,
RFC 1929 user/password), optional credentials, its upstream connections bound to a given source address
(127.0.0.2, 127.0.0.3 ...) so a site can tell which proxy a request came through.

Run in a test's loop (``start``) or as its own process (``python -m testkit.proxyserver``, which prints
``listening PORT`` on its first line and a count line on each SIGUSR1), so a test can SIGKILL it mid-crawl.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import h11

MAX_HEAD = 64 * 1024


@dataclass
class Counts:
    connections: int = 0
    requests: int = 0          # absolute-form requests, tunnels (CONNECT, SOCKS) opened
    refused: int = 0           # wrong or missing credentials
    hosts: dict[str, int] = field(default_factory=dict)

    def hit(self, host: str) -> None:
        self.requests += 1
        if host in self.hosts or len(self.hosts) < 1000:
            self.hosts[host] = self.hosts.get(host, 0) + 1


class ProxyServer:
    def __init__(self, kind: str, *, source: str | None = None, credentials: tuple[str, str] | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        assert kind in ("http", "socks5")
        self.kind, self.source, self.credentials = kind, source, credentials
        self.host, self.port = host, port
        self.counts = Counts()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{self.kind}://{self.host}:{self.port}"

    async def start(self) -> ProxyServer:
        self._server = await asyncio.start_server(self._client, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _upstream(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        local = (self.source, 0) if self.source else None
        return await asyncio.open_connection(host, port, local_addr=local)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.counts.connections += 1
        try:
            if self.kind == "http":
                await self._http(reader, writer)
            else:
                await self._socks(reader, writer)
        except (OSError, asyncio.IncompleteReadError, h11.ProtocolError, ValueError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    # -- HTTP ---------------------------------------------------------------------------------------------

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        if self.credentials is None:
            return True
        want = b"Basic " + base64.b64encode(":".join(self.credentials).encode())
        return any(k.lower() == b"proxy-authorization" and v == want for k, v in headers)

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            return
        line, _, rest = head.partition(b"\r\n")
        method, target, _ = line.split(b" ", 2)
        headers = [tuple(x.strip() for x in h.split(b":", 1)) for h in rest.split(b"\r\n") if b":" in h]
        if not self._authorized(headers):  # type: ignore[arg-type]
            self.counts.refused += 1
            writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"t\"\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
            return
        if method == b"CONNECT":
            host, _, port = target.decode().rpartition(":")
            try:
                up_r, up_w = await self._upstream(host.strip("[]"), int(port))
            except OSError:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                return
            self.counts.hit(host)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _splice(reader, writer, up_r, up_w)
            return
        await self._forward(head, reader, writer)

    async def _forward(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Absolute-form requests, one after another on one connection, each sent on in origin form to its
        origin (a connection kept per origin)."""
        client = h11.Connection(h11.SERVER)
        client.receive_data(head)
        upstreams: dict[tuple[str, int], tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]] = {}
        try:
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    client.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, (h11.ConnectionClosed,)) or event is h11.PAUSED:
                    return
                if not isinstance(event, h11.Request):
                    continue
                if not self._authorized(list(event.headers.raw_items())):
                    self.counts.refused += 1
                    writer.write(client.send(h11.Response(status_code=407, headers=[
                        ("Proxy-Authenticate", 'Basic realm="t"'), ("Content-Length", "0")])) or b"")
                    writer.write(client.send(h11.EndOfMessage()) or b"")
                    await writer.drain()
                    client.start_next_cycle()
                    continue
                target = event.target.decode()
                scheme, _, rest = target.partition("://")
                authority, slash, path = rest.partition("/")
                host, _, port = authority.rpartition(":") if authority.count(":") == 1 else (authority, "", "80")
                key = (host, int(port))
                if key not in upstreams:
                    up_r, up_w = await self._upstream(*key)
                    upstreams[key] = (up_r, up_w, h11.Connection(h11.CLIENT))
                up_r, up_w, up = upstreams[key]
                self.counts.hit(host)
                headers = [(k, v) for k, v in event.headers.raw_items() if k.lower() != b"proxy-authorization"]
                up_w.write(up.send(h11.Request(method=event.method, target=slash + path or "/",
                                               headers=headers)) or b"")
                # the request's body, if any
                while True:
                    ev = client.next_event()
                    if ev is h11.NEED_DATA:
                        client.receive_data(await reader.read(65536))
                        continue
                    if isinstance(ev, h11.Data):
                        up_w.write(up.send(ev) or b"")
                    elif isinstance(ev, h11.EndOfMessage):
                        up_w.write(up.send(ev) or b"")
                        break
                # the answer
                while True:
                    ev = up.next_event()
                    if ev is h11.NEED_DATA:
                        up.receive_data(await up_r.read(65536))
                        continue
                    if isinstance(ev, h11.Response):
                        writer.write(client.send(h11.Response(status_code=ev.status_code,
                                                              headers=list(ev.headers.raw_items()),
                                                              reason=ev.reason)) or b"")
                    elif isinstance(ev, h11.InformationalResponse):
                        continue
                    elif isinstance(ev, h11.Data):
                        writer.write(client.send(ev) or b"")
                        await writer.drain()
                    elif isinstance(ev, h11.EndOfMessage):
                        writer.write(client.send(ev) or b"")
                        await writer.drain()
                        break
                    elif isinstance(ev, h11.ConnectionClosed):
                        return
                if up.our_state is h11.DONE and up.their_state is h11.DONE:
                    up.start_next_cycle()
                else:
                    up_w.close()
                    del upstreams[key]
                if client.our_state is h11.MUST_CLOSE or client.their_state is h11.MUST_CLOSE:
                    return
                client.start_next_cycle()
        finally:
            for _, w, _ in upstreams.values():
                w.close()

    # -- SOCKS5 -------------------------------------------------------------------------------------------

    async def _socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        version, count = await reader.readexactly(2)
        if version != 5:
            return
        methods = await reader.readexactly(count)
        want = 2 if self.credentials is not None else 0
        if want not in methods:
            writer.write(b"\x05\xff")
            self.counts.refused += 1
            return
        writer.write(bytes((5, want)))
        if want == 2:
            _, ulen = await reader.readexactly(2)
            user = (await reader.readexactly(ulen)).decode()
            (plen,) = await reader.readexactly(1)
            password = (await reader.readexactly(plen)).decode()
            if (user, password) != self.credentials:
                writer.write(b"\x01\x01")
                self.counts.refused += 1
                return
            writer.write(b"\x01\x00")
        _, command, _, atyp = await reader.readexactly(4)
        if atyp == 3:
            (size,) = await reader.readexactly(1)
            host = (await reader.readexactly(size)).decode("idna")
        elif atyp == 1:
            host = ".".join(str(b) for b in await reader.readexactly(4))
        else:
            import ipaddress
            host = str(ipaddress.IPv6Address(await reader.readexactly(16)))
        port = int.from_bytes(await reader.readexactly(2), "big")
        if command != 1:
            writer.write(b"\x05\x07\x00\x01\0\0\0\0\0\0")
            return
        try:
            up_r, up_w = await self._upstream(host, port)
        except OSError:
            writer.write(b"\x05\x05\x00\x01\0\0\0\0\0\0")
            return
        self.counts.hit(host)
        writer.write(b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x00")
        await _splice(reader, writer, up_r, up_w)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(OSError):
            dst.write_eof()


async def _splice(ar: asyncio.StreamReader, aw: asyncio.StreamWriter, br: asyncio.StreamReader,
                  bw: asyncio.StreamWriter) -> None:
    try:
        await asyncio.gather(_pipe(ar, bw), _pipe(br, aw))
    finally:
        bw.close()


def read_credentials(path: Path) -> tuple[str, str]:
    user, _, password = path.read_text().splitlines()[0].strip().partition(":")
    return user, password


async def _serve(args: argparse.Namespace) -> None:
    creds = read_credentials(Path(args.credentials_file)) if args.credentials_file else None
    server = await ProxyServer(args.kind, source=args.source, credentials=creds, host=args.host,
                               port=args.port).start()
    print(f"listening {server.port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(
        f"requests {server.counts.requests} connections {server.counts.connections} "
        f"refused {server.counts.refused}", flush=True))
    await stop.wait()
    await server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kind", choices=("http", "socks5"), default="http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--source", default=None, help="the source address of upstream connections")
    parser.add_argument("--credentials-file", default=None, help="user:password on its first line")
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
