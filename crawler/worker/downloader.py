"""Resumable audio downloads: one coroutine per file, resuming from the partial on disk after anything breaks.

A crawl runs for days, so a download never starts over for a reason that does not force it to. A file that
arrives whole within one chunk (``chunk_size``, 1 MiB) is hashed and written straight to the store from memory,
with the other downloads that finished meanwhile in one job off the event loop. A larger one, or one whose
connection is cut, streams into ``audio/partial/<key>.part`` beside a sidecar holding the address, validators
and expected size; the next attempt (in this process or after a restart) asks for ``Range: bytes=<part size>-``
guarded by ``If-Range``, and decides from the answer whether the bytes it already has still belong to the file:

    206 at our offset, same validators and total   append
    200 (range ignored, or If-Range failed)        truncate and take this body from byte 0
    416 with a total equal to what we hold         already complete
    416 otherwise, or any length that disagrees    truncate and ask again from byte 0
    403 / 410 (the link expired)                   re-resolve once; resume if the new address serves the
                                                   same file (same validator or same size), else start over
    network error, 429, 5xx                        resume again, up to ``max_attempts`` without progress

The part file itself is the record of progress: bytes are only ever appended after the decision above, so
whatever length it has is a valid prefix. The sidecar's ``written`` is a checkpoint for people, not the truth.
Every byte received before a cut is written before the resume (the transport hands out what it had buffered
before the error), so the resume asks for exactly the byte where the received data ends.

Requests go straight to the client's transport, as page fetches do, and bodies are read in large pieces: per
download there is one aiohttp request (on the worker's own transport no httpx request or response object at
all: ``AiohttpTransport.get``), a few header look-ups and, per piece, a length check and the hash.

Pages are crawled again (refresh) and one song is linked from many pages, so the same audio comes back again
and again. A finished download leaves a ``Finished`` record under its key (the site's id, else the address),
and the next fetch of that key decides from it:

    verified less than ``revalidate_after`` ago, file on disk     no request at all
    verified earlier                                            conditional GET: 304 confirms it (no body),
                                                                200 is the new file, 403/410 re-resolves
    no record, or the stored file is gone or has the wrong size   download as above

The conditional carries a strong ETag as If-None-Match; Last-Modified as If-Modified-Since only when asking
the address that gave it, because another host's dates say nothing about this file. Within one process, an
address finished under one key also serves another key (two sites' ids for one CDN file), from a bounded
in-memory map.

Limits: at most ``max_per_host`` downloads at once to one host (the host named by the item's address; a
redirect to a CDN counts against the host that sent it), and optionally ``max_downloads`` in all. A download
waits for its host's slot before taking a global one, so a queue for one busy CDN never holds slots the other
hosts could use. Slots are released while re-resolving; hosts nobody holds or waits for are forgotten.

Two fetches of the same key, or of the same address, share one download instead of racing.

Bounds against a hostile server: a total deadline per download, attempts and re-resolves included, of
``deadline_base`` plus the file's size at ``min_rate`` (the size as announced, or as received so far), so a
server that trickles a byte at a time is cut off and the partial kept for a later crawl; a body asked for as
identity but sent encoded is refused (its bytes would not be the file's, and ranges over it mean nothing); and a
finished body whose first bytes are not audio (an HTML error page, an executable) is thrown away as ``not audio``
instead of catalogued.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import aiohttp
import httpx
import yarl

from crawler.bodies import BodyError
from crawler.items import FAILED, OK, AudioItem
from crawler.targets import TargetRefused
from crawler.web import media as sniff
from crawler.web.urls import resolve
from crawler.worker.audiostore import AudioStore, Finished, Sidecar, extension_for, partial_key, write_pieces
from crawler.worker.faults import is_local
from crawler.worker.filetags import read_file_tags
from crawler.worker.transport import AiohttpTransport, Answer

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_EXPIRED = frozenset({403, 410})
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)", re.IGNORECASE)
_CHECKPOINT = 16 * MiB
# Body reads: aiohttp buffers twice this before it stops reading the socket.
_READ_SIZE = 1 * MiB
# Errors the transports raise for a broken connection. The worker's transport maps aiohttp's errors to httpx
# ones; aiohttp's and the loop's own stay caught too, for any transport that lets one through.
_NETWORK_ERRORS = (httpx.TransportError, aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)

Reresolve = Callable[[AudioItem], Awaitable[AudioItem | None]]


@dataclass(frozen=True)
class DownloadConfig:
    max_size: int = 2 * GiB           # larger files are refused before their body is read
    chunk_size: int = 1 * MiB         # buffered before one write + hash; a file up to this size is kept in
                                      # memory and stored whole, with no partial file
    max_attempts: int = 5             # consecutive failed attempts (network, 5xx) that made no progress
    timeout: float = 30.0             # per read (and connect)
    max_redirects: int = 5
    max_restarts: int = 3             # times a download may be thrown away and begun again before giving up
    retry_backoff: float = 1.0        # seconds before the 2nd attempt, doubling, capped at 30
    revalidate_after: float = 86_400.0   # a finished file is trusted this long without asking; 0 = always ask
    max_per_host: int = 2             # downloads at once to one host, so a page full of one CDN's links
                                      # does not hammer it
    max_downloads: int | None = None  # downloads at once in all; None leaves that limit to the caller
    remembered_urls: int = 100_000    # finished addresses kept in memory to serve other keys (LRU)
    deadline_base: float = 120.0      # a whole download may take this long plus its size at min_rate
    min_rate: float = 32 * KiB        # bytes per second

    def __post_init__(self) -> None:
        if self.max_size <= 0 or self.chunk_size <= 0 or self.max_attempts < 1 or self.timeout <= 0 or (
                self.deadline_base <= 0 or self.min_rate <= 0):
            raise ValueError("DownloadConfig: sizes, attempts, timeout, deadline and rate must be positive")
        if self.revalidate_after < 0 or self.max_per_host < 1 or self.remembered_urls < 0 or (
                self.max_downloads is not None and self.max_downloads < 1):
            raise ValueError("DownloadConfig: revalidate_after >= 0, max_per_host >= 1, max_downloads >= 1")


@dataclass
class DownloadStats:
    """What became of the fetches so far: only ``fetched`` moved a file's bytes."""

    reused: int = 0       # a recent record answered, no request made
    confirmed: int = 0    # a 304 said the stored file is still current
    fetched: int = 0      # downloaded (or resumed) to the end
    shared: int = 0       # another fetch of the same key or address did the work


class _Retry(Exception):
    """A transient failure: resume from the partial after a pause."""


class _Restart(Exception):
    """The partial does not belong to what the server now serves: truncate and fetch from byte 0."""


class _Expired(Exception):
    """The address no longer serves us (403/410): it needs re-resolving."""


class _Unchanged(Exception):
    """304 to our conditional request: the finished file is still what the address serves."""

    def __init__(self, response: Answer | httpx.Response) -> None:
        super().__init__("not modified")
        self.etag = response.headers.get("etag") or None
        self.last_modified = response.headers.get("last-modified") or None


class _Fail(Exception):
    """Give up on this item; the message becomes its reason. ``discard`` when the partial is worthless."""

    def __init__(self, reason: str, *, discard: bool = False) -> None:
        super().__init__(reason)
        self.discard = discard


class _Partial:
    """The part file and its running hash. Appends only.

    Nothing touches the disk until bytes must be kept there: a file that arrives whole within one chunk is
    committed straight from memory (``Downloader._finish_from_memory``), with no part file and no sidecar. The
    first batch handed over, or a flush after a cut, creates them (sidecar first, so a part file on disk always
    has the validators of its bytes beside it).

    Writing and hashing run in two threads, one batch of ``chunk_size`` at a time, while the event loop
    receives the next batch: both release the GIL, so a large download keeps up with loopback on spare cores
    and never stalls page fetches on a slow disk. At most two batches are in memory per download. A batch goes
    to the file as the pieces the socket gave (one writev, hashed piece by piece), never joined into a copy.
    """

    def __init__(self, store: AudioStore, key: str, record: Sidecar, chunk_size: int, *, on_disk: bool) -> None:
        self.store, self.key, self.record = store, key, record
        self._fh: BinaryIO | None = None
        self.offset = 0                        # bytes on disk; exact whenever no batch is in flight
        if on_disk:                            # a sidecar vouches for the part file: continue it
            self._fh = open(store.part_path(key), "r+b", buffering=0)
            self.offset = self._fh.seek(0, 2)
        self.received = self.offset            # bytes taken in, including those not yet on disk
        self.hasher = hashlib.sha256()
        self._chunk_size = chunk_size
        self._pieces: list[bytes] = []
        self._pending = 0
        self._writing: asyncio.Future[Any] | None = None
        self._next_checkpoint = self.offset + _CHECKPOINT
        self.deadline: asyncio.Timeout | None = None   # the download's, stretched as its size becomes known
        self.started = 0.0

    @property
    def on_disk(self) -> bool:
        return self._fh is not None

    def head(self, size: int) -> bytes:
        """The file's first bytes: from disk, or from memory while nothing was written."""
        if self._fh is not None:
            return os.pread(self._fh.fileno(), size, 0)
        head = b""
        for piece in self._pieces:
            head += piece[:size - len(head)]
            if len(head) >= size:
                break
        return head

    def in_memory(self) -> list[bytes]:
        """The whole body, for a partial that never went to disk."""
        assert self._fh is None and self._writing is None
        return self._pieces

    async def rehash(self) -> None:
        """Hash the bytes already on disk once, off the event loop: a resumed partial can be a gigabyte."""
        self.hasher = await asyncio.to_thread(_hash_prefix, self.store.part_path(self.key), self.offset)

    def take(self, piece: bytes) -> bool:
        """Queue a piece; True when a batch is full and ``hand_over`` should be awaited."""
        self._pieces.append(piece)
        self._pending += len(piece)
        self.received += len(piece)
        return self._pending >= self._chunk_size

    async def flush(self) -> None:
        """Everything taken in is on disk and hashed when this returns."""
        await self.hand_over()
        await self._drain()
        if self.offset >= self._next_checkpoint:
            self.checkpoint()

    async def hand_over(self) -> None:
        await self._drain()
        if not self._pieces:
            return
        batch, self._pieces, self._pending = self._pieces, [], 0
        # Writing and hashing in two threads at once: a batch then costs the slower of the two, not both.
        self._writing = asyncio.gather(asyncio.to_thread(self._write, batch), asyncio.to_thread(self._hash, batch))

    async def _drain(self) -> None:
        if self._writing is not None:
            writing, self._writing = self._writing, None
            await writing

    def _write(self, batch: list[bytes]) -> None:
        if self._fh is None:
            self.store.save_sidecar(self.key, self.record)
            # "w+b": a part file left without its sidecar (a crash between the two) holds nothing we can vouch for.
            self._fh = open(self.store.part_path(self.key), "w+b", buffering=0)
        write_pieces(self._fh.fileno(), batch)
        self.offset += sum(map(len, batch))

    def _hash(self, batch: list[bytes]) -> None:
        update = self.hasher.update
        for piece in batch:
            update(piece)

    def checkpoint(self) -> None:
        """Record the validators and progress beside the part file (nothing to record before it exists)."""
        if self._fh is None:
            return
        self.record.written = self.offset
        self.store.save_sidecar(self.key, self.record)
        self._next_checkpoint = self.offset + _CHECKPOINT

    async def reset(self, url: str) -> None:
        await self._drain()
        self._pieces, self._pending = [], 0
        self.offset = self.received = 0
        self.hasher = hashlib.sha256()
        self.record = Sidecar(url=url)
        self._next_checkpoint = _CHECKPOINT
        if self._fh is not None:
            self._fh.truncate(0)
            self._fh.seek(0)
            self.store.save_sidecar(self.key, self.record)

    async def aclose(self) -> None:
        # Even when cancelled, let a batch in flight finish: closing the file under a writing thread would
        # let the descriptor number be reused and the write land in some other file.
        if self._writing is not None:
            writing, self._writing = self._writing, None
            try:
                await asyncio.shield(writing)
            except asyncio.CancelledError:
                await asyncio.wait({writing})
                raise
            except Exception:  # noqa: S110 - the write's own error was already raised to the download
                pass
        if self._fh is not None:
            self._fh.close()


@dataclass
class _Commit:
    """A file that came whole in one chunk, waiting to be hashed, stored and recorded."""

    key: str
    pieces: list[bytes]
    size: int
    ext: str
    record: Finished      # all but sha256 and path, which the commit fills in
    tags: bool            # read the file's own tags too, while its bytes are in memory


class _Committer:
    """Stores the files that came whole in one chunk, in batches, in a worker thread.

    Finishing a small download (hash a few KiB, write one file, record it) costs less than one hand-off to a
    thread and back, so the downloads finishing within ``gather`` seconds of each other (or ``full`` of them)
    share one hand-off, and their records one transaction. Their slots are already released, so the wait costs
    no throughput. The queue holds at most one entry per download in flight.
    """

    def __init__(self, store: AudioStore, *, gather: float = 0.01, full: int = 64) -> None:
        self._store = store
        self._queue: list[tuple[_Commit, asyncio.Future[_Committed]]] = []
        self._running = False
        self._timer: asyncio.TimerHandle | None = None
        self._gather, self._full = gather, full

    def commit(self, entry: _Commit) -> asyncio.Future[_Committed]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Committed] = loop.create_future()
        self._queue.append((entry, future))
        if not self._running:
            if len(self._queue) >= self._full:
                self._start(loop)
            elif self._timer is None:
                self._timer = loop.call_later(self._gather, self._start, loop)
        return future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._queue = self._queue[:self._full], self._queue[self._full:]
        self._running = True
        try:
            done = loop.run_in_executor(None, _commit_all, self._store, [entry for entry, _ in batch])
        except RuntimeError as exc:    # the loop is shutting its executor down: fail these, never leave them
            self._running = False
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        done.add_done_callback(lambda f: self._finished(loop, batch, f))

    def _finished(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[_Commit, asyncio.Future[_Committed]]],
                  done: asyncio.Future[list[_Committed | Exception]]) -> None:
        self._running = False
        outcomes = done.result() if not done.cancelled() and done.exception() is None else None
        for i, (_, future) in enumerate(batch):
            if future.done():
                continue      # its download was cancelled; the file was stored anyway
            outcome = outcomes[i] if outcomes is not None else RuntimeError("the store batch did not run")
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if self._queue:
            if len(self._queue) >= self._full:
                self._start(loop)
            elif self._timer is None:
                self._timer = loop.call_later(self._gather, self._start, loop)


_Committed = tuple[Finished, "dict[str, Any] | None"]   # the record, and the file's tags if they were read


def _commit_all(store: AudioStore, entries: list[_Commit]) -> list[_Committed | Exception]:
    shas = []
    for entry in entries:
        hasher = hashlib.sha256()
        for piece in entry.pieces:
            hasher.update(piece)
        shas.append(hasher.hexdigest())
    paths = store.put_many([(sha, entry.pieces, entry.size, entry.ext) for sha, entry in zip(shas, entries)])
    out: list[_Committed | Exception] = []
    records: list[tuple[str, Finished]] = []
    for entry, sha, path in zip(entries, shas, paths):
        if isinstance(path, Exception):    # each file's error is its own download's
            out.append(path)
            continue
        done = dataclasses.replace(entry.record, sha256=sha, path=path)
        tags = None
        if entry.tags:
            data = entry.pieces[0] if len(entry.pieces) == 1 else b"".join(entry.pieces)
            tags = read_file_tags(data, entry.ext)
        out.append((done, tags))
        records.append((entry.key, done))
    with contextlib.suppress(OSError):     # records are a cache: losing them costs a download later
        store.save_finished_many(records)
    return out


class HostSlots:
    """At most ``per_host`` holders per host. Only hosts somebody holds or waits for take memory."""

    def __init__(self, per_host: int) -> None:
        self.per_host = per_host
        self._hosts: dict[str, _Host] = {}

    def __len__(self) -> int:
        return len(self._hosts)

    def holders(self, host: str) -> int:
        entry = self._hosts.get(host)
        return 0 if entry is None else entry.holders

    async def acquire(self, host: str) -> None:
        entry = self._hosts.get(host)
        if entry is None:
            entry = self._hosts[host] = _Host(asyncio.Semaphore(self.per_host))
        entry.users += 1
        try:
            await entry.sem.acquire()
        except BaseException:
            self._leave(host, entry)
            raise
        entry.holders += 1

    def release(self, host: str) -> None:
        entry = self._hosts[host]
        entry.holders -= 1
        entry.sem.release()
        self._leave(host, entry)

    def _leave(self, host: str, entry: _Host) -> None:
        entry.users -= 1
        if entry.users == 0:
            del self._hosts[host]


@dataclass
class _Host:
    sem: asyncio.Semaphore
    users: int = 0        # holders and waiters: the entry may go only when nobody needs its semaphore
    holders: int = 0


class _Lease:
    """One download's slots: its host's, then a global one. Released and taken again around a re-resolve."""

    def __init__(self, hosts: HostSlots, total: asyncio.Semaphore | None) -> None:
        self._hosts, self._total = hosts, total
        self._host: str | None = None
        self._holds_total = False

    async def take(self, host: str) -> None:
        self.release()
        await self._hosts.acquire(host)
        self._host = host
        if self._total is not None:
            await self._total.acquire()
            self._holds_total = True

    def release(self) -> None:
        if self._holds_total:
            assert self._total is not None
            self._total.release()
            self._holds_total = False
        if self._host is not None:
            self._hosts.release(self._host)
            self._host = None


class Downloader:
    def __init__(self, client: httpx.AsyncClient, data_dir: Path, cfg: DownloadConfig, *,
                 clock: Callable[[], float] = time.time, file_tags: bool = False) -> None:
        """file_tags: every item fetched comes back with what its file says about itself (filetags.py)."""
        self.client = client
        self.cfg = cfg
        self.store = AudioStore(data_dir)
        # Requests go straight to the client's transport, as page fetches do (fetcher.PageFetcher): the client's
        # per-request machinery (merging, auth flow, redirect loop, cookies, hooks) costs more than the request.
        # The client's headers are the base; identity, Range and validators are added per request.
        self._transport: httpx.AsyncBaseTransport = client._transport
        headers = client.headers.copy()
        headers["Accept-Encoding"] = "identity"
        self._headers: list[tuple[str, str]] = list(headers.items())
        # Read in large pieces (one per socket read, not per 16 KiB) and bound by our own cap, not the pages'.
        self._extensions = {"timeout": httpx.Timeout(cfg.timeout).as_dict(), "max_body": cfg.max_size + 1,
                            "read_size": _READ_SIZE}
        # The worker's own transport also answers without httpx's request and response objects, which cost as
        # much CPU as the rest of a small file's download (see AiohttpTransport.get); any other goes through httpx.
        transport = self._transport
        self._get = transport.get if isinstance(transport, AiohttpTransport) else None
        self._timeouts = (cfg.timeout, cfg.timeout, cfg.timeout, getattr(transport, "total_timeout", None))
        self._committer = _Committer(self.store)
        self._file_tags = file_tags
        # Tags read while a file's bytes were in memory, for its fetch to take at once (one entry a download).
        self._fresh_tags: dict[str, dict[str, Any]] = {}
        # Reading a stored file's tags blocks on disk: a few threads at most, the rest wait their turn here.
        self._tag_slots = asyncio.Semaphore(2)
        # Wall-clock time: a record's age must mean the same after a restart.
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[AudioItem]] = {}
        self._inflight_urls: dict[str, asyncio.Future[AudioItem]] = {}
        self._by_url: OrderedDict[str, Finished] = OrderedDict()
        self.hosts = HostSlots(cfg.max_per_host)
        self.stats = DownloadStats()
        self._total = asyncio.Semaphore(cfg.max_downloads) if cfg.max_downloads is not None else None
        from crawler.worker.hls import HlsDownloader  # it builds on this module's helpers

        self.hls = HlsDownloader(client, self.store, cfg, clock=clock)

    async def fetch(self, item: AudioItem, reresolve: Reresolve | None = None) -> AudioItem:
        """Download item.url into the store, unless a finished download of it is known to be current.

        Returns the item with sha256/size/content_type/path and status OK, or status FAILED with a reason.
        Network and server misbehaviour never raise; cancellation does, and leaves the partial for next time.
        Waits for a slot of the item's host (and a global one, if configured) before any request.
        With ``file_tags``, an OK item also carries what its file says about itself.
        """
        result = await self._fetch_item(item, reresolve)
        if not self._file_tags or result.status != OK or not result.path:
            return result
        tags = self._fresh_tags.pop(result.path, None)
        if tags is None:
            async with self._tag_slots:
                tags = await asyncio.to_thread(read_file_tags, self.store.root / result.path)
        return result.with_file_tags(tags) if tags else result

    async def _fetch_item(self, item: AudioItem, reresolve: Reresolve | None) -> AudioItem:
        if not item.url:
            return item.replace(status=FAILED, reason="no download address")
        key = partial_key(item)
        while True:
            same_key = self._inflight.get(key)
            running = same_key or self._inflight_urls.get(item.url)
            if running is None:
                break
            try:
                done = await asyncio.shield(running)
            except asyncio.CancelledError:
                if running.cancelled():
                    continue   # its owner was cancelled: take the download over
                raise
            # Another key's download of this address counts only if it ended with this address's bytes.
            if same_key is not None or (done.status == OK and done.url == item.url):
                self.stats.shared += 1
                return self._share(item, done)
        known, own = self._known(key, item.url)
        # A record from the future (the clock was set back) is not trusted: ask the server.
        if known is not None and 0 <= self._clock() - known.verified_at < self.cfg.revalidate_after:
            if not own:
                self._remember(key, known)    # next time this key finds it without the address map
            self.stats.reused += 1
            return _filled(item, known)
        future: asyncio.Future[AudioItem] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self._inflight_urls[item.url] = future
        lease = _Lease(self.hosts, self._total)
        try:
            await lease.take(_host_of(item.url))
            if self.hls.claims(item):     # a playlist of segments, made one file by crawler/worker/hls.py
                result = await self.hls.fetch(item, key, known)
            else:
                result = await self._fetch(item, key, reresolve, known, lease)
        except BaseException:
            future.cancel()
            raise
        finally:
            lease.release()
            del self._inflight[key]
            if self._inflight_urls.get(item.url) is future:
                del self._inflight_urls[item.url]
        future.set_result(result)
        return result

    def _known(self, key: str, url: str) -> tuple[Finished | None, bool]:
        """The finished download to compare with, and whether it is this key's own rather than the address's.

        None when the stored file is gone: a 304 would then confirm bytes nobody has.
        """
        record, own = self.store.load_finished(key), True
        if record is None:
            record, own = self._by_url.get(url), False
            if record is not None:
                self._by_url.move_to_end(url)
        if record is None or not self.store.holds(record):
            return None, False
        return record, own

    def _remember(self, key: str, record: Finished, *, save: bool = True) -> None:
        # The durable record is a cache of what the store holds: failing to write it costs a later
        # download, never this one's result.
        if save:
            with contextlib.suppress(OSError):
                self.store.save_finished(key, record)
        if self.cfg.remembered_urls:
            self._by_url[record.url] = record
            self._by_url.move_to_end(record.url)
            while len(self._by_url) > self.cfg.remembered_urls:
                self._by_url.popitem(last=False)

    def _share(self, item: AudioItem, done: AudioItem) -> AudioItem:
        if done.status != OK or done.sha256 is None or done.path is None:
            return item.replace(status=FAILED, reason=done.reason or "download failed")
        return item.replace(status=OK, reason=None, sha256=done.sha256, size=done.size,
                            content_type=done.content_type, path=done.path)

    async def _fetch(self, item: AudioItem, key: str, reresolve: Reresolve | None, known: Finished | None,
                     lease: _Lease) -> AudioItem:
        try:
            record = self.store.load_sidecar(key)
            partial = _Partial(self.store, key, record or Sidecar(url=item.url), self.cfg.chunk_size,
                               on_disk=record is not None)
        except OSError as exc:
            if is_local(exc):
                raise
            return item.replace(status=FAILED, reason=f"storage: {exc}")
        loop = asyncio.get_running_loop()
        partial.started = loop.time()
        deadline = partial.deadline = asyncio.timeout_at(partial.started + self.cfg.deadline_base)
        try:
            async with deadline:
                return await self._run(item, partial, reresolve, known, lease)
        except TimeoutError:
            if not deadline.expired():
                raise
            await partial.aclose()
            partial.checkpoint()
            return item.replace(status=FAILED, reason=(
                f"download too slow: {partial.received} bytes in {loop.time() - partial.started:.0f} s "
                f"(deadline {self.cfg.deadline_base:.0f} s + size at {self.cfg.min_rate:.0f} B/s)"))
        except _Fail as exc:
            await partial.aclose()
            if exc.discard:
                if partial.on_disk:
                    self.store.discard(key)
            else:
                partial.checkpoint()
            return item.replace(status=FAILED, reason=str(exc))
        except OSError as exc:
            if is_local(exc):
                raise
            return item.replace(status=FAILED, reason=f"storage: {exc}")
        finally:
            await partial.aclose()

    async def _run(self, item: AudioItem, partial: _Partial, reresolve: Reresolve | None,
                   known: Finished | None, lease: _Lease) -> AudioItem:
        current = item
        # A sidecar written for another address (the link was re-resolved since) is judged like a re-resolve.
        new_address = partial.record.url != current.url and partial.offset > 0
        expected = partial.record.expected_size
        if expected is not None and partial.offset > expected:
            await partial.reset(current.url)
        if partial.offset > 0:
            await partial.rehash()
        failures = restarts = 0
        reresolved = False
        while True:
            expected = partial.record.expected_size
            if expected is not None and partial.offset == expected:
                return await self._finish(current, partial, lease)
            before = partial.offset
            try:
                complete = await self._attempt(current, partial, new_address, known)
            except _Unchanged as exc:
                await partial.aclose()
                if partial.on_disk:
                    self.store.discard(partial.key)
                assert known is not None
                return self._confirmed(current, partial.key, known, exc)
            except _Retry as exc:
                await partial.flush()
                partial.checkpoint()
                failures = 0 if partial.offset > before else failures + 1
                if failures >= self.cfg.max_attempts:
                    raise _Fail(f"gave up after {failures} attempts without progress: {exc}") from None
                if self.cfg.retry_backoff > 0 and failures:
                    await asyncio.sleep(min(30.0, self.cfg.retry_backoff * 2 ** (failures - 1)))
                continue
            except _Restart as exc:
                restarts += 1
                if restarts > self.cfg.max_restarts:
                    raise _Fail(f"gave up after {restarts} restarts: {exc}", discard=True) from None
                await partial.reset(current.url)
                new_address = False
                continue
            except _Expired as exc:
                if reresolve is None or reresolved:
                    raise _Fail(f"link expired ({exc})") from None
                reresolved = True
                lease.release()    # resolving asks the site, not the file's host: let others use the slot
                current = await self._reresolve(current, reresolve)
                await lease.take(_host_of(current.url))
                partial.record.url = current.url
                new_address = partial.offset > 0
                continue
            new_address = False
            if complete:
                return await self._finish(current, partial, lease)
            # A clean but short answer; one that brought nothing must not loop for ever.
            failures = 0 if partial.offset > before else failures + 1
            if failures >= self.cfg.max_attempts:
                raise _Fail(f"gave up after {failures} answers without progress")

    async def _reresolve(self, current: AudioItem, reresolve: Reresolve) -> AudioItem:
        try:
            fresh = await reresolve(current)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _Fail(f"link expired and re-resolving failed: {exc!r}") from None
        if fresh is None or fresh.status != OK or not fresh.url:
            raise _Fail("link expired and re-resolving found no address")
        return fresh

    async def _attempt(self, item: AudioItem, partial: _Partial, new_address: bool,
                       known: Finished | None) -> bool:
        """One request and its body. True when the file is complete, False when more is to come.

        Raises _Unchanged when a conditional request was answered 304.
        """
        record = partial.record
        extra = {"Accept-Encoding": "identity"}
        if partial.offset == 0 and known is not None:
            extra.update(_conditional_headers(known, same_address=known.url == item.url))
        conditional = "If-None-Match" in extra or "If-Modified-Since" in extra
        if partial.offset > 0:
            extra["Range"] = f"bytes={partial.offset}-"
            validator = _if_range_validator(record)
            # After a re-resolve the old validator may mean nothing to the new host: judge the 206 ourselves.
            if validator and not new_address:
                extra["If-Range"] = validator
        if not _http_url(item.url):
            raise _Fail(f"not an http(s) address: {item.url[:200]!r}", discard=True)
        try:
            url = _parse_url(item.url)
            origin_host = url.host
            for _ in range(self.cfg.max_redirects + 1):
                headers = _merged_headers(self._headers, {
                    **_identity_headers(item, same_host=url.host == origin_host), **extra})
                response = await self._send(url, headers)
                try:
                    location = response.headers.get("location")
                    if response.status_code in _REDIRECTS and location:
                        url = _parse_url(resolve(str(url), location))
                        if url.scheme not in ("http", "https"):
                            raise _Fail(f"redirect to a non-http address: {str(url)[:200]!r}")
                        continue
                    return await self._consume(response, str(url), partial, new_address, conditional)
                finally:
                    await response.aclose()
        except _NETWORK_ERRORS as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}"[:300]) from None
        except (BodyError, TargetRefused) as exc:
            raise _Fail(str(exc)[:300], discard=partial.received == 0) from None
        except httpx.InvalidURL as exc:
            raise _Fail(f"bad address: {exc}") from None
        raise _Fail(f"more than {self.cfg.max_redirects} redirects")

    async def _send(self, url: yarl.URL, headers: list[tuple[str, str]]) -> Answer | httpx.Response:
        if self._get is not None:
            return await self._get(url, headers, timeout=self._timeouts, max_body=self.cfg.max_size + 1,
                                   read_size=_READ_SIZE)
        request = httpx.Request("GET", str(url), extensions=self._extensions, headers=headers)
        return await self._transport.handle_async_request(request)

    async def _consume(self, response: Answer | httpx.Response, url: str, partial: _Partial, new_address: bool,
                       conditional: bool) -> bool:
        status = response.status_code
        record = partial.record
        # The worker's transport names the coding it took off; any other transport leaves the header.
        coding = response.extensions.get("content_encoding")
        if coding is None:
            coding = response.headers.get("content-encoding", "").strip().lower()
            coding = "" if coding == "identity" else coding
        if coding:
            raise _Fail(f"body sent with Content-Encoding {coding} although identity was asked",
                        discard=partial.offset == 0)
        if status == 304 and conditional:
            raise _Unchanged(response)
        if status in _EXPIRED:
            raise _Expired(f"http {status}")
        if status == 429 or status >= 500:
            raise _Retry(f"http {status}")
        if status == 416:
            m = _UNSATISFIED_RANGE.fullmatch(response.headers.get("content-range", "").strip())
            total = int(m.group(1)) if m else None
            if partial.offset > 0 and total == partial.offset and record.expected_size in (None, total):
                record.expected_size = total
                return True
            raise _Restart(f"http 416: holding {partial.offset} bytes of a {total}-byte file")
        if status == 200:
            if partial.offset > 0:
                # The range was ignored, or If-Range said the file changed: this body is the whole file.
                await partial.reset(record.url)
                record = partial.record
            total = _int_header(response, "content-length")
            self._adopt(response, url, partial, total)
        elif status == 206:
            m = _CONTENT_RANGE.fullmatch(response.headers.get("content-range", "").strip())
            if m is None:
                raise _Restart("206 without a usable Content-Range")
            first, last = int(m.group(1)), int(m.group(2))
            total = None if m.group(3) == "*" else int(m.group(3))
            if first != partial.offset:
                raise _Restart(f"asked for byte {partial.offset}, got a range from {first}")
            length = _int_header(response, "content-length")
            if last < first or (length is not None and length != last - first + 1) or (
                    total is not None and last >= total):
                raise _Restart("Content-Length disagrees with Content-Range")
            if partial.offset > 0 and not _same_file(record, response, total, new_address):
                raise _Restart("the file changed under its address")
            self._adopt(response, url, partial, total)
        else:
            # Keep bytes already fetched: the address may come back, or be re-resolved on a later crawl.
            raise _Fail(f"http {status}", discard=partial.offset == 0)

        expected = partial.record.expected_size
        if expected is not None and expected > self.cfg.max_size:
            raise _Fail(f"too large: {expected} bytes (max {self.cfg.max_size})", discard=True)
        partial.checkpoint()
        self._stretch(partial)
        # A file that fits in one chunk stays in memory and is committed from there (_finish_from_memory).
        whole = not partial.on_disk and expected is not None and expected <= self.cfg.chunk_size
        # A body from byte 0 is judged by its first bytes as soon as they are in: a 2 GiB page of junk served
        # as audio is refused after 4 KiB, not after it was all downloaded. (_finish checks again.)
        head = b"" if partial.received == 0 else None
        max_size = self.cfg.max_size
        try:
            async for piece in cast(AsyncIterable[bytes], response.stream):
                if head is not None:
                    head += piece[:sniff.HEAD_BYTES - len(head)]
                    if len(head) >= sniff.HEAD_BYTES:
                        if not sniff.is_media(head):
                            raise _Fail("not audio", discard=True)
                        head = None
                if partial.take(piece) and not whole:
                    self._stretch(partial)
                    await partial.hand_over()
                received = partial.received
                if received > max_size:
                    raise _Fail(f"too large: more than {max_size} bytes", discard=True)
                if expected is not None and received > expected:
                    raise _Restart(f"body longer than the {expected} bytes announced")
        except BaseException:
            # Bytes that arrived before a connection broke are valid: keep them for the resume.
            await partial.flush()
            raise
        if not (whole and partial.received == expected):
            await partial.flush()
        if expected is None:
            return True
        # False for a 206 that stopped short of the end, cleanly: ask for the rest.
        return partial.received >= expected

    def _stretch(self, partial: _Partial) -> None:
        """Move the download's deadline to base + size / min_rate, the size as announced or as received so far."""
        if partial.deadline is not None:
            size = max(partial.record.expected_size or 0, partial.received)
            partial.deadline.reschedule(partial.started + self.cfg.deadline_base + size / self.cfg.min_rate)

    def _adopt(self, response: Answer | httpx.Response, url: str, partial: _Partial, total: int | None) -> None:
        """Take the validators and size of the response whose body we are about to keep.

        A 206 continuing our bytes that omits a validator keeps the one we had: it was judged the same file.
        """
        record = partial.record
        keep = partial.offset > 0
        record.etag = response.headers.get("etag") or (record.etag if keep else None)
        last_modified = response.headers.get("last-modified")
        record.last_modified = last_modified or (record.last_modified if keep else None)
        if total is not None:
            record.expected_size = total
        ctype = response.headers.get("content-type")
        if ctype:
            record.content_type = ctype.split(";", 1)[0].strip().lower()[:100] or None
        record.final_url = url

    async def _finish(self, item: AudioItem, partial: _Partial, lease: _Lease) -> AudioItem:
        if not partial.on_disk:
            return await self._finish_from_memory(item, partial, lease)
        await partial.flush()
        record = partial.record
        size = partial.offset
        if record.expected_size is not None and size != record.expected_size:
            raise _Fail(f"size {size} disagrees with the server's {record.expected_size}", discard=True)
        if not sniff.is_media(partial.head(sniff.HEAD_BYTES)):
            raise _Fail("not audio", discard=True)
        sha = partial.hasher.hexdigest()
        urls = [item.url] + ([record.final_url] if record.final_url else [])
        ext = extension_for(urls, record.content_type)
        await partial.aclose()
        rel = self.store.commit(partial.key, sha, size, ext)
        return self._finished(item, partial.key, Finished(
            url=item.url, sha256=sha, size=size, path=rel, etag=record.etag,
            last_modified=record.last_modified, content_type=record.content_type, verified_at=self._clock()))

    async def _finish_from_memory(self, item: AudioItem, partial: _Partial, lease: _Lease) -> AudioItem:
        """A file that came whole in one chunk: hashed, stored and recorded in a batch, off the loop."""
        record = partial.record
        size = partial.received
        if record.expected_size is not None and size != record.expected_size:
            raise _Fail(f"size {size} disagrees with the server's {record.expected_size}", discard=True)
        if not sniff.is_media(partial.head(sniff.HEAD_BYTES)):
            raise _Fail("not audio", discard=True)
        urls = [item.url] + ([record.final_url] if record.final_url else [])
        lease.release()    # the server is done with us: the slot is for the next download
        committed = await self._committer.commit(_Commit(
            key=partial.key, pieces=partial.in_memory(), size=size, ext=extension_for(urls, record.content_type),
            record=Finished(url=item.url, sha256="", size=size, path="", etag=record.etag,
                            last_modified=record.last_modified, content_type=record.content_type,
                            verified_at=self._clock()), tags=self._file_tags))
        done, tags = committed
        if tags is not None:
            if len(self._fresh_tags) >= 4096:   # only a fetch cancelled at its very end leaves one behind
                self._fresh_tags.clear()
            self._fresh_tags[done.path] = tags
        return self._finished(item, partial.key, done, saved=True)

    def _finished(self, item: AudioItem, key: str, record: Finished, *, saved: bool = False) -> AudioItem:
        self._remember(key, record, save=not saved)
        self.stats.fetched += 1
        return _filled(item, record)

    def _confirmed(self, item: AudioItem, key: str, known: Finished, answer: _Unchanged) -> AudioItem:
        # A 304 may carry fresher validators (RFC 9110 15.4.5); the address is the one that answered.
        record = dataclasses.replace(known, url=item.url, etag=answer.etag or known.etag,
                                     last_modified=answer.last_modified or known.last_modified,
                                     verified_at=self._clock())
        self._remember(key, record)
        self.stats.confirmed += 1
        return _filled(item, record)


def _same_file(record: Sidecar, response: Answer | httpx.Response, total: int | None, new_address: bool) -> bool:
    etag = response.headers.get("etag") or None
    last_modified = response.headers.get("last-modified") or None
    if record.expected_size is not None and total is not None and total != record.expected_size:
        return False
    if new_address:
        # Another host's validators need not match for the same file; the size is what both can agree on.
        return (record.etag is not None and etag == record.etag) or (
            record.expected_size is not None and total == record.expected_size)
    if record.etag and etag and etag != record.etag:
        return False
    return not (record.last_modified and last_modified and last_modified != record.last_modified
                and not (record.etag and etag))


def _if_range_validator(record: Sidecar) -> str | None:
    # RFC 9110 13.1.5: If-Range takes a strong entity tag; a weak one could approve a different file.
    if record.etag and not record.etag.startswith("W/"):
        return record.etag
    return record.last_modified


def _filled(item: AudioItem, record: Finished) -> AudioItem:
    return item.replace(status=OK, reason=None, sha256=record.sha256, size=record.size,
                        content_type=record.content_type, path=record.path)


def _conditional_headers(known: Finished, *, same_address: bool) -> dict[str, str]:
    # Only a strong ETag: a weak one promises an equivalent file, and evidence must be the same bytes.
    if known.etag and not known.etag.startswith("W/"):
        return {"If-None-Match": known.etag}
    if known.last_modified and same_address:
        return {"If-Modified-Since": known.last_modified}
    return {}


def _host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def _identity_headers(item: AudioItem, *, same_host: bool) -> dict[str, str]:
    """The item's client identity, but across hosts only the User-Agent: cookies must not leak to a CDN."""
    if item.identity is None:
        return {}
    if same_host:
        return item.identity.request_headers()
    return {"User-Agent": item.identity.user_agent} if item.identity.user_agent else {}


def _merged_headers(base: list[tuple[str, str]], overrides: dict[str, str]) -> list[tuple[str, str]]:
    """The client's headers with these set over them: built once as a list, not as three Headers objects."""
    names = {name.lower() for name in overrides}
    return [(k, v) for k, v in base if k.lower() not in names] + list(overrides.items())


def _parse_url(url: str) -> yarl.URL:
    try:
        return yarl.URL(url)
    except (ValueError, TypeError) as exc:
        raise httpx.InvalidURL(str(exc)[:200]) from None


def _http_url(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))


def _int_header(response: Answer | httpx.Response, name: str) -> int | None:
    value = response.headers.get(name)
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def _hash_prefix(path: Path, length: int) -> hashlib._Hash:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        left = length
        while left > 0:
            block = fh.read(min(MiB, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h
