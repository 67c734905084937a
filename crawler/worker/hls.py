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
item is reported as found, with ``extra.live``, and nothing is fetched. A DASH manifest is dash.py's.

The segment requests, the part file with its progress record and the bounds below are segments.py's, shared
with dash.py.

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
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crawler.archive import NO_ARCHIVE, Archive, NoArchive
from crawler.items import FAILED, AudioItem
from crawler.web import media
from crawler.web.urls import resolve
from crawler.worker import segments as shared
from crawler.worker.audiostore import AudioStore, Finished
from crawler.worker.segments import (
    MAX_DURATION,
    MAX_SEGMENT_BYTES,
    MAX_SEGMENTS,
    MIN_SEGMENT_SECONDS,
    PROGRESS_EVERY,
    SEGMENT_ALLOWANCE,
    VIDEO_CODECS,
    ByteRange,
    Joined,
    Progress,
    SegmentClient,
    StreamError,
    StreamGone,
    StreamRefused,
    container,
)
from crawler.worker.transfer import Deadline, DownloadConfig, LiveLease

log = logging.getLogger(__name__)

__all__ = ["MAX_DURATION", "MAX_SEGMENTS", "MIN_SEGMENT_SECONDS", "PROGRESS_EVERY", "SEGMENT_ALLOWANCE",
           "ByteRange", "HlsDownloader", "HlsError", "HlsRefused", "Progress", "container"]

MAX_PLAYLIST_BYTES = 4 * 1024 * 1024
MAX_VARIANTS = 1_000
_KEY_BYTES = 16
HLS = "hls"

_ATTRIBUTE = re.compile(r'([A-Z0-9-]+)=("[^"]*"|[^,]*)')

# The playlist cannot be downloaded as audio (the message becomes the item's reason); a key, segment or
# playlist the worker's client refused (its address, or its body) is logged once. segments.py raises them too.
HlsError = StreamError
HlsRefused = StreamRefused
# The server answered 404 or 410: a live stream's segment that left its window before it was fetched.
HlsGone = StreamGone
# A media sequence number is a decimal-integer (RFC 8216 4.2); a segment's default IV holds no more.
MAX_SEQUENCE = 2 ** 64 - 1


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
                if media_sequence > MAX_SEQUENCE:
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
    shared.check_length(playlist.duration, len(playlist.segments))


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
        return not any(c.startswith(VIDEO_CODECS) for c in v.codecs)
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
        self._segments = SegmentClient(client, cfg, archive=self._archive, audio_payload=audio_payload)
        self.live = live

    def claims(self, item: AudioItem, ext: str | None = None) -> bool:
        """Items the downloader hands to this module: HLS playlists. ext: media.url_extension(item.url), when the
        caller has it."""
        fmt = item.extra.get("format") if isinstance(item.extra, dict) else None
        return fmt == HLS or (media.url_extension(item.url) if ext is None else ext) == "m3u8"

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
        return shared.joined_row(item, record, len(media.segments), media.duration, playlist=media.url)

    def _stored(self, item: AudioItem, record: Finished, ids: list[str]) -> None:
        shared.archive_stored(self._archive, item, record, ids, self._clock)

    # -- network --------------------------------------------------------------------------------------
    async def _get(self, item: AudioItem, url: str, limit: int, byterange: ByteRange | None = None, *,
                   role: str = "segment", ids: list[str] | None = None, keep_body: bool = False) -> bytes:
        """A bounded GET with the item's identity, retried (segments.SegmentClient.get)."""
        return await self._segments.get(item, url, limit, byterange, role=role, ids=ids, keep_body=keep_body)

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
        joined = Joined(self.store, key, self.progress_path(key), monotonic=self._monotonic,
                        progress_every=self.progress_every)
        progress = await joined.open(media.url, media.fingerprint(), len(media.segments))
        keys: dict[str, bytes] = {}
        try:
            for segment in media.segments[progress.segments:]:
                pieces: list[bytes] = []
                if segment.init is not None and segment.init.uri != progress.init:
                    pieces.append(await self._get(item, segment.init.uri, self._budget(progress.size),
                                                  segment.init.byterange, ids=ids))
                data = await self._get(item, segment.uri, self._budget(progress.size), segment.byterange,
                                       ids=ids)
                pieces.append(await self._plain(item, segment, data, keys, ids))
                await joined.append(pieces, init=segment.init.uri if segment.init is not None else None)
                if deadline is not None:
                    deadline.stretch(None, progress.size)
        finally:
            joined.close()
        has_init = any(s.init is not None for s in media.segments)
        ext, content_type = container(joined.first, has_init)
        sha, size, rel = joined.commit(ext)
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
