"""Internet radio (SHOUTcast/Icecast): a station's answer recognised, its metadata interleave taken apart, and a
window of it recorded.

A station answers a GET with ``ICY 200 OK`` (SHOUTcast; crawler/http/http1.py reads it as HTTP/1.0) or with
``HTTP/1.0 200 OK`` and ``icy-*`` headers (Icecast), then sends audio until the listener hangs up. Asked with
``Icy-MetaData: 1``, it names an interval in ``icy-metaint: N`` and sends N audio bytes, one length byte L, then
16*L bytes of metadata (``StreamTitle='Artist - Song';StreamUrl='...';`` padded with NULs), N audio bytes again,
and so on. ``Demuxer`` is the sans-IO parser of that interleave: bytes in, audio bytes and title changes (with the
audio byte offset where each came) out, however the reads split them. ``record_station`` is its shell: it records
``live_record_seconds`` of the audio alone (the metadata taken out) through recording.py's ``Recorder`` and fills
the catalogue row (``recorded(..., fmt="icy")``).

Offsets and duration come from the audio bytes and the station's bitrate (``icy-br``) when it names a plausible
one, and from the clock of arrival only when it does not. A station's stream is constant-bitrate (``icy-br`` is
its encoder's setting), so bytes/rate is where a title change falls in the recording's own audio, which is what a
fingerprint match's offset is measured in; arrival times are not: servers send a new listener a burst of several
seconds at once (Icecast's burst-on-connect), and the network's jitter moves every later byte. The title of the first
metadata block is put at offset 0: a station sends the title on air in it, ``icy-metaint`` bytes after the audio
began.

Bounds against a hostile station: ``icy-metaint`` outside [MIN_METAINT, MAX_METAINT] is refused (a tiny interval
makes a block of metadata per audio byte), a metadata block is at most 255*16 = 4080 bytes by construction and is
held whole only until it ends, a title is cut at MAX_TITLE characters and its undecodable bytes replaced, the
station's header strings are cut at MAX_HEADER; the recording stops at its window, at ``max_size``, at a stall of
the read timeout, or when the station hangs up.
"""

from __future__ import annotations

import asyncio
import re
import time
import unicodedata
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import httpx

from crawler.http.http1 import Answer
from crawler.items import FAILED, AudioItem
from crawler.worker.audiostore import AudioStore, extension_for
from crawler.worker.recording import (
    ICY,
    MAX_PLAYED,
    MAX_PLAYED_TITLE,
    Recorder,
    RecordingTooLarge,
    Window,
    live_key,
    recorded,
)
from crawler.worker.transfer import NETWORK_ERRORS, LiveLease

MIN_METAINT = 64                  # audio bytes between metadata blocks: real stations use 8192 to 32768
MAX_METAINT = 1 << 20
MAX_META = 255 * 16               # a block's length is one byte of 16-byte units
MAX_TITLE = MAX_PLAYED_TITLE      # characters of a StreamTitle kept
MAX_HEADER = 200                  # characters of icy-name, icy-genre, icy-url kept
MIN_BITRATE, MAX_BITRATE = 8, 1536    # kbit/s an icy-br may name and be believed (else the clock is used)
STATION_HEADERS = ("icy-metaint", "icy-name", "icy-br")
# The request header that asks a station for the metadata interleave.
ASK_METADATA = ("Icy-MetaData", "1")

_TITLE = re.compile(rb"StreamTitle='(.*?)';(?=[A-Za-z_]+=|\s*$)", re.DOTALL)


class IcyError(Exception):
    """A station's answer this parser refuses (its reason is the recording's)."""


@dataclass(frozen=True, slots=True)
class Title:
    """A StreamTitle, told after ``offset`` audio bytes of the stream."""

    offset: int
    title: str


@dataclass(frozen=True, slots=True)
class Demuxed:
    audio: bytes
    titles: tuple[Title, ...]


class Demuxer:
    """The ICY metadata interleave taken apart, fed as the reads come (sans-IO).

    ``metaint`` None: the station sends no metadata (it was not asked, or gave no ``icy-metaint``), all is audio.
    Only title changes are reported (stations repeat the title, or send empty blocks, between changes); an empty
    title is no change."""

    def __init__(self, metaint: int | None) -> None:
        if metaint is not None and not MIN_METAINT <= metaint <= MAX_METAINT:
            raise IcyError(f"icy-metaint {metaint} refused (not within {MIN_METAINT}..{MAX_METAINT})")
        self.metaint = metaint
        self.audio = 0                    # audio bytes handed out so far
        self.title: str | None = None     # the last title told
        self._until_meta = metaint or 0   # audio bytes before the next length byte
        self._meta_left = -1              # metadata bytes still to come; -1: not in a block
        self._meta = bytearray()

    def feed(self, data: bytes) -> Demuxed:
        if self.metaint is None:
            self.audio += len(data)
            return Demuxed(bytes(data), ())
        view = memoryview(data)
        audio: list[bytes] = []
        titles: list[Title] = []
        while view:
            if self._meta_left < 0 and self._until_meta > 0:          # audio
                take = min(self._until_meta, len(view))
                audio.append(view[:take].tobytes())
                self.audio += take
                self._until_meta -= take
                view = view[take:]
            elif self._meta_left < 0:                                  # the length byte
                self._meta_left = view[0] * 16
                view = view[1:]
                if self._meta_left == 0:
                    self._end_block(titles)
            else:                                                      # the block
                take = min(self._meta_left, len(view))
                self._meta += view[:take]
                self._meta_left -= take
                view = view[take:]
                if self._meta_left == 0:
                    self._end_block(titles)
        return Demuxed(b"".join(audio), tuple(titles))

    def _end_block(self, titles: list[Title]) -> None:
        block, self._meta = bytes(self._meta), bytearray()
        self._meta_left = -1
        self._until_meta = self.metaint or 0
        title = stream_title(block)
        if title and title != self.title:
            self.title = title
            titles.append(Title(self.audio, title))


def stream_title(block: bytes) -> str | None:
    """The StreamTitle of one metadata block (NUL padding dropped), decoded as UTF-8 when it is, else as
    Windows-1252/Latin-1 (what older encoders send), with undecodable bytes and control characters replaced,
    and cut at MAX_TITLE characters; None when the block names none."""
    found = _TITLE.search(block.rstrip(b"\x00")[:MAX_META])
    if found is None:
        return None
    return clean_text(found.group(1), MAX_TITLE) or None


def clean_text(raw: bytes, limit: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("cp1252", errors="replace")
    text = "".join("\ufffd" if unicodedata.category(c) in ("Cc", "Cs") else c for c in text[:limit])
    return text.strip()


def metaint_of(value: str | None) -> int | None:
    """The ``icy-metaint`` header's interval; None without one; IcyError for a value refused."""
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit() or len(value) > 9:
        raise IcyError(f"icy-metaint {value[:40]!r} is not a number of bytes")
    metaint = int(value)
    if not MIN_METAINT <= metaint <= MAX_METAINT:
        raise IcyError(f"icy-metaint {metaint} refused (not within {MIN_METAINT}..{MAX_METAINT})")
    return metaint


def is_stream(extensions: Mapping[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether an answer is an internet radio station's: the ICY status line, or one of the headers only
    stations send (an interval of metadata, a station name, a bitrate). A plain ``audio/*`` type is not
    enough: files are served with it too."""
    return bool(extensions.get("icy")) or any(headers.get(name) is not None for name in STATION_HEADERS)


@dataclass(frozen=True, slots=True)
class Station:
    """What a station says of itself in its headers, bounded."""

    name: str | None
    genre: str | None
    url: str | None
    bitrate: int | None           # kbit/s, when plausible
    content_type: str | None

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> Station:
        def text(name: str) -> str | None:
            value = headers.get(name)
            if not isinstance(value, str):
                return None
            return clean_text(value.encode("latin-1", "replace"), MAX_HEADER) or None

        br = (text("icy-br") or "").split(",")[0].strip()      # some servers repeat it: "128, 128"
        bitrate = int(br) if br.isdigit() and len(br) < 6 and MIN_BITRATE <= int(br) <= MAX_BITRATE else None
        content_type = headers.get("content-type")
        return cls(name=text("icy-name"), genre=text("icy-genre"), url=text("icy-url"), bitrate=bitrate,
                   content_type=content_type[:MAX_HEADER] if isinstance(content_type, str) else None)

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (("icy_name", self.name), ("icy_genre", self.genre), ("icy_url", self.url),
                           ("icy_br", self.bitrate)):
            if value is not None:
                out[key] = value
        return out


class _Clock:
    """Seconds into the recording of an audio byte offset: from the bitrate when the station names one, else from
    when the bytes arrived (see the module's note)."""

    def __init__(self, bitrate: int | None, window: Window) -> None:
        self.rate = bitrate * 1000 / 8 if bitrate else None
        self.start = window.start
        self.last_arrival = window.start

    def at(self, offset: int, arrival: float) -> float:
        if self.rate is not None:
            return offset / self.rate
        return max(0.0, arrival - self.start)


async def record_station(item: AudioItem, answer: Answer | httpx.Response, store: AudioStore, key: str, *,
                         lease: LiveLease, max_size: int, clock: Callable[[], float] = time.time,
                         monotonic: Callable[[], float] = time.monotonic) -> AudioItem:
    """Record ``lease.seconds`` of the station whose answer (head read, body open) this is, under the download's
    lease (transfer.py: its deadline covers the window, its host slot goes back once the window is over); the item
    as the recording left it (recording.recorded), or FAILED with a reason. The caller closes the answer."""
    station = Station.of(answer.headers)
    try:
        metaint = metaint_of(answer.headers.get("icy-metaint"))
    except IcyError as exc:
        return item.replace(status=FAILED, reason=str(exc))
    demux = Demuxer(metaint)
    window = Window.open(lease.seconds, clock=clock, monotonic=monotonic)
    lease.opened()
    timing = _Clock(station.bitrate, window)
    recorder = Recorder(store, live_key(key), max_size)
    played: list[dict[str, Any]] = []
    ended = "the window closed"
    stored = False
    await recorder.open()
    try:
        try:
            async with asyncio.timeout(window.left(monotonic())):
                try:
                    async for piece in cast(AsyncIterable[bytes], answer.stream):
                        now = monotonic()
                        out = demux.feed(piece)
                        for told in out.titles:
                            if len(played) < MAX_PLAYED:
                                # The first block's title was on air from the start (see the module's note).
                                first = told.offset <= (metaint or 0)
                                offset = 0.0 if first else timing.at(told.offset, now)
                                played.append({"offset": round(offset, 3), "title": told.title})
                        if out.audio:
                            timing.last_arrival = now
                            await recorder.append(out.audio)
                        if window.closed(now):
                            break
                    else:
                        ended = "the station hung up"
                except RecordingTooLarge:
                    ended = f"the recording reached {max_size} bytes"
                except NETWORK_ERRORS as exc:
                    ended = f"{type(exc).__name__}: {exc}"[:300]
        except TimeoutError:
            ended = "the window closed"
        lease.closed()     # the network part is over: the host's slot is the next download's
        if recorder.size == 0:
            return item.replace(status=FAILED, reason=f"the station sent no audio ({ended})"[:300])
        duration = (recorder.size / timing.rate if timing.rate is not None
                    else timing.last_arrival - window.start)
        played = [p for p in played if p["offset"] <= duration]     # not past a cut at max_size
        content_type = station.content_type or "audio/mpeg"    # SHOUTcast's own default
        record = await recorder.finish(item.url, extension_for([item.url], content_type), content_type, clock)
        stored = True
    finally:
        lease.closed()
        if not stored:
            await recorder.discard()
    done = recorded(item, record, window, duration, ICY, played=played, station=station.name)
    extra = {**done.extra, **station.extra()}
    if ended != "the window closed":
        extra["ended"] = ended      # why the recording is shorter than its window
    return done.replace(extra=extra)
