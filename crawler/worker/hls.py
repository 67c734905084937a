"""HLS audio as one file: the playlist's best audio rendition, its segments fetched in order, decrypted and
joined, resumable at segment granularity.

An HLS address (RFC 8216) names a text playlist, not audio. A *master* playlist lists renditions
(EXT-X-STREAM-INF variants and EXT-X-MEDIA alternatives); a *media* playlist lists the segments of one of them,
each maybe encrypted with AES-128-CBC under a key named by EXT-X-KEY, maybe preceded by an initialisation section
(EXT-X-MAP, for fragmented MP4). Concatenating the decrypted segments in order, after the initialisation
section, gives a file players open: an MPEG-TS or ADTS stream, or a fragmented MP4 (this is what yt-dlp's
native HLS downloader writes too).

Which rendition, from a master playlist:
    1. the audio-only variant with the highest BANDWIDTH (audio-only: its CODECS name no video codec, or it has
       neither CODECS nor RESOLUTION);
    2. else an EXT-X-MEDIA TYPE=AUDIO rendition with a URI: from the group of the highest-bandwidth variant that
       names one, its DEFAULT=YES member, else its first;
    3. else none: a stream that carries its sound only inside video is not downloaded as audio.

On disk, beside the downloader's partial files:

    <data_dir>/audio/partial/<key>.part      the decrypted segments so far, in order
    <data_dir>/audio/partial/<key>.hls.json  progress: the media playlist, how many segments, how many bytes

The progress record is written (atomically) after a segment's bytes are on disk, at most every
``PROGRESS_EVERY`` seconds and once more when the download stops for any reason, so after a kill the part file
is at least as long as the record says; the next attempt cuts it back to that length and carries on with the
next segment, if the playlist still lists the same segments (their paths, not their query strings, which often
hold per-client tokens). Otherwise it starts over. A kill costs at most a few seconds of segments, and a list
of tiny segments does not rewrite the record for each one.

A playlist without EXT-X-ENDLIST is live (or an event still being recorded): it has no end to download, so it is
recorded for a window instead, by the ``live`` recorder the downloader gives this class (crawler/worker/livehls.py,
which reuses this module's requests, parsing and decryption), under the ``LiveLease`` of the download
(transfer.py: the deadline covering the window, the host slot given back when it closes). Without a recorder the
item is reported as found, with ``extra.live``, and nothing is fetched. A DASH manifest is recorded as found: it
is not downloaded.

Bounds: a playlist is read up to ``MAX_PLAYLIST_BYTES`` and at most ``MAX_SEGMENTS`` segments are taken; an
ended playlist is refused before any segment is fetched when its EXTINF durations add up to more than
``MAX_DURATION`` or it lists more segments than its duration explains (``check_length``: at most
``SEGMENT_ALLOWANCE`` plus one per ``MIN_SEGMENT_SECONDS`` of declared audio); a segment (held in memory to be
decrypted) is read up to ``MAX_SEGMENT_BYTES``; a key must be exactly 16 bytes; the file as a whole obeys the
downloader's ``max_size``, and the whole download (playlists, keys, segments, retries) its deadline: the same
``deadline_base`` plus size at ``min_rate`` as a plain download (transfer.py's ``Deadline``), stretched by
the bytes written so far. Requests go through the downloader's HTTP client with the item's identity (cookies
only to the item's own host), so they share its limits, its transport and its address policy: a key or segment
at a refused address, or a body the transport refuses, fails the item with its reason and one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import httpx
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crawler.archive import NO_ARCHIVE, Archive, NoArchive
from crawler.http.bodies import BodyError
from crawler.http.recording import EXTENSION, RECORD_ID, Recorded
from crawler.http.targets import TargetRefused
from crawler.items import FAILED, OK, AudioItem
from crawler.web import media
from crawler.web.urls import host_of, resolve
from crawler.worker.archived import Trail
from crawler.worker.audiostore import AudioStore, Finished, hash_prefix
from crawler.worker.download_plan import backoff, transient
from crawler.worker.transfer import NETWORK_ERRORS, Deadline, DownloadConfig, LiveLease, identity_headers

log = logging.getLogger(__name__)

MAX_PLAYLIST_BYTES = 4 * 1024 * 1024
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
MAX_VARIANTS = 1_000
MAX_SEQUENCE = 2 ** 64 - 1
# A segment is held in memory to be decrypted whole: real ones are seconds of audio, a few hundred KiB.
MAX_SEGMENT_BYTES = 32 * 1024 * 1024
_KEY_BYTES = 16
_READ_SIZE = 64 * 1024
_PROGRESS_VERSION = 1
HLS = "hls"
DASH = "dash"

# Codec names (RFC 6381 prefixes) that mean video; anything else in CODECS is taken for audio.
_VIDEO_CODECS = ("avc1", "avc3", "hvc1", "hev1", "vp08", "vp09", "vp8", "vp9", "av01", "mp4v", "dvh1", "dvhe",
                 "theora", "s263")
_ATTRIBUTE = re.compile(r'([A-Z0-9-]+)=("[^"]*"|[^,]*)')


class HlsError(Exception):
    """The playlist cannot be downloaded as audio; the message becomes the item's reason."""


class HlsRefused(HlsError):
    """A key, segment or playlist the worker's client refused (its address, or its body): logged once."""


class HlsGone(HlsError):
    """The server answered 404 or 410: a live stream's segment that left its window before it was fetched."""


class LiveRecording(Protocol):
    """Records a live media playlist (livehls.py): given this downloader, for its requests, and the playlist as
    first read."""

    async def __call__(self, hls: HlsDownloader, item: AudioItem, key: str, media: MediaPlaylist,
                       lease: LiveLease, ids: list[str]) -> AudioItem: ...


# --------------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class Key:
    method: str                       # NONE, AES-128, SAMPLE-AES, ...
    uri: str | None = None
    iv: bytes | None = None


@dataclass(frozen=True)
class ByteRange:
    length: int
    offset: int


@dataclass(frozen=True)
class InitSection:
    uri: str
    byterange: ByteRange | None = None


@dataclass(frozen=True)
class Segment:
    uri: str
    duration: float
    sequence: int
    key: Key | None = None
    init: InitSection | None = None
    byterange: ByteRange | None = None


@dataclass(frozen=True)
class MediaPlaylist:
    url: str
    segments: tuple[Segment, ...]
    ended: bool                       # EXT-X-ENDLIST: the list is complete
    media_sequence: int = 0
    target_duration: float = 0.0      # EXT-X-TARGETDURATION: a live list is reloaded this often (0: not given)

    @property
    def duration(self) -> float:
        return sum(s.duration for s in self.segments)

    def fingerprint(self) -> str:
        """The segments' paths in order, without query strings: stable across per-client tokens."""
        h = hashlib.sha256()
        for s in self.segments:
            h.update(s.uri.split("?", 1)[0].encode("utf-8", "surrogatepass") + b"\n")
            if s.byterange:
                h.update(f"{s.byterange.offset}+{s.byterange.length}\n".encode())
        return h.hexdigest()


@dataclass(frozen=True)
class Variant:
    uri: str
    bandwidth: int = 0
    codecs: tuple[str, ...] = ()
    resolution: str | None = None
    audio_group: str | None = None


@dataclass(frozen=True)
class Rendition:
    type: str
    group_id: str
    uri: str | None
    name: str | None = None
    default: bool = False


@dataclass(frozen=True)
class MasterPlaylist:
    url: str
    variants: tuple[Variant, ...] = ()
    renditions: tuple[Rendition, ...] = field(default_factory=tuple)


def attributes(text: str) -> dict[str, str]:
    """An attribute list (RFC 8216 4.2): KEY=value pairs, quoted strings unquoted."""
    out: dict[str, str] = {}
    for m in _ATTRIBUTE.finditer(text):
        value = m.group(2)
        out[m.group(1)] = value[1:-1] if value.startswith('"') else value.strip()
    return out


def is_playlist_text(text: str) -> bool:
    return text.lstrip("\ufeff \t\r\n").startswith("#EXTM3U")


def parse(text: str, url: str) -> MasterPlaylist | MediaPlaylist:
    """One playlist, its URIs made absolute against ``url``. Raises HlsError for what is not an HLS playlist."""
    if not is_playlist_text(text):
        raise HlsError("not an HLS playlist (no #EXTM3U)")
    if "#EXT-X-STREAM-INF" in text or ("#EXT-X-MEDIA:" in text and "#EXTINF" not in text):
        return _parse_master(text, url)
    return _parse_media(text, url)


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


def _byterange(value: str, previous_end: int) -> ByteRange | None:
    length, _, offset = value.strip().partition("@")
    n = _int(length, -1)
    if n <= 0:
        return None
    start = _int(offset, -1) if offset else previous_end
    return ByteRange(n, start) if start >= 0 else None


def _parse_media(text: str, url: str) -> MediaPlaylist:
    segments: list[Segment] = []
    key: Key | None = None
    init: InitSection | None = None
    media_sequence = 0
    target = 0.0
    ended = False
    duration: float | None = None
    byterange: ByteRange | None = None
    range_end = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            tag, _, value = line.partition(":")
            if tag == "#EXT-X-MEDIA-SEQUENCE":
                media_sequence = max(0, _int(value))
                if media_sequence > MAX_SEQUENCE:    # a decimal-integer (RFC 8216 4.2); an IV holds no more
                    raise HlsError(f"media sequence {value[:40]} out of range")
            elif tag == "#EXT-X-TARGETDURATION":
                target = _float(value)
            elif tag == "#EXTINF":
                try:
                    duration = max(0.0, float(value.split(",", 1)[0]))
                except ValueError:
                    duration = 0.0
            elif tag == "#EXT-X-KEY":
                key = _key(attributes(value), url)
            elif tag == "#EXT-X-MAP":
                a = attributes(value)
                if a.get("URI"):
                    init = InitSection(resolve(url, a["URI"]),
                                       _byterange(a["BYTERANGE"], 0) if a.get("BYTERANGE") else None)
            elif tag == "#EXT-X-BYTERANGE":
                byterange = _byterange(value, range_end)
            elif tag == "#EXT-X-ENDLIST":
                ended = True
            continue
        if duration is None:
            continue    # a URI line not preceded by EXTINF is not a segment
        if len(segments) >= MAX_SEGMENTS:
            raise HlsError(f"more than {MAX_SEGMENTS} segments")
        segments.append(Segment(resolve(url, line), duration, media_sequence + len(segments), key, init,
                                byterange))
        if byterange is not None:
            range_end = byterange.offset + byterange.length
        duration, byterange = None, None
    return MediaPlaylist(url, tuple(segments), ended, media_sequence, target)


def _float(value: str) -> float:
    """A non-negative finite number, else 0."""
    try:
        number = float(value.strip())
    except ValueError:
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def check_length(playlist: MediaPlaylist) -> None:
    """Raises HlsError when an ended playlist is longer than ``MAX_DURATION`` or lists more segments than its
    declared duration explains (see the module's docstring)."""
    duration = playlist.duration
    if not math.isfinite(duration) or duration > MAX_DURATION:
        raise HlsError(f"declares {duration:.0f} s of audio, more than {MAX_DURATION:.0f} s")
    allowed = SEGMENT_ALLOWANCE + int(duration / MIN_SEGMENT_SECONDS)
    if len(playlist.segments) > allowed:
        raise HlsError(f"{len(playlist.segments)} segments for {duration:.0f} s of audio (at most {allowed})")


def _key(a: dict[str, str], base: str) -> Key | None:
    method = a.get("METHOD", "NONE").upper()
    if method == "NONE":
        return None
    iv = None
    raw_iv = a.get("IV", "")
    if raw_iv:
        digits = raw_iv[2:] if raw_iv[:2].lower() == "0x" else raw_iv
        try:
            iv = bytes.fromhex(digits.rjust(32, "0"))
        except ValueError:
            raise HlsError(f"bad IV {raw_iv[:40]!r}") from None
        if len(iv) != 16:
            raise HlsError(f"bad IV {raw_iv[:40]!r}")
    return Key(method, resolve(base, a["URI"]) if a.get("URI") else None, iv)


def _parse_master(text: str, url: str) -> MasterPlaylist:
    variants: list[Variant] = []
    renditions: list[Rendition] = []
    pending: dict[str, str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            tag, _, value = line.partition(":")
            if tag == "#EXT-X-STREAM-INF":
                pending = attributes(value)
            elif tag == "#EXT-X-MEDIA" and len(renditions) < MAX_VARIANTS:
                a = attributes(value)
                renditions.append(Rendition(a.get("TYPE", "").upper(), a.get("GROUP-ID", ""),
                                            resolve(url, a["URI"]) if a.get("URI") else None, a.get("NAME"),
                                            a.get("DEFAULT", "").upper() == "YES"))
            continue
        if pending is not None and len(variants) < MAX_VARIANTS:
            codecs = tuple(c.strip().lower() for c in pending.get("CODECS", "").split(",") if c.strip())
            variants.append(Variant(resolve(url, line), _int(pending.get("BANDWIDTH")), codecs,
                                    pending.get("RESOLUTION"), pending.get("AUDIO")))
        pending = None
    return MasterPlaylist(url, tuple(variants), tuple(renditions))


def _audio_only(v: Variant) -> bool:
    if v.codecs:
        return not any(c.startswith(_VIDEO_CODECS) for c in v.codecs)
    return v.resolution is None


def choose_audio(master: MasterPlaylist) -> str:
    """The media playlist to download for the best audio (see the module's docstring). Raises HlsError."""
    audio_variants = [v for v in master.variants if _audio_only(v)]
    if audio_variants:
        return max(audio_variants, key=lambda v: v.bandwidth).uri
    groups = [v.audio_group for v in sorted(master.variants, key=lambda v: -v.bandwidth) if v.audio_group]
    audio = [r for r in master.renditions if r.type == "AUDIO" and r.uri]
    for group in [*groups, None]:
        members = [r for r in audio if group is None or r.group_id == group]
        if members:
            chosen = next((r for r in members if r.default), members[0])
            assert chosen.uri is not None
            return chosen.uri
    raise HlsError("no audio-only rendition in the master playlist")


def segment_iv(segment: Segment) -> bytes:
    """The key's IV, else the media sequence number as a 128-bit big-endian integer (RFC 8216 5.2)."""
    if segment.key is not None and segment.key.iv is not None:
        return segment.key.iv
    return segment.sequence.to_bytes(16, "big")


def decrypt(data: bytes, key: bytes, iv: bytes) -> bytes:
    """AES-128-CBC with PKCS#7 padding, as HLS encrypts whole segments."""
    if len(data) % 16:
        raise HlsError(f"encrypted segment of {len(data)} bytes is not a whole number of blocks")
    if not data:
        return b""
    decryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).decryptor()
    plain = decryptor.update(data) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= 16 or plain[-pad:] != bytes([pad]) * pad:
        raise HlsError("bad padding after decryption: wrong key or IV")
    return plain[:-pad]


def container(first: bytes, has_init: bool) -> tuple[str, str]:
    """(extension, media type) of the joined file, from its first bytes."""
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


# --------------------------------------------------------------------------------------------- progress
@dataclass
class Progress:
    playlist: str                     # the media playlist's address
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
            raise ValueError("not an HLS progress record")
        segments, size = d.get("segments"), d.get("size")
        if not isinstance(segments, int) or not isinstance(size, int) or segments < 0 or size < 0:
            raise ValueError("HLS progress record without counts")
        init = d.get("init")
        return cls(str(d.get("playlist")), str(d.get("fingerprint")), segments, size,
                   init if isinstance(init, str) else None)


class HlsDownloader:
    """One file per HLS item. Called by the Downloader, inside the item's host slot."""

    def __init__(self, client: httpx.AsyncClient, store: AudioStore, cfg: DownloadConfig, *,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 progress_every: float = PROGRESS_EVERY, archive: Archive = NO_ARCHIVE,
                 audio_payload: bool = False, live: LiveRecording | None = None) -> None:
        """clock: wall-clock time for the records; monotonic: when progress was last saved; live: the recorder of
        live playlists (None: they are reported as found, not recorded); archive: where the
        stored file's metadata record goes (the exchanges themselves are the client's to record: it names
        each request's role, ``playlist`` or ``segment``, and page), the segments' bytes too when
        ``audio_payload``."""
        self.client, self.store, self.cfg, self._clock = client, store, cfg, clock
        self._monotonic, self.progress_every = monotonic, progress_every
        self._archive = None if isinstance(archive, NoArchive) else archive
        self._audio_payload = audio_payload
        self.live = live

    def claims(self, item: AudioItem) -> bool:
        """Items the downloader hands to this module: HLS playlists (and DASH manifests, recorded only)."""
        fmt = item.extra.get("format") if isinstance(item.extra, dict) else None
        return fmt in (HLS, DASH) or media.url_extension(item.url) == "m3u8"

    def progress_path(self, key: str) -> Path:
        return self.store.partial_dir / f"{key}.hls.json"

    async def fetch(self, item: AudioItem, key: str, known: Finished | None = None,
                    deadline: Deadline | None = None, lease: LiveLease | None = None) -> AudioItem:
        """``deadline``: the downloader's whole-download deadline, stretched here by the bytes written; its
        expiry cancels this coroutine (the downloader turns that into ``download too slow``). ``lease``: the
        terms a live playlist is recorded under (``known`` means nothing to a live one: each visit records
        anew)."""
        extra = {**item.extra, "format": item.extra.get("format") or HLS}
        item = item.replace(extra=extra)
        if extra["format"] == DASH:
            return item.replace(extra={**extra, "downloaded": False})
        ids: list[str] = []     # the records of this item's exchanges, when they are archived
        try:
            media = await self._media_playlist(item, ids)
            if not media.ended:
                if self.live is None:
                    return item.replace(extra={**extra, "live": True})
                return await self.live(self, item, key, media, lease or LiveLease(self.cfg.live_record_seconds,
                                                                                    self.cfg.timeout), ids)
            if not media.segments:
                raise HlsError("the playlist lists no segments")
            check_length(media)
            if known is not None and self.store.holds(known):
                # The same key finished before and its file is still there: an ended playlist does not change.
                self._stored(item, known, ids)
                return self._done(item, known, media)
            return await self._download(item, key, media, deadline, ids)
        except HlsError as exc:
            if isinstance(exc, HlsRefused):
                log.info("hls %s refused: %s", item.url[:200], exc)
            return item.replace(status=FAILED, reason=f"hls: {exc}"[:300])
        except ValueError as exc:   # a number or address in the playlist nothing could make sense of
            return item.replace(status=FAILED, reason=f"hls: unusable playlist: {exc}"[:300])
        except OSError as exc:
            return item.replace(status=FAILED, reason=f"storage: {exc}")

    def _done(self, item: AudioItem, record: Finished, media: MediaPlaylist) -> AudioItem:
        extra = {**item.extra, "segments": len(media.segments), "playlist": media.url}
        return item.replace(status=OK, reason=None, sha256=record.sha256, size=record.size,
                            content_type=record.content_type, path=record.path,
                            duration=item.duration or (round(media.duration, 3) or None), extra=extra)

    def _stored(self, item: AudioItem, record: Finished, ids: list[str]) -> None:
        """The metadata record of the joined file, referring to the item's last exchange."""
        if self._archive is not None:
            Trail(self._archive, item.page, keep_body=False, clock=self._clock).stored(
                item.url, path=record.path, sha256=record.sha256, size=record.size,
                content_type=record.content_type, refers_to=ids[-1] if ids else "")

    # -- network --------------------------------------------------------------------------------------
    async def _get(self, item: AudioItem, url: str, limit: int, byterange: ByteRange | None = None, *,
                   role: str = "segment", ids: list[str] | None = None, keep_body: bool = False) -> bytes:
        """A bounded GET with the item's identity, retried on network errors and 429/5xx. With an archive, each
        attempt is recorded as ``role`` of the item's page (a segment's bytes only when ``audio_payload`` or
        ``keep_body``, a playlist's always), and its record's id appended to ``ids``."""
        if not url.lower().startswith(("http://", "https://")):
            raise HlsError(f"not an http(s) address: {url[:200]!r}")
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
            except _Transient as exc:
                failures += 1
                if failures >= self.cfg.max_attempts:
                    raise HlsError(f"{url[:200]}: gave up after {failures} attempts: {exc}") from None
                if delay := backoff(failures, self.cfg.retry_backoff):
                    await asyncio.sleep(delay)

    async def _get_once(self, url: str, headers: dict[str, str], limit: int, byterange: ByteRange | None,
                        recorded: Recorded | None = None, ids: list[str] | None = None) -> bytes:
        # The transport's own body bound is the pages' one; this request's is ``limit``, checked below, with the
        # transport's a read past it as the backstop.
        extensions: dict[str, Any] = {"max_body": limit + _READ_SIZE, "read_size": _READ_SIZE}
        if recorded is not None:
            extensions[EXTENSION] = recorded
        response: httpx.Response | None = None
        try:
            async with self.client.stream("GET", url, headers=headers, timeout=httpx.Timeout(self.cfg.timeout),
                                          extensions=extensions) as response:
                status = response.status_code
                if transient(status):
                    raise _Transient(f"http {status}")
                if status in (404, 410):
                    raise HlsGone(f"{url[:200]}: http {status}")
                if status not in (200, 206):
                    raise HlsError(f"{url[:200]}: http {status}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_raw():
                    size += len(chunk)
                    if size > limit:
                        raise HlsError(f"{url[:200]}: too large: more than {limit} bytes")
                    chunks.append(chunk)
        except NETWORK_ERRORS as exc:
            raise _Transient(f"{type(exc).__name__}: {exc}"[:200]) from None
        except (TargetRefused, BodyError) as exc:
            raise HlsRefused(f"{url[:200]}: {exc}"[:300]) from None
        except httpx.InvalidURL as exc:
            raise HlsError(f"bad address: {exc}") from None
        finally:
            if ids is not None and response is not None and (record := response.extensions.get(RECORD_ID)):
                ids.append(record)
        body = b"".join(chunks)
        if byterange is not None and status == 200:
            body = body[byterange.offset:byterange.offset + byterange.length]   # the server ignored the range
        return body

    async def _media_playlist(self, item: AudioItem, ids: list[str] | None = None) -> MediaPlaylist:
        url = item.url
        for _ in range(2):     # a master playlist names media playlists; one level, as the RFC allows
            text = (await self._get(item, url, MAX_PLAYLIST_BYTES, role="playlist", ids=ids)).decode(
                "utf-8", "replace")
            # A big playlist is parsed off the loop: its size is the site's choice, up to the cap.
            playlist = parse(text, url) if len(text) < 65536 else await asyncio.to_thread(parse, text, url)
            if isinstance(playlist, MediaPlaylist):
                return playlist
            url = choose_audio(playlist)
        raise HlsError("a master playlist names another master playlist")

    # -- the download ---------------------------------------------------------------------------------
    async def _download(self, item: AudioItem, key: str, media: MediaPlaylist,
                        deadline: Deadline | None, ids: list[str] | None = None) -> AudioItem:
        part = self.store.part_path(key)
        part.parent.mkdir(parents=True, exist_ok=True)
        progress = self._resume_point(key, media)
        if progress is None:
            progress = Progress(media.url, media.fingerprint())
            part.write_bytes(b"")
            self._save(key, progress)
        hasher = await asyncio.to_thread(hash_prefix, part, progress.size)
        keys: dict[str, bytes] = {}
        fh, first = await asyncio.to_thread(_open_at, part, progress.size)
        saved, saved_at = progress.segments, self._monotonic()
        try:
            with fh:
                for segment in media.segments[progress.segments:]:
                    pieces: list[bytes] = []
                    if segment.init is not None and segment.init.uri != progress.init:
                        pieces.append(await self._get(item, segment.init.uri, self._budget(progress.size),
                                                      segment.init.byterange, ids=ids))
                    data = await self._get(item, segment.uri, self._budget(progress.size), segment.byterange,
                                           ids=ids)
                    pieces.append(await self._plain(item, segment, data, keys, ids))
                    # Off the loop, and never abandoned: the file must not close under a writing thread.
                    writing = asyncio.ensure_future(asyncio.to_thread(_append, fh, hasher, pieces))
                    try:
                        await asyncio.shield(writing)
                    except asyncio.CancelledError:
                        await asyncio.wait({writing})
                        raise
                    if not first:
                        first = b"".join(pieces)[:16]
                    progress.segments += 1
                    progress.size += sum(map(len, pieces))
                    if segment.init is not None:
                        progress.init = segment.init.uri
                    if deadline is not None:
                        deadline.stretch(None, progress.size)
                    now = self._monotonic()
                    if now - saved_at >= self.progress_every:
                        self._save(key, progress)
                        saved, saved_at = progress.segments, now
        finally:
            # Whatever stopped the download (its deadline, a refusal, a cancel), the segments on disk are
            # recorded; a finished download is recorded as the stored file instead.
            if progress.segments != saved and progress.segments < len(media.segments):
                self._save(key, progress)
        has_init = any(s.init is not None for s in media.segments)
        ext, content_type = container(first, has_init)
        sha = hasher.hexdigest()
        size = progress.size
        rel = self.store.commit(key, sha, size, ext)
        self.progress_path(key).unlink(missing_ok=True)
        record = Finished(url=item.url, sha256=sha, size=size, path=rel, content_type=content_type,
                          verified_at=self._clock())
        with contextlib.suppress(OSError):
            self.store.save_finished(key, record)
        self._stored(item, record, ids or [])
        return self._done(item, record, media)

    def _budget(self, size: int) -> int:
        left = self.cfg.max_size - size
        if left <= 0:
            raise HlsError(f"too large: more than {self.cfg.max_size} bytes")
        return min(left, MAX_SEGMENT_BYTES)

    async def _plain(self, item: AudioItem, segment: Segment, data: bytes, keys: dict[str, bytes],
                     ids: list[str] | None = None) -> bytes:
        key = segment.key
        if key is None:
            return data
        if key.method != "AES-128":
            raise HlsError(f"encryption method {key.method[:40]} is not supported")
        if not key.uri:
            raise HlsError("AES-128 key without a URI")
        secret = keys.get(key.uri)
        if secret is None:
            # Recorded as part of the segments it unlocks, with its bytes: they are read with it.
            secret = await self._get(item, key.uri, 64, ids=ids, keep_body=True)
            if len(secret) != _KEY_BYTES:
                raise HlsError(f"the key is {len(secret)} bytes, not {_KEY_BYTES}")
            keys[key.uri] = secret
        return await asyncio.to_thread(decrypt, data, secret, segment_iv(segment))

    def _resume_point(self, key: str, media: MediaPlaylist) -> Progress | None:
        """The progress to carry on from, when the part file and the playlist still agree with it."""
        try:
            progress = Progress.from_json(self.progress_path(key).read_text(encoding="utf-8"))
            on_disk = self.store.part_path(key).stat().st_size
        except (OSError, ValueError):
            return None
        if (progress.fingerprint != media.fingerprint() or progress.segments > len(media.segments)
                or on_disk < progress.size):
            return None
        return progress

    def _save(self, key: str, progress: Progress) -> None:
        path = self.progress_path(key)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(progress.to_json(), encoding="utf-8")
        os.replace(tmp, path)


class _Transient(Exception):
    """A failure worth another attempt: the network, 429, 5xx."""


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
