"""What the segmented downloads share: HLS (hls.py) and DASH (dash.py) both name audio as a list of segments,
fetched in order and joined into one file that resumes at a segment.

Here, once each:

- the bounds a list of segments is held to (``MAX_SEGMENTS``, ``MAX_DURATION``, ``check_length``);
- ``SegmentClient``: a bounded GET with the item's identity, retried on network errors and 429/5xx, each attempt
  recorded in the archive under its role (``playlist`` for a playlist or manifest, ``segment`` for media);
- ``Joined``: the part file the segments are appended to, hashed on the way, and its progress record
  (``<key>.hls.json`` or ``<key>.dash.json`` beside the part file), written atomically at most every
  ``PROGRESS_EVERY`` seconds and once more when the download stops, so that after a kill the part file is at
  least as long as the record says; the next attempt cuts it back to that length and carries on with the next
  segment when the list still names the same segments (their paths, not their query strings, which often hold
  per-client tokens), else starts over;
- ``container``: the joined file's extension and media type, from its first bytes.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from crawler.archive import Archive
from crawler.http.bodies import BodyError
from crawler.http.recording import EXTENSION, RECORD_ID, Recorded
from crawler.http.targets import TargetRefused
from crawler.items import OK, AudioItem
from crawler.web import media
from crawler.web.urls import host_of
from crawler.worker.archived import Trail
from crawler.worker.audiostore import AudioStore, Finished, hash_prefix
from crawler.worker.download_plan import backoff, transient
from crawler.worker.transfer import NETWORK_ERRORS, DownloadConfig, identity_headers

MAX_SEGMENTS = 50_000
# Longer than any recording published as one file (an audiobook, a day-long set); a longer list is not audio
# to keep but a way to hold a download slot.
MAX_DURATION = 24 * 3600.0
# Real packagers cut 2-10 s segments, low-latency ones 1 s; a list of many more segments than its declared
# duration explains costs a request each for nothing.
MIN_SEGMENT_SECONDS = 0.5
SEGMENT_ALLOWANCE = 16
# Seconds between progress records: a kill loses at most this much work.
PROGRESS_EVERY = 5.0
# A segment is held in memory (to be decrypted, or written in one piece): real ones are seconds of audio.
MAX_SEGMENT_BYTES = 32 * 1024 * 1024
READ_SIZE = 64 * 1024
_PROGRESS_VERSION = 1

# Codec names (RFC 6381 prefixes) that mean video; anything else a stream names is taken for audio.
VIDEO_CODECS = ("avc1", "avc3", "hvc1", "hev1", "vp08", "vp09", "vp8", "vp9", "av01", "mp4v", "dvh1", "dvhe",
                "theora", "s263")
_MATROSKA = b"\x1a\x45\xdf\xa3"


class StreamError(Exception):
    """The stream cannot be downloaded as audio; the message becomes the item's reason."""


class StreamRefused(StreamError):
    """A segment, key or playlist the worker's client refused (its address, or its body): logged once."""


class StreamGone(StreamError):
    """The server answered 404 or 410: for a live stream, a segment that left its window before it was fetched."""


class Transient(Exception):
    """A failure worth another attempt: the network, 429, 5xx."""


@dataclass(frozen=True)
class ByteRange:
    length: int
    offset: int


def check_length(duration: float, count: int) -> None:
    """Raises StreamError when a finished list declares more than ``MAX_DURATION`` of audio, or more segments
    than its declared duration explains: at most ``SEGMENT_ALLOWANCE`` plus one per ``MIN_SEGMENT_SECONDS``."""
    if not math.isfinite(duration) or duration > MAX_DURATION:
        raise StreamError(f"declares {duration:.0f} s of audio, more than {MAX_DURATION:.0f} s")
    allowed = SEGMENT_ALLOWANCE + int(duration / MIN_SEGMENT_SECONDS)
    if count > allowed:
        raise StreamError(f"{count} segments for {duration:.0f} s of audio (at most {allowed})")


def container(first: bytes, has_init: bool) -> tuple[str, str]:
    """(extension, media type) of the joined file, from its first bytes."""
    if first[:4] == _MATROSKA:
        return ".webm", "audio/webm"
    if has_init or first[4:8] in (b"ftyp", b"styp", b"moof"):
        return ".m4a", "audio/mp4"
    if first[:1] == b"\x47":
        return ".ts", "video/mp2t"
    fmt = media.sniff_audio(first) if len(first) >= 4 else None
    if fmt == "aac":
        return ".aac", "audio/aac"
    if fmt in ("mp3", "mp2"):
        return ".mp3", "audio/mpeg"
    return ".ts", "video/mp2t"


# --------------------------------------------------------------------------------------------- the joined file
def joined_row(item: AudioItem, record: Finished, segments: int, duration: float, **extra: Any) -> AudioItem:
    """The item as its joined file left it: the stored file's fields, the duration the playlist or manifest
    declares unless the page said one, and how many segments it joined (with ``extra``)."""
    return item.replace(status=OK, reason=None, sha256=record.sha256, size=record.size,
                        content_type=record.content_type, path=record.path,
                        duration=item.duration or (round(duration, 3) or None),
                        extra={**item.extra, "segments": segments, **extra})


def archive_stored(archive: Archive | None, item: AudioItem, record: Finished, ids: list[str],
                   clock: Callable[[], float]) -> None:
    """The metadata record of a joined or recorded file, referring to the item's last exchange."""
    if archive is not None:
        Trail(archive, item.page, keep_body=False, clock=clock).stored(
            item.url, path=record.path, sha256=record.sha256, size=record.size,
            content_type=record.content_type, refers_to=ids[-1] if ids else "")


# --------------------------------------------------------------------------------------------- requests
class SegmentClient:
    """GETs of a stream's playlists and segments through the downloader's HTTP client (its limits, transport and
    address policy), with the item's identity (cookies only to the item's own host)."""

    def __init__(self, client: httpx.AsyncClient, cfg: DownloadConfig, *, archive: Archive | None = None,
                 audio_payload: bool = False) -> None:
        """archive: where each attempt is recorded (its body too for a playlist, for a segment only with
        ``audio_payload``), as the item's page's exchange in the named role."""
        self.client, self.cfg = client, cfg
        self._archive, self._audio_payload = archive, audio_payload

    async def get(self, item: AudioItem, url: str, limit: int, byterange: ByteRange | None = None, *,
                  role: str = "segment", ids: list[str] | None = None, keep_body: bool = False) -> bytes:
        """A bounded GET, retried on network errors and 429/5xx; each attempt's record id is appended to ``ids``.
        Raises StreamError (StreamRefused for what the client refused)."""
        if not url.lower().startswith(("http://", "https://")):
            raise StreamError(f"not an http(s) address: {url[:200]!r}")
        same_host = host_of(url) == host_of(item.url)
        headers = identity_headers(item, same_host=same_host)
        headers["Accept-Encoding"] = "identity"
        if byterange is not None:
            headers["Range"] = f"bytes={byterange.offset}-{byterange.offset + byterange.length - 1}"
        recorded = None
        if self._archive is not None:
            recorded = Recorded(role, item.page, keep_body=keep_body or role != "segment" or self._audio_payload)
        failures = 0
        while True:
            try:
                return await self._get_once(url, headers, limit, byterange, recorded, ids)
            except Transient as exc:
                failures += 1
                if failures >= self.cfg.max_attempts:
                    raise StreamError(f"{url[:200]}: gave up after {failures} attempts: {exc}") from None
                if delay := backoff(failures, self.cfg.retry_backoff):
                    await asyncio.sleep(delay)

    async def _get_once(self, url: str, headers: dict[str, str], limit: int, byterange: ByteRange | None,
                        recorded: Recorded | None = None, ids: list[str] | None = None) -> bytes:
        # The transport's own body bound is the pages' one; this request's is ``limit``, checked below, with the
        # transport's a read past it as the backstop.
        extensions: dict[str, Any] = {"max_body": limit + READ_SIZE, "read_size": READ_SIZE}
        if recorded is not None:
            extensions[EXTENSION] = recorded
        response: httpx.Response | None = None
        try:
            async with self.client.stream("GET", url, headers=headers, timeout=httpx.Timeout(self.cfg.timeout),
                                          extensions=extensions) as response:
                status = response.status_code
                if transient(status):
                    raise Transient(f"http {status}")
                if status in (404, 410):
                    raise StreamGone(f"{url[:200]}: http {status}")
                if status not in (200, 206):
                    raise StreamError(f"{url[:200]}: http {status}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > limit:
                        raise StreamError(f"{url[:200]}: too large: more than {limit} bytes")
                    chunks.append(chunk)
        except NETWORK_ERRORS as exc:
            raise Transient(f"{type(exc).__name__}: {exc}"[:200]) from None
        except (TargetRefused, BodyError) as exc:
            raise StreamRefused(f"{url[:200]}: {exc}"[:300]) from None
        except httpx.InvalidURL as exc:
            raise StreamError(f"bad address: {exc}") from None
        finally:
            if ids is not None and response is not None and (record := response.extensions.get(RECORD_ID)):
                ids.append(record)
        body = b"".join(chunks)
        if byterange is not None and status == 200:
            body = body[byterange.offset:byterange.offset + byterange.length]   # the server ignored the range
        return body


# --------------------------------------------------------------------------------------------- the joined file
@dataclass
class Progress:
    playlist: str                     # the media playlist's (or manifest's) address
    fingerprint: str
    segments: int = 0                 # segments (after the init section) whose bytes are on disk
    size: int = 0                     # bytes of the part file they make up
    init: str | None = None           # the init section last written

    def to_json(self) -> str:
        return json.dumps({"version": _PROGRESS_VERSION, "playlist": self.playlist,
                           "fingerprint": self.fingerprint, "segments": self.segments, "size": self.size,
                           "init": self.init}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Progress:
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("version") != _PROGRESS_VERSION:
            raise ValueError("not a segments progress record")
        segments, size = d.get("segments"), d.get("size")
        if not isinstance(segments, int) or not isinstance(size, int) or segments < 0 or size < 0:
            raise ValueError("segments progress record without counts")
        init = d.get("init")
        return cls(str(d.get("playlist")), str(d.get("fingerprint")), segments, size,
                   init if isinstance(init, str) else None)


class Joined:
    """One stream's part file: segments appended in order, written and hashed off the event loop, with its
    progress record beside it (see the module's note).

        joined = Joined(store, key, progress_path)
        await joined.open(url, fingerprint, total)     # resumes, or starts over
        try:
            for segment in segments[joined.progress.segments:]:
                await joined.append([init_bytes, segment_bytes], init=init_url)
        finally:
            joined.close()                               # the progress so far recorded
        sha, size, rel = joined.commit(ext)              # stored by content, the record removed
    """

    def __init__(self, store: AudioStore, key: str, progress_path: Path, *,
                 monotonic: Callable[[], float], progress_every: float = PROGRESS_EVERY) -> None:
        self.store, self.key, self.progress_path = store, key, progress_path
        self._monotonic, self.progress_every = monotonic, progress_every
        self.progress = Progress("", "")
        self.first = b""                  # the file's first bytes, to name its container
        self.total = 0
        self._fh: BinaryIO | None = None
        self._hasher: Any = None
        self._saved, self._saved_at = 0, 0.0

    async def open(self, source: str, fingerprint: str, total: int) -> Progress:
        """The part file, cut back to the progress recorded for ``fingerprint``, or emptied to start over."""
        part = self.store.part_path(self.key)
        part.parent.mkdir(parents=True, exist_ok=True)
        self.total = total
        progress = self._resume_point(fingerprint, total)
        if progress is None:
            progress = Progress(source, fingerprint)
            part.write_bytes(b"")
            self._save(progress)
        self.progress = progress
        self._hasher = await asyncio.to_thread(hash_prefix, part, progress.size)
        self._fh, self.first = await asyncio.to_thread(_open_at, part, progress.size)
        self._saved, self._saved_at = progress.segments, self._monotonic()
        return progress

    async def append(self, pieces: list[bytes], *, init: str | None = None) -> None:
        """One segment's bytes (after its init section when that changed), counted as one segment done."""
        # Off the loop, and never abandoned: the file must not close under a writing thread.
        writing = asyncio.ensure_future(asyncio.to_thread(_append, self._fh, self._hasher, pieces))
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            await asyncio.wait({writing})
            raise
        if not self.first:
            self.first = b"".join(pieces)[:16]
        progress = self.progress
        progress.segments += 1
        progress.size += sum(map(len, pieces))
        if init is not None:
            progress.init = init
        now = self._monotonic()
        if now - self._saved_at >= self.progress_every:
            self._save(progress)
            self._saved, self._saved_at = progress.segments, now

    def close(self) -> None:
        """Whatever stopped the download (its deadline, a refusal, a cancel), the segments on disk are recorded;
        a finished download is recorded as the stored file instead (``commit``)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.progress.segments != self._saved and self.progress.segments < self.total:
            self._save(self.progress)

    def commit(self, ext: str) -> tuple[str, int, str]:
        """(sha256, size, path in the store) of the finished file; its progress record is removed."""
        sha = self._hasher.hexdigest()
        rel = self.store.commit(self.key, sha, self.progress.size, ext)
        self.progress_path.unlink(missing_ok=True)
        return sha, self.progress.size, rel

    def _resume_point(self, fingerprint: str, total: int) -> Progress | None:
        """The progress to carry on from, when the part file and the list still agree with it."""
        try:
            progress = Progress.from_json(self.progress_path.read_text(encoding="utf-8"))
            on_disk = self.store.part_path(self.key).stat().st_size
        except (OSError, ValueError):
            return None
        if progress.fingerprint != fingerprint or progress.segments > total or on_disk < progress.size:
            return None
        return progress

    def _save(self, progress: Progress) -> None:
        tmp = self.progress_path.with_name(self.progress_path.name + ".tmp")
        tmp.write_text(progress.to_json(), encoding="utf-8")
        os.replace(tmp, self.progress_path)


def _append(fh: Any, hasher: Any, pieces: list[bytes]) -> None:
    for piece in pieces:
        fh.write(piece)
        hasher.update(piece)
    fh.flush()


def _open_at(path: Path, size: int) -> tuple[BinaryIO, bytes]:
    """The part file cut back to ``size`` (bytes past the last progress record are not trusted), positioned
    at its end, and its first bytes."""
    fh = open(path, "r+b")
    fh.truncate(size)
    first = fh.read(16)
    fh.seek(size)
    return fh, first
