"""A loopback file server that honours byte ranges, counts what it serves and misbehaves on demand.

Raw asyncio streams rather than a web framework, because the interesting cases need control a framework hides:
cutting a connection after exactly N body bytes, holding a response half sent, lying about a length.

Every switch is a field of the served ``Resource``; tests flip them between (or during) requests. The server
listens on 127.0.0.1 and on 127.0.0.2 as well (also loopback on Linux) so a redirect can change host, and so
per-host limits can be watched: ``active`` and ``peak`` count requests being answered at once, per address.
It answers If-None-Match and If-Modified-Since with 304 like an origin server, unless told to ignore them.

    async with RangeServer() as srv:
        res = srv.add("/a.mp3", data)
        res.drops = [1000, 50_000]        # cut the connection when the body passes these file offsets
        url = srv.url("/a.mp3")
        ...
        assert srv.served("/a.mp3") <= len(data) + ...
        await srv.wait_until(lambda: srv.active["127.0.0.1"] == 2)   # woken by the server, not by polling

``ThreadedRangeServer`` runs one in a background thread for code that is not async (a subprocess test, a
script), and ``python -m tests.fakes.rangeserver FILE`` serves one file from its own process for benchmarks.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

from testkit.ports import on_one_port

_PIECE = 64 * 1024
_MAX_HEAD = 16 * 1024

_REASONS = {200: "OK", 206: "Partial Content", 302: "Found", 304: "Not Modified", 400: "Bad Request",
            403: "Forbidden", 404: "Not Found", 410: "Gone", 416: "Range Not Satisfiable",
            500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass
class Resource:
    """One served path: its bytes, its validators and the misbehaviour switched on for it."""

    path: str
    data: bytes | None = None
    file: Path | None = None
    etag: str | None = None
    last_modified: str | None = None
    content_type: str = "audio/mpeg"
    # -- switches --
    ignore_ranges: bool = False          # answer 200 with the whole body even to a valid Range
    drops: list[int] = field(default_factory=list)   # file offsets at which to cut the connection, each once
    drop_reset: bool = False             # cut with RST instead of FIN
    pause_at: int | None = None          # send up to this file offset, then hold until released or closed
    rate: float | None = None            # bytes per second: makes the link, not the client, the slow side
    expires_at: float | None = None      # server clock time after which the path answers `expired_status`
    expired_status: int = 403
    expires_after_requests: int | None = None   # requests beyond this many answer `expired_status`
    ignore_if_range: bool = False        # serve the range even when If-Range does not match (a broken cache)
    user_agent: str | None = None        # only this User-Agent gets the bytes; others get 403
    redirect_to: str | None = None       # answer 302 to this absolute URL
    bad_range_length: bool = False       # 206 whose Content-Length disagrees with its Content-Range
    fail_status: list[int] = field(default_factory=list)  # statuses to answer, one per request, first
    ignore_conditionals: bool = False    # answer 200 even when If-None-Match / If-Modified-Since match
    on_drop: Callable[[Resource], None] | None = None      # runs after each cut: "the file changed meanwhile"
    render: Callable[[], bytes] | None = None  # the body made anew for each request (a page with a clock in it)
    # -- counters --
    served: int = 0                      # body bytes handed to the socket
    requests: int = 0

    @property
    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        assert self.file is not None
        return self.file.stat().st_size


@dataclass(frozen=True)
class RequestRecord:
    host: str                 # the address the request came in on
    path: str
    headers: dict[str, str]   # lower-cased names
    status: int


class RangeServer:
    def __init__(self, *, second_host: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self._hosts = ["127.0.0.1"] + (["127.0.0.2"] if second_host else [])
        self._clock = clock
        self._resources: dict[str, Resource] = {}
        self._servers: list[asyncio.AbstractServer] = []
        self._handlers: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release = asyncio.Event()
        self.port = 0
        self.log: list[RequestRecord] = []
        self.active: Counter[str] = Counter()    # requests being answered now, by listening address
        self.peak: Counter[str] = Counter()      # the most ever answered at once, by listening address
        self.peak_total = 0                      # the most ever answered at once on all addresses together
        self._watchers: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    # -- lifecycle --

    async def start(self) -> RangeServer:
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        async def listen(host: str, port: int) -> int:
            srv = await asyncio.start_server(self._handle, host, port, limit=_MAX_HEAD)
            self._servers.append(srv)
            return int(srv.sockets[0].getsockname()[1])

        async def undo() -> None:
            for srv in self._servers:
                srv.close()
                await srv.wait_closed()
            self._servers.clear()

        port = await on_one_port(self._hosts, listen, undo)
        self.port = port
        return self

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()
        # Cutting the connections ends their handlers; cancelling them upsets asyncio's stream callback.
        for writer in list(self._handlers.values()):
            writer.transport.abort()
        self._release.set()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        for srv in self._servers:
            await srv.wait_closed()
        self._servers.clear()

    async def __aenter__(self) -> RangeServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- registration and switches --

    def add(self, path: str, data: bytes | None = None, *, file: Path | None = None,
            etag: str | None = "auto", last_modified: str | None = "auto",
            content_type: str = "audio/mpeg") -> Resource:
        if (data is None) == (file is None):
            raise ValueError("give exactly one of data or file")
        res = Resource(path=path, data=data, file=file, content_type=content_type)
        res.etag = _etag_for(res) if etag == "auto" else etag
        res.last_modified = (formatdate(1_700_000_000, usegmt=True) if last_modified == "auto"
                             else last_modified)
        self._resources[path] = res
        return res

    def resource(self, path: str) -> Resource:
        return self._resources[path]

    def replace_content(self, path: str, data: bytes, *, keep_etag: bool = False) -> None:
        """The file behind a path changes (a re-encode, a different take): new bytes, new validators."""
        res = self._resources[path]
        res.data, res.file = data, None
        if not keep_etag:
            res.etag = _etag_for(res) if res.etag is not None else None
            if res.last_modified is not None:
                res.last_modified = formatdate(1_800_000_000, usegmt=True)

    def remove(self, path: str) -> None:
        """The path is gone: it answers 404 from now on."""
        del self._resources[path]

    def drop_random(self, path: str, count: int, seed: int) -> list[int]:
        res = self._resources[path]
        res.drops = sorted(random.Random(seed).sample(range(1, res.size), count))
        return list(res.drops)

    def expire(self, path: str, after: float = 0.0, status: int = 403) -> None:
        self._resources[path].expires_at = self._clock() + after
        self._resources[path].expired_status = status

    def release(self) -> None:
        """Let every paused response carry on (callable from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._release.set)

    def served(self, path: str) -> int:
        return self._resources[path].served

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until predicate() holds; it is checked whenever a request starts, is logged or ends."""
        if predicate():
            return
        entry = (predicate, asyncio.get_running_loop().create_future())
        self._watchers.append(entry)
        try:
            await asyncio.wait_for(entry[1], timeout)
        finally:
            self._watchers.remove(entry)

    def _changed(self) -> None:
        for predicate, waiter in self._watchers:
            if not waiter.done() and predicate():
                waiter.set_result(None)

    # -- serving --

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers[task] = writer
        writer.transport.set_write_buffer_limits(high=_PIECE)
        host = writer.get_extra_info("sockname")[0]
        try:
            while await self._counted_request(host, reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._handlers.pop(task, None)
            writer.close()

    async def _counted_request(self, host: str, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> bool:
        head = await reader.readuntil(b"\r\n\r\n")
        self.active[host] += 1
        self.peak[host] = max(self.peak[host], self.active[host])
        self.peak_total = max(self.peak_total, self.active.total())
        self._changed()
        try:
            return await self._one_request(host, head, reader, writer)
        finally:
            self.active[host] -= 1
            self._changed()

    async def _one_request(self, host: str, head: bytes, reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        keep_alive = headers.get("connection", "").lower() != "close"
        path = target.split("?", 1)[0]
        res = self._resources.get(path)

        def record(status: int) -> None:
            self.log.append(RequestRecord(host, target, headers, status))
            self._changed()

        if res is None:
            record(404)
            await _send_head(writer, 404, {"Content-Length": "0"})
            return keep_alive
        res.requests += 1
        if res.render is not None:
            res.data, res.file = res.render(), None
        if res.fail_status:
            status = res.fail_status.pop(0)
            record(status)
            await _send_head(writer, status, {"Content-Length": "0"})
            return keep_alive
        if res.redirect_to is not None:
            record(302)
            await _send_head(writer, 302, {"Location": res.redirect_to, "Content-Length": "0"})
            return keep_alive
        if (res.expires_at is not None and self._clock() >= res.expires_at) or (
                res.expires_after_requests is not None and res.requests > res.expires_after_requests):
            record(res.expired_status)
            await _send_head(writer, res.expired_status, {"Content-Length": "0"})
            return keep_alive
        if res.user_agent is not None and headers.get("user-agent") != res.user_agent:
            record(403)
            await _send_head(writer, 403, {"Content-Length": "0"})
            return keep_alive

        size = res.size
        base = {"Content-Type": res.content_type, "Accept-Ranges": "bytes"}
        if res.etag:
            base["ETag"] = res.etag
        if res.last_modified:
            base["Last-Modified"] = res.last_modified

        if not res.ignore_conditionals and _not_modified(headers, res):
            record(304)
            await _send_head(writer, 304, {k: v for k, v in base.items() if k in ("ETag", "Last-Modified")})
            return keep_alive

        start, end = 0, size - 1
        status = 200
        wanted = _parse_range(headers.get("range"))
        if wanted is not None and not res.ignore_ranges and (
                res.ignore_if_range or _if_range_holds(headers.get("if-range"), res)):
            first, last = wanted
            if first >= size:
                record(416)
                await _send_head(writer, 416,
                                 {**base, "Content-Range": f"bytes */{size}", "Content-Length": "0"})
                return keep_alive
            start, end, status = first, min(last, size - 1), 206
        length = end - start + 1
        head_fields = {**base, "Content-Length": str(length)}
        if status == 206:
            head_fields["Content-Range"] = f"bytes {start}-{end}/{size}"
            if res.bad_range_length:
                head_fields["Content-Length"] = str(max(0, length - 100))
                length = max(0, length - 100)
        record(status)
        await _send_head(writer, status, head_fields)
        if method == "HEAD":
            return keep_alive
        return await self._send_body(res, writer, reader, start, length) and keep_alive

    async def _send_body(self, res: Resource, writer: asyncio.StreamWriter, reader: asyncio.StreamReader,
                         start: int, length: int) -> bool:
        """Returns False when the connection was cut on purpose."""
        pos, stop = start, start + length
        plain = not res.drops and res.pause_at is None and res.rate is None and res.data is None
        if plain:
            # Fast path for the benchmark: the kernel copies file to socket.
            assert res.file is not None
            with open(res.file, "rb") as fh:
                await writer.drain()
                sent = await asyncio.get_running_loop().sendfile(writer.transport, fh, start, length)
            res.served += sent
            return True
        data = res.data   # this response's bytes, even if the test swaps the content mid-response
        fh = open(res.file, "rb") if data is None else None
        try:
            while pos < stop:
                limit = stop
                cut = next((d for d in res.drops if pos < d <= stop), None)
                if cut is not None:
                    limit = cut
                if res.pause_at is not None and pos < res.pause_at <= limit:
                    limit = res.pause_at
                n = min(_PIECE, limit - pos)
                if data is not None:
                    piece = data[pos:pos + n]
                else:
                    assert fh is not None
                    fh.seek(pos)
                    piece = fh.read(n)
                writer.write(piece)
                await writer.drain()
                res.served += n
                pos += n
                if res.rate:
                    await asyncio.sleep(n / res.rate)
                if cut is not None and pos == cut:
                    res.drops.remove(cut)
                    if res.drop_reset:
                        writer.transport.abort()
                    else:
                        writer.close()
                    if res.on_drop is not None:
                        res.on_drop(res)
                    return False
                if res.pause_at is not None and pos == res.pause_at:
                    res.pause_at = None
                    if not await self._held(reader):
                        return False
            return True
        finally:
            if fh is not None:
                fh.close()

    async def _held(self, reader: asyncio.StreamReader) -> bool:
        """Wait for release() or for the client to go away; True if the response should carry on."""
        released = asyncio.ensure_future(self._release.wait())
        gone = asyncio.ensure_future(reader.read(1))
        done, pending = await asyncio.wait({released, gone}, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return released in done and gone not in done


class ThreadedRangeServer:
    """A RangeServer on its own event loop in a daemon thread, for callers that are not async."""

    def __init__(self, **kwargs: object) -> None:
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.server: RangeServer

    def __enter__(self) -> RangeServer:
        self._thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._make(), self._loop).result(10)
        return self.server

    async def _make(self) -> RangeServer:
        return await RangeServer(**self._kwargs).start()  # type: ignore[arg-type]

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def _send_head(writer: asyncio.StreamWriter, status: int, fields: dict[str, str]) -> None:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in fields.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()


def _parse_range(value: str | None) -> tuple[int, int] | None:
    """One ``bytes=a-b`` or ``bytes=a-`` range; anything else is ignored, as RFC 9110 allows."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, _, last = value[6:].partition("-")
    try:
        if not first:
            return None
        return int(first), int(last) if last else 2**63
    except ValueError:
        return None


def _if_range_holds(value: str | None, res: Resource) -> bool:
    if value is None:
        return True
    if value.startswith(('"', 'W/')):
        return res.etag is not None and value == res.etag and not value.startswith("W/")
    return res.last_modified is not None and value == res.last_modified


def _not_modified(headers: dict[str, str], res: Resource) -> bool:
    """RFC 9110 13.1.2-3: If-None-Match (weak comparison) decides when present; else If-Modified-Since."""
    inm = headers.get("if-none-match")
    if inm is not None:
        if res.etag is None:
            return False
        tags = [t.strip() for t in inm.split(",")]
        return "*" in tags or res.etag.removeprefix("W/") in (t.removeprefix("W/") for t in tags)
    ims = headers.get("if-modified-since")
    if ims is None or res.last_modified is None:
        return False
    try:
        return parsedate_to_datetime(res.last_modified) <= parsedate_to_datetime(ims)
    except (TypeError, ValueError):
        return False


def _etag_for(res: Resource) -> str:
    h = hashlib.sha1()
    if res.data is not None:
        h.update(res.data)
    else:
        assert res.file is not None
        st = res.file.stat()
        h.update(f"{st.st_size}-{st.st_mtime_ns}".encode())
    return f'"{h.hexdigest()[:16]}"'


def _main() -> None:
    """Serve one file from this process until killed; prints the URL on stdout."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--path", default="/bench.bin")
    args = ap.parse_args()

    async def run() -> None:
        srv = RangeServer(second_host=False)
        srv.add(args.path, file=args.file)
        await srv.start()
        print(srv.url(args.path), flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    _main()
