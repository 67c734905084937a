"""Serve a generated demo site on loopback, with the misbehaviour real sites show switched on per path.

Static files go out through aiohttp's FileResponse (sendfile, Range, ETag, Last-Modified). aiohttp reads an
If-Range header only as a date, so an entity-tag If-Range would be ignored and a stale partial download resumed
with the wrong bytes; this server decides If-Range itself (RFC 9110 13.1.5) and hands FileResponse a request
that either keeps or drops the Range.

The low-level aiohttp server is used (no router, no middlewares): every request lands in one handler, which keeps
the per-request cost near the bare minimum for the throughput benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import unquote

from aiohttp import hdrs, web
from aiohttp.helpers import parse_http_date

try:
    from testkit import sitegen
except ImportError:   # run as a file: its own directory is on sys.path, the repository root may not be
    import sitegen  # type: ignore[no-redef]

FALLBACK_CONTENT_TYPE = "application/octet-stream"
# Plain GETs of files up to this size are read in the event loop and sent from memory: FileResponse's two
# thread-pool hops per request (open+stat, close) cost more than the whole small response.
SMALL_FILE = 128 * 1024
# With any of these the request goes through FileResponse, which owns the Range and conditional logic.
_CONDITIONAL = (hdrs.RANGE, hdrs.IF_RANGE, hdrs.IF_MATCH, hdrs.IF_NONE_MATCH, hdrs.IF_MODIFIED_SINCE,
                hdrs.IF_UNMODIFIED_SINCE)


@dataclass(frozen=True)
class Behaviour:
    """Per-path misbehaviour; all off by default. Keys are regular expressions searched in the decoded path
    (anchor them with ^ and $ to match whole paths); the first matching key wins."""

    slow_paths: Mapping[str, float] = field(default_factory=dict)      # delay in seconds before answering
    # A request for a matching path waits until its event is set: a site that stalls until the test lets it go
    # (every worker then holds what it was given, a state a test can act in).
    gates: Mapping[str, asyncio.Event] = field(default_factory=dict)
    broken_paths: Mapping[str, float] = field(default_factory=dict)    # fraction of the body sent, then drop
    broken_times: int | None = None    # a broken path breaks this many times, then is served whole (None: always)
    ua_bound: Mapping[str, str] = field(default_factory=dict)          # User-Agent must contain this, else 403
    status_overrides: Mapping[str, int] = field(default_factory=dict)  # answer with this status instead
    record_log: bool = False
    # When set, a request from any other source address has its connection dropped unanswered (a site that
    # admits only certain exits, as one behind an allow list of proxies).
    peers: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for frac in self.broken_paths.values():
            if not 0 <= frac < 1:
                raise ValueError("a broken path's fraction must be in [0, 1)")


@dataclass(frozen=True, slots=True)
class LogEntry:
    time: float              # time.monotonic() when the request arrived
    method: str
    path: str                # as sent on the request line, query included
    status: int
    user_agent: str | None
    bytes_sent: int          # body bytes handed to the socket (a broken response: what went before the drop)
    range: str | None = None
    ended: float = 0.0       # time.monotonic() when the answer was sent (or dropped): concurrency checks read it
    peer: str = ""           # the address the request came from


def _compile(rules: Mapping[str, object]) -> tuple[tuple[re.Pattern[str], object], ...]:
    return tuple((re.compile(k), v) for k, v in rules.items())


def _first(rules: tuple[tuple[re.Pattern[str], object], ...], path: str) -> object | None:
    for rx, value in rules:
        if rx.search(path):
            return value
    return None


def _content_type(path: str) -> str:
    if path.startswith(sitegen.STREAM_PREFIX):
        return sitegen.STREAM_CONTENT_TYPE
    return sitegen.CONTENT_TYPES.get(os.path.splitext(path)[1].lower(), FALLBACK_CONTENT_TYPE)


def _etag(st: os.stat_result) -> str:
    # The same validator FileResponse sends, so a client's stored ETag compares equal.
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'


def if_range_holds(header: str, st: os.stat_result) -> bool:
    """RFC 9110 13.1.5: the Range applies only when the If-Range validator still names this representation.
    An entity-tag must match strongly (a weak tag never does); a date must equal Last-Modified exactly."""
    header = header.strip()
    if header.startswith(('"', "W/")):
        return header == _etag(st)
    when = parse_http_date(header)
    return when is not None and int(when.timestamp()) == int(st.st_mtime)


class _FileResponse(web.FileResponse):
    # The handler sends the file itself to learn the final status for the log; aiohttp then calls prepare()
    # again, which FileResponse (unlike StreamResponse) would run a second time.
    async def prepare(self, request: web.BaseRequest):  # type: ignore[override]
        if self.prepared:
            return None
        return await super().prepare(request)


def _page(status: int, text: str, headers: Mapping[str, str] | None = None) -> web.Response:
    body = f"<!doctype html>\n<html><head><title>{status} {text}</title></head><body><h1>{text}</h1></body></html>\n"
    return web.Response(status=status, text=body, content_type="text/html", headers=headers)


class _Site:
    def __init__(self, root: Path, behaviour: Behaviour) -> None:
        self.root = str(root)
        self.behaviour = behaviour
        self.redirects: dict[str, sitegen.Redirect] = sitegen.load_redirects(root)
        self.slow = _compile(behaviour.slow_paths)
        self.gates = _compile(behaviour.gates)
        self.broken = _compile(behaviour.broken_paths)
        self.ua_bound = _compile(behaviour.ua_bound)
        self.status = _compile(behaviour.status_overrides)
        self.breaks: dict[str, int] = {}
        self.log: list[LogEntry] = []
        self.stalled: list[str] = []   # the paths of the requests waiting at a gate now

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = time.monotonic()
        peer = request.remote or ""
        if self.behaviour.peers and peer not in self.behaviour.peers:
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError(f"{peer} is not an admitted source address")
        sent = 0
        resp: web.StreamResponse | None = None
        try:
            resp, sent = await self.respond(request)
            return resp
        finally:
            if self.behaviour.record_log:
                self.log.append(LogEntry(arrived, request.method, request.raw_path,
                                         resp.status if resp is not None else 0,
                                         request.headers.get(hdrs.USER_AGENT), sent,
                                         request.headers.get(hdrs.RANGE), time.monotonic(), peer))

    async def respond(self, request: web.BaseRequest) -> tuple[web.StreamResponse, int]:
        """Answer the request, having sent it already, and say how many body bytes went out."""
        resp, file, st = await self.decide(request)
        if file is None:
            await resp.prepare(request)
            await resp.write_eof()
            body = getattr(resp, "body", None)
            return resp, 0 if request.method == "HEAD" or not body else len(body)
        assert st is not None
        path = self.decoded_path(request)
        frac = _first(self.broken, path) if self.broken else None
        if frac is not None and request.method == "GET" and self.may_break(path):
            return await self.send_broken(request, file, st, float(frac))  # type: ignore[arg-type]
        ir = request.headers.get(hdrs.IF_RANGE)
        if ir is not None:
            headers = request.headers.copy()
            del headers[hdrs.IF_RANGE]
            if not if_range_holds(ir, st):
                headers.popall(hdrs.RANGE, None)
            request = request.clone(headers=headers)
        await resp.prepare(request)
        sent = (resp.content_length or 0) if resp.status in (200, 206) and request.method == "GET" else 0
        return resp, sent

    @staticmethod
    def decoded_path(request: web.BaseRequest) -> str:
        return unquote(request.raw_path.partition("?")[0])

    async def decide(self, request: web.BaseRequest
                     ) -> tuple[web.StreamResponse, str | None, os.stat_result | None]:
        """The response to send, and for a file the file and its stat."""
        if request.method not in ("GET", "HEAD"):
            return _page(405, "Method not allowed", {"Allow": "GET, HEAD"}), None, None
        path = self.decoded_path(request)
        segments = path.split("/")
        if not path.startswith("/") or "\x00" in path or "\\" in path or ".." in segments or "." in segments:
            return _page(403, "Forbidden"), None, None
        if self.slow:
            delay = _first(self.slow, path)
            if delay:
                await asyncio.sleep(float(delay))  # type: ignore[arg-type]
        if self.gates:
            gate = _first(self.gates, path)
            if isinstance(gate, asyncio.Event) and not gate.is_set():
                self.stalled.append(path)
                try:
                    await gate.wait()
                finally:
                    self.stalled.remove(path)
        if self.ua_bound:
            needed = _first(self.ua_bound, path)
            if needed is not None and str(needed) not in request.headers.get(hdrs.USER_AGENT, ""):
                return _page(403, "This link belongs to another client"), None, None
        if self.status:
            code = _first(self.status, path)
            if code is not None:
                code = int(code)  # type: ignore[call-overload]
                headers = {"Retry-After": "1"} if code in (429, 503) else None
                return _page(code, f"Status {code}", headers), None, None
        target = self.redirects.get(path)
        if target is not None:
            return _page(target.status, "Moved", {hdrs.LOCATION: target.location}), None, None
        if segments[1].startswith(("_", ".")) or path[1:] in sitegen.UNSERVED_FILES:
            return _page(404, "Not found"), None, None
        file = os.path.join(self.root, path[1:])
        if path.endswith("/"):
            file = os.path.join(file, "index.html")
        if not os.path.normpath(file).startswith(self.root + os.sep):
            return _page(403, "Forbidden"), None, None
        try:
            st = os.stat(file)
        except (FileNotFoundError, NotADirectoryError):
            return _page(404, "Not found"), None, None
        if stat.S_ISDIR(st.st_mode):
            return _page(301, "Moved", {hdrs.LOCATION: path + "/"}), None, None
        if not stat.S_ISREG(st.st_mode):
            return _page(403, "Forbidden"), None, None
        ctype = _content_type(file[len(self.root):])
        if (st.st_size <= SMALL_FILE and not any(h in request.headers for h in _CONDITIONAL)
                and (not self.broken or _first(self.broken, path) is None)):
            # A blocking read on purpose: a page-cache hit costs less than the thread hop that would avoid it.
            with open(file, "rb") as f:
                body = f.read()
            resp = web.Response(body=body, headers={hdrs.CONTENT_TYPE: ctype, hdrs.ACCEPT_RANGES: "bytes"})
            resp.etag = _etag(st)[1:-1]
            resp.last_modified = st.st_mtime
            return resp, None, None
        return _FileResponse(file, headers={hdrs.CONTENT_TYPE: ctype}), file, st

    def may_break(self, path: str) -> bool:
        limit = self.behaviour.broken_times
        if limit is None:
            return True
        done = self.breaks.get(path, 0)
        if done >= limit:
            return False
        self.breaks[path] = done + 1
        return True

    async def send_broken(self, request: web.BaseRequest, file: str, st: os.stat_result,
                          fraction: float) -> tuple[web.StreamResponse, int]:
        """Promise the whole body (or range), send a fraction of it, then drop the connection."""
        size = st.st_size
        start, end, status = 0, size, 200
        ir = request.headers.get(hdrs.IF_RANGE)
        if hdrs.RANGE in request.headers and (ir is None or if_range_holds(ir, st)):
            try:
                rng = request.http_range
            except ValueError:
                rng = slice(None)
            if rng.start is not None:
                start = rng.start if rng.start >= 0 else max(0, size + rng.start)
                end = min(rng.stop if rng.stop is not None else size, size)
                status = 206
                if start >= size:
                    return await self.prepared(request, _page(416, "Range not satisfiable",
                                                              {hdrs.CONTENT_RANGE: f"bytes */{size}"})), 0
        ctype = _content_type(file[len(self.root):])
        resp = web.StreamResponse(status=status, headers={hdrs.CONTENT_TYPE: ctype, hdrs.ACCEPT_RANGES: "bytes",
                                                          hdrs.ETAG: _etag(st)})
        resp.last_modified = st.st_mtime
        resp.content_length = end - start
        if status == 206:
            resp.headers[hdrs.CONTENT_RANGE] = f"bytes {start}-{end - 1}/{size}"
        with open(file, "rb") as f:
            f.seek(start)
            chunk = f.read(int((end - start) * fraction))
        await resp.prepare(request)
        await resp.write(chunk)
        assert request.transport is not None
        # close(), not abort(): the partial body is flushed first, then the peer sees the end of the stream
        # before the promised Content-Length, which is what a dropped download looks like.
        request.transport.close()
        return resp, len(chunk)

    @staticmethod
    async def prepared(request: web.BaseRequest, resp: web.Response) -> web.Response:
        await resp.prepare(request)
        await resp.write_eof()
        return resp


@dataclass
class RunningSite:
    url: str
    host: str
    port: int
    site_dir: Path
    behaviour: Behaviour
    log: list[LogEntry]
    stalled: list[str]        # the paths of the requests waiting at one of behaviour.gates now
    _runner: web.ServerRunner

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start(site_dir: Path, host: str = "127.0.0.1", port: int = 0, *,
                behaviour: Behaviour | None = None) -> RunningSite:
    """Serve site_dir on host:port (0: any free port) until close()."""
    root = Path(site_dir).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"no site directory at {root}")
    behaviour = behaviour or Behaviour()
    site = _Site(root, behaviour)
    server = web.Server(site.handle, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    tcp = web.TCPSite(runner, host, port, backlog=1024)
    await tcp.start()
    bound = runner.addresses[0][1]
    return RunningSite(url=f"http://{host}:{bound}", host=host, port=bound, site_dir=root, behaviour=behaviour,
                       log=site.log, stalled=site.stalled, _runner=runner)


def _pairs(values: list[str], cast: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for v in values:
        key, sep, val = v.rpartition("=")
        if not sep or not key:
            raise SystemExit(f"expected REGEX=VALUE, got {v!r}")
        out[key] = cast(val)
    return out


async def _serve(args: argparse.Namespace) -> None:
    behaviour = Behaviour(slow_paths=_pairs(args.slow, float), broken_paths=_pairs(args.broken, float),
                          status_overrides=_pairs(args.status, int), ua_bound=_pairs(args.ua, str))
    site = await start(args.site_dir, args.host, args.port, behaviour=behaviour)
    print(site.url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await site.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Serve a generated demo site on loopback.")
    ap.add_argument("site_dir", type=Path)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--slow", action="append", default=[], metavar="REGEX=SECONDS")
    ap.add_argument("--broken", action="append", default=[], metavar="REGEX=FRACTION")
    ap.add_argument("--status", action="append", default=[], metavar="REGEX=CODE")
    ap.add_argument("--ua", action="append", default=[], metavar="REGEX=SUBSTRING")
    args = ap.parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except (FileNotFoundError, OSError) as e:
        print(f"siteserver: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
