"""A live stream recorded for a window: what a live HLS playlist, a dynamic DASH presentation and an internet radio
station (ICY) share once their bytes arrive.

A stream has no end to download, so each visit records ``live_record_seconds`` of it (the worker's key) into one
file: the recorders (hls.py's live playlists, dash.py's dynamic presentations, icy.py's stations) append the audio
they receive to a ``Recorder`` until the ``Window`` closes, and ``finish`` stores it by content like any download.
The catalogue row says what was recorded (the ``extra`` keys below); the next visit of the page records a new
window, which the master keeps as the item's history.

Item fields of a recording (``recorded``):

    duration                 seconds of audio recorded (the window, or less when the stream ended or stalled)
    sha256, size, path       of the recorded file
    title                    for a station, its ``icy-name`` when the page named the item nothing better
    extra.live               True
    extra.format             "hls", "dash" or "icy"
    extra.recorded_at        wall-clock time (epoch seconds) of the recording's first byte
    extra.played             for a station: [{"offset": seconds into the recording, "title": StreamTitle}, ...]
                             in order, the title on air when the recording began at offset 0

The downloader's rules for every recording (downloader.py and transfer.py's ``LiveLease``): it is never answered
from a finished download's record or another key's download of the same address (``is_live``: the item says so
before it is fetched; a recording leaves no such record behind), it runs under a deadline that covers the
window, it holds one slot of its host for the window only, and two items of one stream fetched at once share
one recording (``shared`` gives the second item the first one's fields; the keys it copies are ``SHARED``:
a recorder that adds keys of its own to the row names them there).

A recording is not resumed: the window that a kill cut short is lost, and the next visit records a new one; its part
file is removed when a new recording of the same item begins. The recording's bytes go to disk off the event loop,
in batches (``FLUSH_BYTES``), hashed on the way; ``max_size`` bounds the file like any download.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawler.items import LIVE, OK, PLAYED, RECORDED_AT, AudioItem, says_live
from crawler.worker.audiostore import AudioStore, Finished

ICY = "icy"
FLUSH_BYTES = 64 * 1024           # received audio held before one write: 4 s of a 128 kbit/s stream, so a
                                  # worker recording a thousand stations holds 64 MB of it, not 256
MAX_PLAYED = 1_000                # title changes kept per recording: a station that changes it every frame is
                                  # not telling us what it plays
MAX_PLAYED_TITLE = 300            # characters
# The row's fields a recording sets in ``extra``, carried to the items that share it (``shared``).
SHARED = (LIVE, "format", RECORDED_AT, PLAYED, "gaps", "segments", "stopped")


class RecordingTooLarge(Exception):
    """The recording reached the download's ``max_size``: it is stored as far as it got."""


@dataclass(frozen=True, slots=True)
class Window:
    """When a recording began (wall clock, for the catalogue) and when it must end (``monotonic``, the clock the
    recorder waits on): ``seconds`` after it began."""

    started_at: float
    start: float
    seconds: float

    @classmethod
    def open(cls, seconds: float, *, clock: Callable[[], float] = time.time,
             monotonic: Callable[[], float] = time.monotonic) -> Window:
        return cls(started_at=clock(), start=monotonic(), seconds=seconds)

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def left(self, now: float) -> float:
        """Seconds of the window left at monotonic time ``now`` (0 once it closed)."""
        return max(0.0, self.end - now)

    def closed(self, now: float) -> bool:
        return now >= self.end


class Recorder:
    """One recording's file: audio appended in order, written and hashed off the event loop in batches, stored by
    content at ``finish``. Not resumable (see the module's note); ``discard`` drops what was written."""

    def __init__(self, store: AudioStore, key: str, max_size: int) -> None:
        self.store, self.key, self.max_size = store, key, max_size
        self.size = 0
        self.first = b""                  # the recording's first bytes, to name its container
        self._hasher = hashlib.sha256()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._fh: Any = None

    @property
    def part(self) -> Path:
        return self.store.part_path(self.key)

    async def open(self) -> None:
        self._fh = await asyncio.to_thread(_open_new, self.part)

    async def append(self, data: bytes) -> None:
        """Take the next bytes of audio; raises RecordingTooLarge (after taking what fits) at ``max_size``."""
        if not data:
            return
        room = self.max_size - self.size
        over = len(data) > room
        if over:
            data = data[:room]
        if len(self.first) < 16:
            self.first += data[:16 - len(self.first)]
        self.size += len(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= FLUSH_BYTES or over:
            await self.flush()
        if over:
            raise RecordingTooLarge(f"too large: more than {self.max_size} bytes")

    async def flush(self) -> None:
        if not self._pending:
            return
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        # Off the loop, and never abandoned: the file must not close under a writing thread.
        writing = asyncio.ensure_future(asyncio.to_thread(_write, self._fh, self._hasher, pieces))
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            await asyncio.wait({writing})
            raise

    async def finish(self, url: str, ext: str, content_type: str, clock: Callable[[], float] = time.time) -> Finished:
        """The recording stored by content (nothing is kept as the item's finished download: a stream is recorded
        again on every visit)."""
        await self.flush()
        await asyncio.to_thread(self._fh.close)
        rel = await asyncio.to_thread(self.store.commit, self.key, self._hasher.hexdigest(), self.size, ext)
        return Finished(url=url, sha256=self._hasher.hexdigest(), size=self.size, path=rel,
                        content_type=content_type, verified_at=clock())

    async def discard(self) -> None:
        if self._fh is not None:
            await asyncio.to_thread(self._fh.close)
        self.part.unlink(missing_ok=True)


def recorded(item: AudioItem, record: Finished, window: Window, duration: float, fmt: str,
             played: list[dict[str, Any]] | None = None, station: str | None = None) -> AudioItem:
    """The item as its recording left it (the fields in the module's note)."""
    extra: dict[str, Any] = {**item.extra, LIVE: True, "format": fmt, RECORDED_AT: round(window.started_at, 3)}
    if played is not None:
        extra[PLAYED] = played[:MAX_PLAYED]
    return item.replace(status=OK, reason=None, sha256=record.sha256, size=record.size, path=record.path,
                        content_type=record.content_type, duration=round(duration, 3) or None,
                        title=item.title or (station[:MAX_PLAYED_TITLE] if station else None), extra=extra)


def is_live(item: AudioItem) -> bool:
    """Whether the item is known to be a live stream before it is fetched (``extra.live``: a page, a station
    list or an earlier visit said so): then no finished download's record answers for it."""
    return says_live(item.extra)


def shared(item: AudioItem, done: AudioItem) -> AudioItem:
    """``item`` (another page's listing of the same stream, fetched at the same time) as the recording ``done``
    left it: the same file, duration and recording fields."""
    extra = {**item.extra, **{k: done.extra[k] for k in SHARED if k in done.extra}}
    return item.replace(status=done.status, reason=done.reason, sha256=done.sha256, size=done.size,
                        path=done.path, content_type=done.content_type, duration=done.duration,
                        title=item.title or done.title, extra=extra)


def live_key(key: str) -> str:
    """The part file's key of a recording of the item whose download key is ``key``."""
    return f"{key}.live"


def _open_new(path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def _write(fh: Any, hasher: Any, pieces: list[bytes]) -> None:
    for piece in pieces:
        fh.write(piece)
        hasher.update(piece)
    fh.flush()
