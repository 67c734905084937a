"""Resumable audio downloads: one coroutine per file, resuming from the partial on disk after anything breaks.

A crawl runs for days, so a download never starts over for a reason that does not force it to. A file that
arrives whole within one chunk (``chunk_size``, 1 MiB) is hashed and written straight to the store from memory,
with the other downloads that finished meanwhile in one job off the event loop. A larger one, or one whose
connection is cut, streams into ``audio/partial/<key>.part`` beside a sidecar holding the address, validators
and expected size; the next attempt (in this process or after a restart) asks for ``Range: bytes=<part size>-``
guarded by ``If-Range``, and decides from the answer whether the bytes it already has still belong to the file:
append, take the body from byte 0 instead, call the file complete, ask again from byte 0, re-resolve an expired
link once, retry after a pause, or give up keeping or discarding the bytes. That decision is pure code, with its
table, in download_plan.py; this module gathers its inputs (the partial on disk, the response's head, the limits)
and carries out what it returns. The partial is an ``audiostore.Partial``: this module calls it, it calls
nothing back.

The part file itself is the record of progress: bytes are only ever appended after the decision above, so
whatever length it has is a valid prefix. The sidecar's ``written`` is a checkpoint for people, not the truth.
Every byte received before a cut is written before the resume (the transport hands out what it had buffered
before the error), so the resume asks for exactly the byte where the received data ends.

Requests take the lean path of the Getter the downloader is handed (crawler/http/getter.py), as page fetches do,
and bodies are read in large pieces: per download there is one request (on the worker's own stack no httpx request
or response object at all: http1.py), a few header look-ups and, per piece, a length check and the hash.

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

Live streams (a live HLS playlist, a dynamic DASH presentation, a radio station) are recorded, not downloaded:
each visit records a new window of ``live_record_seconds`` (recording.py), and the rules above bend for them:

    reuse        none: an item that says it is live (``recording.is_live``) is never answered from a finished
                 record or the address map, and a recording leaves neither behind (a recorder's result returns
                 straight from its dispatch point, never through ``_finished``/``_remember``); each visit
                 records anew
    deadline     the whole-download deadline covers the window plus one read timeout past ``deadline_base``
                 (``Deadline.cover``), from the moment the recorder opens its window
    host slot    the item's one host slot (and its global one), from before the first request until the
                 recorder is done with the network: given back when the window closes, before the file is
                 stored; the worker's download ask slot (``transferred``) goes with it
    sharing      two items of one stream fetched at once share one recording, as any download of one address
                 does, and the second gets the recording's fields (``recording.shared``)

One mechanism carries these to every recorder: at its dispatch point the downloader makes the download's
``LiveLease`` (``Downloader._lease(slots, deadline)``: transfer.py's ``LiveLease(seconds, timeout, deadline,
release)``), hands it to the recorder, and the recorder calls ``lease.opened()`` when its window opens and
``lease.closed()`` when it is done with the network (the downloader's ``finally`` gives the slot back anyway).
hls.py's live branch gets it through ``HlsDownloader.fetch(..., lease=)`` and passes it to ``livehls.LiveHls``.

Bounds against a hostile server: a total deadline per download (an HLS one too, over all its segments),
attempts and re-resolves included, of ``deadline_base`` plus the file's size at ``min_rate`` (the size as
announced, or as received so far), so a server that trickles a byte at a time is cut off and the partial kept
for a later crawl; a body asked for as identity but sent encoded is refused (its bytes would not be the
file's, and ranges over it mean nothing); and a finished body whose first bytes are not audio (an HTML error
page, an executable) is thrown away as ``not audio`` instead of catalogued.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import httpx
import yarl

from crawler.archive import NO_ARCHIVE, Archive, NoArchive
from crawler.http.bodies import BodyError
from crawler.http.getter import Getter
from crawler.http.http1 import Answer, header_list, parse_url
from crawler.http.targets import TargetRefused
from crawler.items import FAILED, OK, AudioItem
from crawler.web import media
from crawler.web.urls import host_of, resolve
from crawler.worker import download_plan as plan
from crawler.worker.archived import Sent, Trail
from crawler.worker.audiostore import AudioStore, Finished, Partial, extension_for, partial_key
from crawler.worker.faults import is_local
from crawler.worker.filetags import read_file_tags
from crawler.worker import icy
from crawler.worker.dash import DashDownloader
from crawler.worker.hls import HlsDownloader
from crawler.worker.livehls import LiveHls
from crawler.worker.recording import is_live, shared
from crawler.worker.siterules import SiteRules
from crawler.worker.transfer import NETWORK_ERRORS, Deadline, LiveLease, MiB, identity_headers
# The downloader's settings, defined beside what it shares with hls.py and still importable from here.
from crawler.worker.transfer import DownloadConfig as DownloadConfig

# Body reads: aiohttp buffers twice this before it stops reading the socket.
_READ_SIZE = 1 * MiB

Reresolve = Callable[[AudioItem], Awaitable[AudioItem | None]]


@dataclass(frozen=True)
class Started:
    """The first bytes of a file as an earlier answer for its address gave them: a page fetch that turned out to be
    the file (a stream named like a page). The download keeps them as its partial and asks only for the rest
    (Range, guarded by If-Range with that answer's validators), or for nothing when they are the whole file."""

    url: str
    body: bytes                       # the file's first bytes, as received (no content coding)
    size: int | None = None           # the whole file's size, when the answer said it (or the body is all of it)
    etag: str | None = None
    last_modified: str | None = None
    content_type: str | None = None


@dataclass
class DownloadStats:
    """What became of the fetches so far: only ``fetched`` moved a file's bytes."""

    reused: int = 0       # a recent record answered, no request made
    confirmed: int = 0    # a 304 said the stored file is still current
    fetched: int = 0      # downloaded (or resumed) to the end
    shared: int = 0       # another fetch of the same key or address did the work

    def __str__(self) -> str:   # for the log and the operator, not a repr
        return (f"{self.fetched} fetched, {self.reused} reused, {self.confirmed} confirmed unchanged, "
                f"{self.shared} shared")


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
    no throughput. The files waiting here are bytes in memory: a download hands its file over only once those
    are under ``max_bytes`` (room()), so a disk slower than the network holds the downloads back, not memory.
    """

    def __init__(self, store: AudioStore, *, gather: float = 0.05, full: int = 64,
                 max_bytes: int = 16 * MiB) -> None:
        self._store = store
        self._queue: list[tuple[_Commit, asyncio.Future[_Committed]]] = []
        self._running = False
        self._timer: asyncio.TimerHandle | None = None
        self._gather, self._full = gather, full
        self._bytes, self._max_bytes = 0, max_bytes     # of the files queued and being stored
        self._room: list[asyncio.Future[None]] = []     # downloads waiting for _bytes to fall under max_bytes

    async def room(self) -> None:
        """Returns once the files held here are under max_bytes (one more file may take it past the bound)."""
        while self._bytes >= self._max_bytes:
            waiter = asyncio.get_running_loop().create_future()
            self._room.append(waiter)
            await waiter

    def commit(self, entry: _Commit) -> asyncio.Future[_Committed]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Committed] = loop.create_future()
        self._queue.append((entry, future))
        self._bytes += entry.size
        if not self._running:
            self._schedule(loop)
        return future

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a batch now when one is full (or memory is), else when the gather time is up."""
        if len(self._queue) >= self._full or self._bytes >= self._max_bytes:
            self._start(loop)
        elif self._timer is None:
            self._timer = loop.call_later(self._gather, self._start, loop)

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
            self._bytes -= sum(entry.size for entry, _ in batch)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        done.add_done_callback(lambda f: self._finished(loop, batch, f))

    def _finished(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[_Commit, asyncio.Future[_Committed]]],
                  done: asyncio.Future[list[_Committed | Exception]]) -> None:
        self._running = False
        self._bytes -= sum(entry.size for entry, _ in batch)
        waiters, self._room = self._room, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
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
            self._schedule(loop)


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


class _DownloadSlots:
    """One download's slots: its host's, then a global one. Released and taken again around a re-resolve."""

    def __init__(self, hosts: HostSlots, total: asyncio.Semaphore | None,
                 transferred: Callable[[], None] | None = None) -> None:
        self._hosts, self._total = hosts, total
        self._host: str | None = None
        self._holds_total = False
        self._transferred = transferred

    def done_with_host(self) -> None:
        """A live recording is done with the network: its slots go, and the caller's ``transferred`` with them."""
        self.release()
        self.handed_over()

    def handed_over(self) -> None:
        """The file's bytes are in the store's hands: the caller's `transferred` is called (once)."""
        transferred, self._transferred = self._transferred, None
        if transferred is not None:
            transferred()

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
    def __init__(self, http: Getter, data_dir: Path, cfg: DownloadConfig, *,
                 clock: Callable[[], float] = time.time, file_tags: bool = False,
                 deadline_clock: DeadlineClock | None = None, archive: Archive = NO_ARCHIVE,
                 audio_payload: bool = False) -> None:
        """http: the stack downloads go through (crawler/http/getter.py); file_tags: every item fetched comes back
        with what its file says about itself (filetags.py); deadline_clock: the monotonic time downloads'
        deadlines are kept in (the running loop's by default); archive: where each exchange of a download goes,
        and a metadata record of each file stored or confirmed (archived.py), with the audio bytes themselves
        only when ``audio_payload``."""
        self.http = http
        self.cfg = cfg
        self._limits = plan.Limits(max_size=cfg.max_size, chunk_size=cfg.chunk_size, max_attempts=cfg.max_attempts,
                                   max_restarts=cfg.max_restarts, retry_backoff=cfg.retry_backoff)
        self.store = AudioStore(data_dir)
        # Requests take the Getter's lean path, as page fetches do (fetcher.PageFetcher): a client's per-request
        # machinery (merging, auth flow, redirect loop, cookies, hooks) costs more than the request.
        # The client's headers are the base; identity, Range and validators are added per request.
        headers = http.client.headers.copy()
        headers["Accept-Encoding"] = "identity"
        # Every audio request asks for a radio station's metadata (icy.py): whether an address is a station is
        # known only from its answer, and asking again once it is known would cost the station a second listener
        # and us a second connection; any other server ignores the header.
        headers[icy.ASK_METADATA[0]] = icy.ASK_METADATA[1]
        self._headers = header_list(headers)
        self.sites = SiteRules()   # the sites' own headers (siterules.py): the worker sets its own
        # Our own read timeout (and connect), the stack's total deadline; read in large pieces (one per socket
        # read, not per 16 KiB) and bound by our own cap, not the pages'.
        self._timeouts = (cfg.timeout, cfg.timeout, cfg.timeout, http.timeouts[3])
        self._committer = _Committer(self.store)
        self._deadlines = _Deadlines(deadline_clock)
        self._file_tags = file_tags
        # Tags read while a file's bytes were in memory, for its fetch to take at once (one entry a download).
        self._fresh_tags: dict[str, dict[str, Any]] = {}
        # Reading a stored file's tags blocks on disk: a few threads at most, the rest wait their turn here.
        self._tag_slots = asyncio.Semaphore(2)
        # Wall-clock time: a record's age must mean the same after a restart.
        self._clock = clock
        self._inflight: dict[str, asyncio.Future[AudioItem]] = {}
        # The store's filter of keys with a record, read once in a thread before the first look-up.
        self._keys_loaded: asyncio.Future[None] | None = None
        self._inflight_urls: dict[str, asyncio.Future[AudioItem]] = {}
        self._by_url: OrderedDict[str, Finished] = OrderedDict()
        self.hosts = HostSlots(cfg.max_per_host)
        self.stats = DownloadStats()
        self._total = asyncio.Semaphore(cfg.max_downloads) if cfg.max_downloads is not None else None
        self._archive = None if isinstance(archive, NoArchive) else archive
        self._audio_payload = audio_payload
        # Live playlists are recorded by livehls.py, on the real clocks (a test may set hls.live to its own).
        self.hls = HlsDownloader(http.client, self.store, cfg, clock=clock, archive=archive,
                                 audio_payload=audio_payload, live=LiveHls(clock=clock))
        self.dash = DashDownloader(http.client, self.store, cfg, clock=clock, archive=archive,
                                   audio_payload=audio_payload)

    async def fetch(self, item: AudioItem, reresolve: Reresolve | None = None, *,
                    transferred: Callable[[], None] | None = None, start: Started | None = None) -> AudioItem:
        """Download item.url into the store, unless a finished download of it is known to be current.

        Returns the item with sha256/size/content_type/path and status OK, or status FAILED with a reason.
        Network and server misbehaviour never raise; cancellation does, and leaves the partial for next time.
        Waits for a slot of the item's host (and a global one, if configured) before any request.
        With ``file_tags``, an OK item also carries what its file says about itself.
        ``transferred`` is called once the file's bytes are in and handed to the store (a file held in memory
        once the store's queue has room for it): what is left of the download is storing the file.
        ``start``: the file's first bytes, already fetched; used when nothing of the file is held or known.
        """
        result = await self._fetch_item(item, reresolve, transferred, start)
        if not self._file_tags or result.status != OK or not result.path:
            return result
        tags = self._fresh_tags.pop(result.path, None)
        if tags is None:
            async with self._tag_slots:
                tags = await asyncio.to_thread(read_file_tags, self.store.root / result.path)
        return result.with_file_tags(tags) if tags else result

    async def _fetch_item(self, item: AudioItem, reresolve: Reresolve | None,
                          transferred: Callable[[], None] | None = None, start: Started | None = None) -> AudioItem:
        if not item.url:
            return item.replace(status=FAILED, reason="no download address")
        key = partial_key(item)
        if self._keys_loaded is None or not self._keys_loaded.done():
            await self._load_keys()
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
        # A live stream is recorded anew on every visit: no record answers for it (the module's table).
        known, own = (None, False) if is_live(item) else self._known(key, item.url)
        # A record from the future (the clock was set back) is not trusted: ask the server.
        if known is not None and 0 <= self._clock() - known.verified_at < self.cfg.revalidate_after:
            if not own:
                self._remember(key, known)    # next time this key finds it without the address map
            self.stats.reused += 1
            return _filled(item, known)
        future: asyncio.Future[AudioItem] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self._inflight_urls[item.url] = future
        slots = _DownloadSlots(self.hosts, self._total, transferred)
        try:
            await slots.take(host_of(item.url))
            ext = media.url_extension(item.url)     # once for both modules' claims
            if self.dash.claims(item, ext):    # a DASH manifest: joined, or recorded when live, by dash.py
                # A live presentation leaves no finished record, so ``known`` is only ever a static one's.
                result = await self._fetch_hls(item, key, known, slots, self.dash.fetch)
            elif self.hls.claims(item, ext):     # a playlist of segments, made one file by crawler/worker/hls.py
                result = await self._fetch_hls(item, key, known, slots)
            else:
                result = await self._fetch(item, key, reresolve, known, slots, start)
        except BaseException:
            future.cancel()
            raise
        finally:
            slots.release()
            del self._inflight[key]
            if self._inflight_urls.get(item.url) is future:
                del self._inflight_urls[item.url]
        future.set_result(result)
        return result

    async def _load_keys(self) -> None:
        if self._keys_loaded is None:
            self._keys_loaded = asyncio.ensure_future(asyncio.to_thread(self.store.load_known_keys))
        with contextlib.suppress(Exception):    # without the filter every look-up asks SQLite: slower, not wrong
            await asyncio.shield(self._keys_loaded)

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
        if is_live(done):
            return shared(item, done)
        if done.status != OK or done.sha256 is None or done.path is None:
            return item.replace(status=FAILED, reason=done.reason or "download failed")
        return item.replace(status=OK, reason=None, sha256=done.sha256, size=done.size,
                            content_type=done.content_type, path=done.path)

    async def _fetch(self, item: AudioItem, key: str, reresolve: Reresolve | None, known: Finished | None,
                     slots: _DownloadSlots, start: Started | None = None) -> AudioItem:
        try:
            partial = self.store.open_partial(key, item.url, self.cfg.chunk_size)
        except OSError as exc:
            if is_local(exc):
                raise
            return item.replace(status=FAILED, reason=f"storage: {exc}")
        if (start is not None and start.url == item.url and known is None and not partial.on_disk
                and start.body and (start.size is None or len(start.body) <= start.size)):
            # The bytes the page fetch read are the file's start: on disk as its partial, the plan resumes after
            # them (or finds the file whole) as after any interruption. When they are the whole file, and it fits
            # in one chunk, they stay in memory and are stored from there, as a file that came whole in one
            # chunk is (no part file, no sidecar: _run finishes it at once).
            partial.describe(etag=start.etag, last_modified=start.last_modified, expected_size=start.size,
                             content_type=start.content_type, final_url=None)
            partial.take(start.body)
            if not (len(start.body) == start.size and start.size <= self.cfg.chunk_size):
                try:
                    await partial.flush()
                except OSError as exc:
                    await partial.discard()
                    if is_local(exc):
                        raise
                    return item.replace(status=FAILED, reason=f"storage: {exc}")
        deadline = Deadline(self._deadlines.now(), self.cfg)
        self._deadlines.keep(deadline)
        trail = None if self._archive is None else Trail(self._archive, item.page, keep_body=self._audio_payload,
                                                         clock=self._clock)
        try:
            try:
                result = await self._run(item, partial, reresolve, known, slots, deadline, trail)
                if deadline.expired:    # it ran out as the download ended: its cancel is taken here, not later
                    await asyncio.sleep(0)
            except asyncio.CancelledError:
                if not deadline.timed_out():
                    raise
                raise TimeoutError from None
            finally:
                self._deadlines.drop(deadline)
            if isinstance(result, plan.Fail):
                if result.discard:
                    await partial.discard()
                else:
                    await partial.aclose()
                    partial.checkpoint()
                return item.replace(status=FAILED, reason=result.reason)
            return result
        except TimeoutError:
            if not deadline.expired:
                raise
            await partial.aclose()
            partial.checkpoint()
            elapsed = self._deadlines.now() - deadline.started
            return item.replace(status=FAILED, reason=_too_slow(partial.received, elapsed, self.cfg))
        except OSError as exc:
            if is_local(exc):
                raise
            return item.replace(status=FAILED, reason=f"storage: {exc}")
        finally:
            if trail is not None:   # an exchange whose file was not stored after all: its digest from the bytes
                await trail.settle(partial)
            await partial.aclose()

    def _lease(self, slots: _DownloadSlots, deadline: Deadline) -> LiveLease:
        """The terms of a live recording started from this download (the module's table of live rules): every
        recorder, HLS, DASH or radio, runs under one made here at its dispatch point."""
        return LiveLease(self.cfg.live_record_seconds, self.cfg.timeout, deadline, slots.done_with_host)

    async def _fetch_hls(self, item: AudioItem, key: str, known: Finished | None, slots: _DownloadSlots,
                         fetch: Callable[..., Awaitable[AudioItem]] | None = None) -> AudioItem:
        """An HLS item (or, with dash.py's ``fetch``, a DASH one) under the same whole-download deadline as a plain
        download: the module stretches it by the bytes it has written, and saves its progress when the deadline's
        cancel reaches it; a live stream is recorded under the download's lease."""
        deadline = Deadline(self._deadlines.now(), self.cfg)
        self._deadlines.keep(deadline)
        try:
            result = await (fetch or self.hls.fetch)(item, key, known, deadline, lease=self._lease(slots, deadline))
            if deadline.expired:    # it ran out as the download ended: its cancel is taken here, not later
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            if not deadline.timed_out():
                raise
            elapsed = self._deadlines.now() - deadline.started
            return item.replace(status=FAILED, reason=_too_slow(deadline.received, elapsed, self.cfg))
        finally:
            self._deadlines.drop(deadline)
        return result

    async def _run(self, item: AudioItem, partial: Partial, reresolve: Reresolve | None,
                   known: Finished | None, slots: _DownloadSlots, deadline: Deadline,
                   trail: Trail | None = None) -> AudioItem | plan.Fail:
        """Attempts until the file is whole or the plan gives up: the loop of ``download_plan.after``."""
        current = item
        if not partial.on_disk and partial.received and plan.whole(partial.received, partial.record.expected_size):
            return await self._finish(current, partial, slots, trail)   # a page fetch's bytes were all of it
        # A sidecar written for another address (the link was re-resolved since) is judged like a re-resolve.
        new_address = partial.record.url != current.url and partial.offset > 0
        if plan.overgrown(partial.offset, partial.record.expected_size):
            await partial.restart(current.url)
        if partial.offset > 0:
            await partial.rehash()
        tries = plan.Tries()
        while True:
            if plan.whole(partial.offset, partial.record.expected_size):
                return await self._finish(current, partial, slots, trail)
            before = partial.offset
            outcome = await self._attempt(current, partial, new_address, known, deadline, slots, trail)
            if isinstance(outcome, AudioItem):      # a radio station's recording (_record_station)
                return outcome
            if isinstance(outcome, plan.Retry):
                # Bytes that arrived before the break are kept, and count as progress.
                await partial.flush()
                partial.checkpoint()
            tries, step = plan.after(tries, outcome, progressed=partial.offset > before,
                                     can_reresolve=reresolve is not None, limits=self._limits)
            if not isinstance(outcome, (plan.Retry, plan.Reresolve)):
                new_address = False     # an answer was judged: the bytes held are this address's now
            if isinstance(step, plan.Finish):
                return await self._finish(current, partial, slots, trail)
            if isinstance(step, plan.Retry):
                if step.delay:
                    await asyncio.sleep(step.delay)
            elif isinstance(step, plan.Restart):
                await partial.restart(current.url)
            elif isinstance(step, plan.Reresolve):
                assert reresolve is not None
                slots.release()    # resolving asks the site, not the file's host: let others use the slot
                fresh = await self._reresolve(current, reresolve)
                if isinstance(fresh, plan.Fail):
                    return fresh
                current = fresh
                await slots.take(host_of(current.url))
                partial.readdress(current.url)
                new_address = partial.offset > 0
            elif isinstance(step, plan.Confirmed):
                await partial.discard()
                assert known is not None
                return self._confirmed(current, partial.key, known, step, trail)
            else:
                return step

    async def _reresolve(self, current: AudioItem, reresolve: Reresolve) -> AudioItem | plan.Fail:
        try:
            fresh = await reresolve(current)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return plan.Fail(f"link expired and re-resolving failed: {exc!r}")
        if fresh is None or fresh.status != OK or not fresh.url:
            return plan.Fail("link expired and re-resolving found no address")
        return fresh

    async def _attempt(self, item: AudioItem, partial: Partial, new_address: bool, known: Finished | None,
                       deadline: Deadline, slots: _DownloadSlots,
                       trail: Trail | None = None) -> plan.Outcome | AudioItem:
        """One request, judged by ``download_plan.decide``, and its body if the plan keeps it; an internet radio
        station's answer is recorded instead (the item as its recording left it)."""
        record = partial.record
        held = plan.Held(offset=partial.offset, etag=record.etag, last_modified=record.last_modified,
                         expected_size=record.expected_size, content_type=record.content_type,
                         on_disk=partial.on_disk, new_address=new_address)
        asked = plan.ask(held, item.url, known)
        if isinstance(asked, plan.Fail):
            return asked
        try:
            url = parse_url(item.url)
            origin_host = url.host
            for _ in range(self.cfg.max_redirects + 1):
                site = self.sites.of(url.host, url.port) if self.sites else None
                headers = _merged_headers(self._headers, {
                    **identity_headers(item, same_host=url.host == origin_host, site=site), **asked.headers})
                started = trail.now() if trail is not None else 0.0
                response = await self._send(url, headers)
                sent = Sent(url, headers, started, response) if trail is not None else None
                try:
                    if response.status_code == 200 and icy.is_stream(response.extensions, response.headers):
                        return await self._record_station(item, partial, response, self._lease(slots, deadline))
                    answer = plan.decide(held, _head(response, str(url), asked.conditional), self._limits)
                    if isinstance(answer, plan.Redirect):
                        url = parse_url(resolve(str(url), answer.location))
                        if url.scheme not in ("http", "https"):
                            return plan.Fail(f"redirect to a non-http address: {str(url)[:200]!r}")
                        continue
                    if isinstance(answer, plan.Body):
                        return await self._read(response, partial, answer, deadline, trail, sent)
                    if isinstance(answer, plan.Complete):
                        partial.expect(answer.size)
                    return answer
                finally:
                    await response.aclose()
                    if sent is not None:
                        assert trail is not None
                        await trail.ended(sent, partial)
        except NETWORK_ERRORS as exc:
            return plan.Retry(f"{type(exc).__name__}: {exc}"[:300])
        except (BodyError, TargetRefused) as exc:
            return plan.Fail(str(exc)[:300], discard=partial.received == 0)
        except httpx.InvalidURL as exc:
            return plan.Fail(f"bad address: {exc}")
        return plan.Fail(f"more than {self.cfg.max_redirects} redirects")

    async def _record_station(self, item: AudioItem, partial: Partial, response: Answer | httpx.Response,
                              lease: LiveLease) -> AudioItem:
        """A station has no end to download: ``live_record_seconds`` of it are recorded from this open answer
        (icy.py) under the download's lease, as every live recording is. Nothing is kept as the key's finished
        download and no Range or resume applies: each visit records anew."""
        return await icy.record_station(item, response, self.store, partial.key, lease=lease,
                                        max_size=self.cfg.max_size, clock=self._clock)

    async def _send(self, url: yarl.URL, headers: list[tuple[str, str]]) -> Answer | httpx.Response:
        return await self.http.get(url, headers, timeout=self._timeouts, max_body=self.cfg.max_size + 1,
                                   read_size=_READ_SIZE)

    async def _read(self, response: Answer | httpx.Response, partial: Partial, body: plan.Body,
                    deadline: Deadline, trail: Trail | None = None, sent: Sent | None = None) -> plan.Outcome:
        """Take the body into the partial, as the plan said: appended, or from byte 0 in place of what was held."""
        if not body.append and partial.offset > 0:
            await partial.restart(partial.record.url)
        partial.describe(etag=body.etag, last_modified=body.last_modified, expected_size=body.expected_size,
                         content_type=body.content_type, final_url=body.final_url)
        partial.checkpoint()
        if sent is not None:
            assert trail is not None
            trail.begin_body(sent, partial)
        expected = body.expected_size
        deadline.stretch(expected, partial.received)
        # A file that fits in one chunk stays in memory and is committed from there (_finish_from_memory).
        in_memory, bound = body.in_memory, body.bound
        first: bytes | None = b"" if body.sniff else None
        try:
            async for piece in cast(AsyncIterable[bytes], response.stream):
                if sent is not None:
                    sent.take(piece)
                if first is not None:
                    first += piece[:plan.FIRST_BYTES - len(first)]
                    if len(first) >= plan.FIRST_BYTES:
                        refused = plan.check_start(first)
                        if refused is not None:
                            if sent is not None:
                                sent.untaken = piece
                            return refused
                        first = None
                if partial.take(piece) and not in_memory:
                    deadline.stretch(expected, partial.received)
                    await partial.hand_over()
                if partial.received > bound:
                    return plan.overrun(partial.received, body, self._limits)
        except BaseException as exc:
            if sent is not None:
                sent.truncated = "time" if isinstance(exc, (httpx.TimeoutException, asyncio.CancelledError)) \
                    else "disconnect"
            # Bytes that arrived before a connection broke are valid: keep them for the resume.
            await partial.flush()
            raise
        if sent is not None:
            sent.truncated = ""
        if not (in_memory and partial.received == expected):
            await partial.flush()
        return plan.body_ended(partial.received, expected)

    async def _finish(self, item: AudioItem, partial: Partial, slots: _DownloadSlots,
                      trail: Trail | None = None) -> AudioItem | plan.Fail:
        if not partial.on_disk:
            return await self._finish_from_memory(item, partial, slots, trail)
        await partial.flush()
        record = partial.record
        size = partial.offset
        refused = plan.check_finished(size, record.expected_size, partial.head(plan.FIRST_BYTES))
        if refused is not None:
            return refused
        slots.release()    # the server is done with us: the slot is for the next download
        slots.handed_over()
        sha = partial.hasher.hexdigest()
        urls = [item.url] + ([record.final_url] if record.final_url else [])
        rel = await partial.commit(sha, extension_for(urls, record.content_type))
        if trail is not None:
            trail.stored(item.url, path=rel, sha256=sha, size=size, content_type=record.content_type)
        return self._finished(item, partial.key, Finished(
            url=item.url, sha256=sha, size=size, path=rel, etag=record.etag,
            last_modified=record.last_modified, content_type=record.content_type, verified_at=self._clock()))

    async def _finish_from_memory(self, item: AudioItem, partial: Partial, slots: _DownloadSlots,
                                  trail: Trail | None = None) -> AudioItem | plan.Fail:
        """A file that came whole in one chunk: hashed, stored and recorded in a batch, off the loop."""
        record = partial.record
        size = partial.received
        refused = plan.check_finished(size, record.expected_size, partial.head(plan.FIRST_BYTES))
        if refused is not None:
            return refused
        urls = [item.url] + ([record.final_url] if record.final_url else [])
        slots.release()    # the server is done with us: the slot is for the next download
        await self._committer.room()
        slots.handed_over()
        committed = await self._committer.commit(_Commit(
            key=partial.key, pieces=partial.in_memory(), size=size, ext=extension_for(urls, record.content_type),
            record=Finished(url=item.url, sha256="", size=size, path="", etag=record.etag,
                            last_modified=record.last_modified, content_type=record.content_type,
                            verified_at=self._clock()), tags=self._file_tags))
        done, tags = committed
        if trail is not None:
            await trail.settle_stored(item.url, path=done.path, sha256=done.sha256, size=done.size,
                                      content_type=done.content_type)
        if tags is not None:
            if len(self._fresh_tags) >= 4096:   # only a fetch cancelled at its very end leaves one behind
                self._fresh_tags.clear()
            self._fresh_tags[done.path] = tags
        return self._finished(item, partial.key, done, saved=True)

    def _finished(self, item: AudioItem, key: str, record: Finished, *, saved: bool = False) -> AudioItem:
        self._remember(key, record, save=not saved)
        self.stats.fetched += 1
        return _filled(item, record)

    def _confirmed(self, item: AudioItem, key: str, known: Finished, answer: plan.Confirmed,
                   trail: Trail | None = None) -> AudioItem:
        # A 304 may carry fresher validators (RFC 9110 15.4.5); the address is the one that answered.
        record = dataclasses.replace(known, url=item.url, etag=answer.etag or known.etag,
                                     last_modified=answer.last_modified or known.last_modified,
                                     verified_at=self._clock())
        self._remember(key, record)
        if trail is not None:    # the address still serves the stored file: the 304's metadata names it
            trail.stored(item.url, path=known.path, sha256=known.sha256, size=known.size,
                         content_type=known.content_type)
        self.stats.confirmed += 1
        return _filled(item, record)


class DeadlineClock(Protocol):
    """What the deadlines need of a clock: its time, and a callback at a time of its own. The running loop is
    one (the default); a test's fake clock is another, and moves time without sleeping."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> _Alarm: ...


class _Alarm(Protocol):
    def when(self) -> float: ...

    def cancel(self) -> None: ...


class _Deadlines:
    """The deadlines of the downloads in progress under one timer, set for the earliest of them when it fires.

    Deadlines only move later, and a new one is rarely earlier than the timer (all start from
    ``deadline_base``), so keeping one costs a dict entry, not a timer of its own. Time is ``clock``'s: the
    running loop's unless one is given."""

    def __init__(self, clock: DeadlineClock | None = None) -> None:
        self._live: dict[Deadline, None] = {}
        self._timer: _Alarm | None = None
        self._clock = clock

    def now(self) -> float:
        return (self._clock or asyncio.get_running_loop()).time()

    def keep(self, deadline: Deadline) -> None:
        self._live[deadline] = None
        # The timer is later only when nothing else is kept but large files' stretched deadlines.
        if self._timer is None or deadline.at < self._timer.when():
            self._arm(deadline.at)

    def drop(self, deadline: Deadline) -> None:
        self._live.pop(deadline, None)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = (self._clock or asyncio.get_running_loop()).call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = self.now()
        for deadline in [d for d in self._live if d.at <= now]:
            del self._live[deadline]
            deadline.expire()
        if self._live:
            self._arm(min(d.at for d in self._live))


def _too_slow(received: int, elapsed: float, cfg: DownloadConfig) -> str:
    return (f"download too slow: {received} bytes in {elapsed:.0f} s "
            f"(deadline {cfg.deadline_base:.0f} s + size at {cfg.min_rate:.0f} B/s)")


def _head(response: Answer | httpx.Response, url: str, conditional: bool) -> plan.Head:
    """What the plan reads of a response: a few header look-ups, no body."""
    headers = response.headers
    # The worker's transport names the coding it took off; any other transport leaves the header.
    coding = response.extensions.get("content_encoding")
    if coding is None:
        coding = headers.get("content-encoding", "").strip().lower()
        coding = "" if coding == "identity" else coding
    return plan.Head(status=response.status_code, url=url, content_range=headers.get("content-range"),
                     content_length=headers.get("content-length"), etag=headers.get("etag") or None,
                     last_modified=headers.get("last-modified") or None, content_type=headers.get("content-type"),
                     content_encoding=coding, location=headers.get("location"), conditional=conditional)


def _filled(item: AudioItem, record: Finished) -> AudioItem:
    return item.replace(status=OK, reason=None, sha256=record.sha256, size=record.size,
                        content_type=record.content_type, path=record.path)


def _merged_headers(base: list[tuple[str, str]], overrides: dict[str, str]) -> list[tuple[str, str]]:
    """The client's headers with these set over them: built once as a list, not as three Headers objects."""
    names = {name.lower() for name in overrides}
    return [(k, v) for k, v in base if k.lower() not in names] + list(overrides.items())


