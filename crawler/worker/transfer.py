"""What a plain download (downloader.py) and an HLS one (hls.py) share: their settings, the size units, the
errors that mean a broken connection, the whole-download deadline, the terms of a live recording and the client
identity a request carries.

Both modules import this one and neither reaches into the other: the downloader hands HLS items to
``hls.HlsDownloader`` under a ``Deadline`` built here; the timer that expires deadlines stays in the
downloader.

A live recording (a live HLS playlist, a dynamic DASH presentation, a radio station: recording.py) runs under a
``LiveLease`` the downloader makes at its dispatch point, from the download's ``Deadline`` and its slots. The
recorder calls ``opened()`` when its window opens, which moves the deadline to cover the window plus one read
timeout (``Deadline.cover``), and ``closed()`` once it is done with the network (the window closed, the stream
ended or stalled, or it failed), which gives the host slot back before the recording is stored: a stream holds
exactly one slot of its host, for its window and not longer. Both are idempotent, and ``closed()`` is called
for it by the downloader when the recorder returns without calling it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from crawler.items import AudioItem
from crawler.worker.siterules import SiteHeaders

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Errors the transports raise for a broken connection: httpx's (the lean path raises them; the aiohttp side maps
# aiohttp's to them, crawler/http/aio.py) and the loop's own. aiohttp is not imported here: a worker whose
# requests all take the lean path never loads it.
NETWORK_ERRORS = (httpx.TransportError, asyncio.TimeoutError, ConnectionError)


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
    live_record_seconds: float = 60.0  # a live stream is recorded this long per visit (recording.py)

    def __post_init__(self) -> None:
        if self.max_size <= 0 or self.chunk_size <= 0 or self.max_attempts < 1 or self.timeout <= 0 or (
                self.deadline_base <= 0 or self.min_rate <= 0 or self.live_record_seconds <= 0):
            raise ValueError("DownloadConfig: sizes, attempts, timeout, deadline and rate must be positive")
        if self.revalidate_after < 0 or self.max_per_host < 1 or self.remembered_urls < 0 or (
                self.max_downloads is not None and self.max_downloads < 1):
            raise ValueError("DownloadConfig: revalidate_after >= 0, max_per_host >= 1, max_downloads >= 1")


class Deadline:
    """A download's deadline: ``deadline_base`` plus its size at ``min_rate``, moved as the size becomes known.

    Kept by the downloader's _Deadlines, not by a timer of its own: moving a timer costs more than the rest of
    a small file's bookkeeping, and a deadline only ever moves later."""

    __slots__ = ("_base", "_cancelling", "_rate", "_task", "at", "expired", "received", "started")

    def __init__(self, started: float, cfg: DownloadConfig) -> None:
        self.started = started
        self._base, self._rate = started + cfg.deadline_base, cfg.min_rate
        self.at = self._base
        self.expired = False
        self.received = 0
        self._task = asyncio.current_task()
        self._cancelling = self._task.cancelling() if self._task is not None else 0

    def stretch(self, expected: int | None, received: int) -> None:
        """The size as announced, or as received so far."""
        self.received = received
        self.at = max(self.at, self._base + max(expected or 0, received) / self._rate)

    def cover(self, seconds: float) -> None:
        """At least ``seconds`` past ``deadline_base``: a live recording's window (and a read timeout) on top of
        what reaching the stream may take."""
        self.at = max(self.at, self._base + seconds)

    def expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._task.cancel()

    def timed_out(self) -> bool:
        """Called on CancelledError: True when the cancel was this deadline's alone (it then becomes a timeout);
        a cancel from outside that came as well still propagates."""
        return self.expired and self._task is not None and self._task.uncancel() <= self._cancelling


class LiveLease:
    """The terms a live recording runs under (see the module's docstring): ``seconds`` of window (the worker's
    ``live_record_seconds``), the download's ``deadline`` to move when the window opens, and ``release``, called
    once, to give the host slot back when the recording is done with the network. Without a deadline or a
    release (a recorder run on its own, as in tests) the calls do nothing."""

    __slots__ = ("_release", "deadline", "seconds", "timeout")

    def __init__(self, seconds: float, timeout: float, deadline: Deadline | None = None,
                 release: Callable[[], None] | None = None) -> None:
        self.seconds, self.timeout, self.deadline, self._release = seconds, timeout, deadline, release

    def opened(self) -> None:
        """The window opens: the whole download's deadline covers it, plus one read timeout for its last piece."""
        if self.deadline is not None:
            self.deadline.cover(self.seconds + self.timeout)

    def closed(self) -> None:
        """Done with the network: the host's slot goes to the next download now (storing needs none)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    @property
    def holding(self) -> bool:
        """Whether the slot is still held (``closed`` not yet called)."""
        return self._release is not None


def identity_headers(item: AudioItem, *, same_host: bool, site: SiteHeaders | None = None) -> dict[str, str]:
    """The item's client identity, but across hosts only the User-Agent: cookies must not leak to a CDN.

    site: the request's host's own headers (crawler/worker/siterules.py), laid under the identity: a resolver's
    identity wins, as a signed address is bound to the client that resolved it."""
    if item.identity is None:
        return {} if site is None else site.overrides()
    if same_host:
        own = item.identity.request_headers()
    else:
        own = {"User-Agent": item.identity.user_agent} if item.identity.user_agent else {}
    return own if site is None else {**site.overrides(), **own}
