"""A live HLS playlist recorded for a window: the segments a listener would have heard, in order, one file.

hls.py reads the playlist; when it has no EXT-X-ENDLIST it hands it here (``LiveHls``, the ``live`` recorder the
downloader gives ``HlsDownloader``), with the download's ``LiveLease`` (transfer.py). Requests, parsing, keys and
decryption are hls.py's: this module only decides which segment comes next and when to ask again, and writes
what arrives to a ``recording.Recorder``. A master playlist whose chosen rendition is live arrives here as its
media playlist, so it is recorded the same way.

Following the stream (RFC 8216 6.3.3 to 6.3.5; ``Follow`` holds the decisions, with no I/O and time passed in):

    start        at the third-last segment of the playlist as first read, as players start (hls.js, AVPlayer):
                 the RFC asks a client not to start within three target durations of the end. The recording is
                 then what a listener who pressed play as it began heard, so ``recorded_at`` plus an offset
                 into the file is when that audio reached such a listener; and the three segments in hand make
                 up for a late playlist update or a slow segment without a hole at the very start. They also fill
                 the window sooner: the recording holds its host slot for the window less those segments.
    each reload  the segments after the last one recorded, in media-sequence order, none twice. Segments that
                 left the playlist between two reloads (or answered 404/410 when fetched) are a gap: counted in
                 ``extra.gaps``, the recording goes on. More new segments than the time since the last reload
                 explains (one per ``MIN_SEGMENT_SECONDS``, plus three) is not a stream but a flood: all but the
                 newest three are skipped as a gap. A sequence that goes backwards brings nothing new.
    reloads      one target duration after the previous reload began; half of one after a reload that brought
                 nothing new. The target duration counts between ``MIN_RELOAD`` and ``MAX_RELOAD`` seconds (a
                 missing one is the last segment's duration), whatever the playlist says.
    init         an EXT-X-MAP section is written before the first segment that names it, and again only when a
                 segment names another.
    stop         when the audio recorded reaches the window (``live_record_seconds``), when the window's time
                 is up, when EXT-X-ENDLIST appears (its last segments taken), when the playlist has not moved for
                 ``STALL_RELOADS`` target durations, at ``max_size``, or at a segment count no honest stream of
                 that length has (hls.py's ``SEGMENT_ALLOWANCE`` plus one per ``MIN_SEGMENT_SECONDS``). What was
                 recorded is kept, with its real duration.

``duration`` is the sum of the recorded segments' EXTINF durations, each counted at most ``MAX_RELOAD`` seconds.
A recording that got no audio at all fails the item ("nothing recorded"). A refused address (a key or segment on
an address the worker may not reach) fails it at once, keeping nothing; any other error after some audio arrived
ends the recording there (``extra.stopped`` says why), before any fails the item.

Bounds: one segment in memory at a time (hls.py's ``MAX_SEGMENT_BYTES``), one playlist (``MAX_PLAYLIST_BYTES``,
parsed off the loop when large), at most ``MAX_KEYS`` keys; requests are timed by the window: a segment or
reload still running a read timeout after the window's time is up ends the recording; the download's deadline
(the window plus a read timeout past ``deadline_base``) is the backstop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from crawler.items import FAILED, AudioItem
from crawler.worker.hls import (
    MAX_PLAYLIST_BYTES,
    MIN_SEGMENT_SECONDS,
    SEGMENT_ALLOWANCE,
    HlsDownloader,
    HlsError,
    HlsGone,
    HlsRefused,
    MediaPlaylist,
    Segment,
    container,
    parse,
)
from crawler.worker.segments import MAX_SEGMENT_BYTES
from crawler.worker.recording import Recorder, RecordingTooLarge, Window, live_key, recorded
from crawler.worker.transfer import LiveLease

log = logging.getLogger(__name__)

LIVE_EDGE = 3            # segments back from the end a recording starts at, and keeps after a flood
MIN_RELOAD = 1.0         # seconds: the target duration a playlist is reloaded by, at least ...
MAX_RELOAD = 30.0        # ... and at most (real ones are 2 to 10 s)
STALL_RELOADS = 3        # target durations without a new segment before a stream counts as stalled
MAX_KEYS = 16            # keys held for the segments still to come; a stream that rotates more fetches again
MAX_GAPS = 2 ** 31 - 1   # a count kept within what every reader of the row takes as an integer
_IDS_KEPT = 4            # archive record ids kept: the stored file's record refers to the last exchange

Sleep = Callable[[float], Awaitable[object]]
_T = TypeVar("_T")


@dataclass
class Follow:
    """Where a recording of a live playlist stands, and what each reload means for it (the module's table).
    Times are the recorder's monotonic clock."""

    seconds: float                       # audio to record
    started: float                       # when the window opened
    next_seq: int | None = None          # the next segment to record; None before the first reload
    gaps: int = 0                        # segments missed
    duration: float = 0.0                # seconds of audio recorded
    taken: int = 0                       # segments recorded
    target: float = MIN_RELOAD           # the reload interval, clamped
    ended: bool = False                  # the last reload had EXT-X-ENDLIST
    fresh: bool = True                   # the last reload brought new segments
    init: str | None = None              # the initialisation section last written
    moved_at: float = field(init=False)  # when a reload last brought new segments
    reloaded_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.moved_at = self.reloaded_at = self.started

    @property
    def max_segments(self) -> int:
        return SEGMENT_ALLOWANCE + int(self.seconds / MIN_SEGMENT_SECONDS)

    def reload(self, playlist: MediaPlaylist, began: float) -> list[Segment]:
        """The segments to record from this reload of the playlist (begun at ``began``), in order."""
        segments = playlist.segments
        target = playlist.target_duration or (segments[-1].duration if segments else 0.0)
        self.target = min(MAX_RELOAD, max(MIN_RELOAD, target))
        since, self.reloaded_at = began - self.reloaded_at, began
        self.ended = playlist.ended
        take: tuple[Segment, ...]
        if not segments:
            take = ()
        elif self.next_seq is None:
            take = segments[-LIVE_EDGE:]
        else:
            first = segments[0].sequence
            if first > self.next_seq:
                self.gap(first - self.next_seq)
                self.next_seq = first
            take = segments[self.next_seq - first:]      # nothing when the sequence went backwards
            allowed = LIVE_EDGE + math.ceil(max(0.0, since) / MIN_SEGMENT_SECONDS)
            if len(take) > allowed:
                self.gap(len(take) - LIVE_EDGE)
                take = take[-LIVE_EDGE:]
        if take:
            self.next_seq = take[-1].sequence + 1
            self.moved_at = began
        self.fresh = bool(take)
        return list(take)

    def gap(self, segments: int) -> None:
        self.gaps = min(MAX_GAPS, self.gaps + segments)

    def took(self, segment: Segment) -> None:
        self.duration += min(segment.duration, MAX_RELOAD)
        self.taken += 1

    def full(self) -> bool:
        return self.duration >= self.seconds or self.taken >= self.max_segments

    def next_reload(self) -> float:
        return self.reloaded_at + (self.target if self.fresh else self.target / 2)

    def stalled(self, now: float) -> bool:
        return now - self.moved_at >= STALL_RELOADS * self.target


class _Over(Exception):
    """The recording ends here, keeping what it has; the message says why."""


class LiveHls:
    """The recorder of live media playlists hls.py calls (hls.LiveRecording). ``monotonic`` and ``sleep`` are the
    clock the window and the reloads keep (a test's fake clock moves only by ``sleep``); ``clock`` the wall
    clock of ``recorded_at``."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
                 clock: Callable[[], float] = time.time) -> None:
        self._monotonic, self._sleep, self._clock = monotonic, sleep, clock

    async def __call__(self, hls: HlsDownloader, item: AudioItem, key: str, media: MediaPlaylist,
                       lease: LiveLease, ids: list[str]) -> AudioItem:
        window = Window.open(lease.seconds, clock=self._clock, monotonic=self._monotonic)
        lease.opened()
        follow = Follow(lease.seconds, window.start)
        recorder = Recorder(hls.store, live_key(key), hls.cfg.max_size)
        stopped = "window"
        try:
            await recorder.open()
            try:
                await self._follow(hls, item, media, window, follow, recorder, ids)
                stopped = ("full" if follow.full() else "ended" if follow.ended
                           else "stalled" if follow.stalled(self._monotonic()) else "window")
            except (_Over, RecordingTooLarge) as exc:
                stopped = str(exc)
            except HlsRefused:
                raise
            except HlsError as exc:
                if recorder.size == 0:
                    raise
                stopped = f"error: {exc}"[:300]
                log.info("hls %s: recording stopped: %s", item.url[:200], exc)
        except BaseException:
            lease.closed()
            await recorder.discard()
            raise
        lease.closed()     # the network part is over: the host's slot is the next download's
        if recorder.size == 0:
            await recorder.discard()
            return item.replace(status=FAILED, reason=f"hls: live stream: nothing recorded ({stopped})"[:300],
                                extra={**item.extra, "live": True, "gaps": follow.gaps})
        ext, content_type = container(recorder.first, follow.init is not None)
        record = await recorder.finish(item.url, ext, content_type, clock=self._clock)
        hls._stored(item, record, ids)
        log.info("hls %s recorded: %.1f s in %d segments, %d missed (%s)", item.url[:200], follow.duration,
                 follow.taken, follow.gaps, stopped)
        done = recorded(item, record, window, follow.duration, "hls")
        return done.replace(extra={**done.extra, "gaps": follow.gaps, "segments": follow.taken,
                                   "playlist": media.url, "stopped": stopped})

    async def _follow(self, hls: HlsDownloader, item: AudioItem, media: MediaPlaylist, window: Window,
                      follow: Follow, recorder: Recorder, ids: list[str]) -> None:
        """Record until one of the stops in the module's table."""
        keys: dict[str, bytes] = {}
        playlist, began = media, window.start
        while True:
            for segment in follow.reload(playlist, began):
                if follow.full() or window.closed(self._monotonic()):
                    return
                if recorder.size >= hls.cfg.max_size:
                    raise _Over("full")
                if len(keys) > MAX_KEYS:
                    keys.clear()
                try:
                    pieces = await self._timed(window, hls, self._segment(hls, item, segment, follow.init, keys,
                                                                          ids, recorder.size))
                except HlsGone:
                    follow.gap(1)
                    continue
                finally:
                    del ids[:-_IDS_KEPT]
                for piece in pieces:
                    await recorder.append(piece)
                if segment.init is not None:
                    follow.init = segment.init.uri
                follow.took(segment)
            now = self._monotonic()
            if follow.full() or follow.ended or window.closed(now) or follow.stalled(now):
                return
            at = min(follow.next_reload(), window.end)
            if at > now:
                await self._sleep(at - now)
            began = self._monotonic()
            if window.closed(began):
                return
            try:
                playlist = await self._timed(window, hls, self._reload(hls, item, media.url, ids))
            finally:
                del ids[:-_IDS_KEPT]

    async def _timed(self, window: Window, hls: HlsDownloader, work: Awaitable[_T]) -> _T:
        """``work``, given until one read timeout after the window's time is up."""
        try:
            return await asyncio.wait_for(work, window.left(self._monotonic()) + hls.cfg.timeout)
        except TimeoutError:
            raise _Over("window") from None

    async def _segment(self, hls: HlsDownloader, item: AudioItem, segment: Segment, init: str | None,
                       keys: dict[str, bytes], ids: list[str], size: int) -> list[bytes]:
        """The segment's plain bytes, after its init section when that is new to the recording."""
        limit = max(1, min(MAX_SEGMENT_BYTES, hls.cfg.max_size - size))
        pieces: list[bytes] = []
        if segment.init is not None and segment.init.uri != init:
            pieces.append(await hls._get(item, segment.init.uri, limit, segment.init.byterange, ids=ids))
        data = await hls._get(item, segment.uri, limit, segment.byterange, ids=ids)
        pieces.append(await hls._plain(item, segment, data, keys, ids))
        return pieces

    async def _reload(self, hls: HlsDownloader, item: AudioItem, url: str, ids: list[str]) -> MediaPlaylist:
        text = (await hls._get(item, url, MAX_PLAYLIST_BYTES, role="playlist", ids=ids)).decode("utf-8", "replace")
        # A big playlist is parsed off the loop: its size is the site's choice, up to the cap.
        playlist = parse(text, url) if len(text) < 65536 else await asyncio.to_thread(parse, text, url)
        if not isinstance(playlist, MediaPlaylist):
            raise HlsError("the live media playlist became a master playlist")
        return playlist
