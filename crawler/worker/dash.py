"""DASH audio as one file: the manifest's best audio representation, its initialisation and media segments
fetched in order and joined, resumable at segment granularity; a live (dynamic) presentation recorded for a
window.

A DASH address (ISO/IEC 23009-1) names an XML manifest, the MPD: Periods of AdaptationSets of Representations,
each Representation one encoding whose segments are named by one of

    SegmentTemplate   a pattern ($RepresentationID$, $Number$, $Time$, $Bandwidth$, each maybe %0Nd) expanded
                      for each segment: numbered from startNumber over the period's length at duration/timescale,
                      or timed by a SegmentTimeline (S t/d/r; r=-1 repeats to the next S, the period's end, or
                      in a live presentation the live edge)
    SegmentList       an Initialization and SegmentURLs (media, mediaRange)
    SegmentBase       a single file at the BaseURL: downloaded whole (its index and init ranges are in it)

with BaseURL resolved at every level (MPD, Period, AdaptationSet, Representation), in order, against the
manifest's address, and SegmentTemplate/SegmentList attributes inherited downwards. Concatenating the
initialisation segment and the media segments gives a file players open: a fragmented MP4 (ffmpeg's ``-f
dash`` default) or WebM (``-dash_segment_type webm``), named by its first bytes (segments.container).

Which representation: in each period, of the audio ones (contentType or mimeType audio, or codecs naming no
video codec), the highest bandwidth, an unprotected one before a protected one. A presentation whose sound is
only inside video is not downloaded as audio (the item fails with the reason); one whose every audio
representation carries ContentProtection (CENC, or any DRM scheme) is recorded as ``unavailable`` with the
reason ``dash: encrypted (<scheme>)``, and nothing is fetched.

A static MPD is downloaded like HLS (segments.py's ``Joined``): progress in ``<key>.dash.json`` beside the part
file, under the downloader's whole-download deadline stretched by the bytes written, the manifest archived as a
``playlist`` exchange and the media as ``segment`` ones. The row: ``extra.format`` "dash", ``extra.segments``,
sha256/size/path of the joined file, ``duration`` the MPD's (mediaPresentationDuration, else its segments').

A dynamic MPD is live: recorded for ``live_record_seconds`` (recording.py). The live edge comes from
availabilityStartTime and the wall clock (passed in): with a SegmentTemplate of duration/timescale, segment k
of a period is available once ``availabilityStartTime + period start + (k + 1) * duration`` has passed, so the
recorder starts at the newest available segment and waits for each next one; with a SegmentTimeline the
manifest lists what is available, and it is fetched again every minimumUpdatePeriod for the new segments.
Init first, then each new segment until the window closes. The row is ``recording.recorded``'s with
``extra.format`` "dash" and ``duration`` the seconds of segments recorded. A recording is never resumed nor
reused: the next visit records a new window.

Bounds: the manifest is read up to ``MAX_MPD_BYTES`` and ``MAX_ELEMENTS`` elements, and refused outright when
it has a DOCTYPE or ENTITY declaration (no entity expansion, so no billion laughs and no external entities); at
most ``MAX_SEGMENTS`` segments, no more than the declared duration explains (``check_length``), at most
``MAX_DURATION`` of audio; a live template's segments are at least ``MIN_SEGMENT_SECONDS`` long, the manifest
is fetched again no more often than ``MIN_REFRESH`` seconds, and a recording holds the download's slot for its
window, not longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from crawler.archive import NO_ARCHIVE, Archive, NoArchive
from crawler.items import FAILED, UNAVAILABLE, AudioItem
from crawler.web import media
from crawler.web.urls import InvalidURL, resolve
from crawler.worker.audiostore import AudioStore, Finished
from crawler.worker.recording import Recorder, RecordingTooLarge, Window, live_key, recorded
from crawler.worker.segments import (
    MAX_DURATION,
    MAX_SEGMENT_BYTES,
    MAX_SEGMENTS,
    MIN_SEGMENT_SECONDS,
    PROGRESS_EVERY,
    VIDEO_CODECS,
    ByteRange,
    Joined,
    SegmentClient,
    StreamError,
    StreamRefused,
    archive_stored,
    check_length,
    container,
    joined_row,
)
from crawler.worker.transfer import Deadline, DownloadConfig, LiveLease

log = logging.getLogger(__name__)

DASH = "dash"
MAX_MPD_BYTES = 4 * 1024 * 1024
MAX_ELEMENTS = 100_000
MAX_TEMPLATE_WIDTH = 32           # %0Nd: wider than any number has digits
MIN_REFRESH = 0.5                 # seconds between fetches of a live manifest, whatever it asks for
MAX_LIVE_BATCH = 64               # segments taken from one look at a live manifest
MAX_EDGE_MISSES = 3               # failures in a row of a segment due (the origin's clock behind ours?) before
EDGE_RETRY = 0.5                  # the recording stops; seconds between them
_TEXT_CODECS = ("stpp", "wvtt", "tx3g", "c608", "c708")
_MP4_PROTECTION = "urn:mpeg:dash:mp4protection:2011"
_IDENTIFIER = re.compile(r"\$(RepresentationID|Number|Bandwidth|Time)(?:%0(\d{1,3})d)?\$")
_DURATION = re.compile(r"^(-)?P(?:(\d+(?:\.\d+)?)Y)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)D)?"
                       r"(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


class DashError(StreamError):
    """The manifest cannot be downloaded as audio; the message becomes the item's reason."""


class Encrypted(DashError):
    """Every audio representation is protected: the item is unavailable, not failed."""


# --------------------------------------------------------------------------------------------- the manifest
@dataclass(frozen=True)
class Piece:
    """One address to fetch, maybe a byte range of it."""

    url: str
    byterange: ByteRange | None = None

    def name(self) -> str:
        """The address without its query string (often a per-client token), with its range."""
        br = self.byterange
        return self.url.split("?", 1)[0] + (f"@{br.offset}+{br.length}" if br is not None else "")


@dataclass(frozen=True)
class Segment:
    media: Piece
    duration: float                   # seconds
    init: Piece | None = None
    number: int = 0
    time: int = 0                     # in the representation's timescale


@dataclass(frozen=True)
class TimelineEntry:
    t: int | None
    d: int
    r: int


@dataclass(frozen=True)
class Addressing:
    """How a representation's segments are named: ``kind`` template, list or base."""

    kind: str
    media: str | None = None          # the template, or (list) unused
    initialization: str | None = None
    timescale: int = 1
    duration: int | None = None
    start_number: int = 1
    presentation_time_offset: int = 0
    timeline: tuple[TimelineEntry, ...] = ()
    init_piece: Piece | None = None   # a list's or base's Initialization
    pieces: tuple[Piece, ...] = ()    # a list's SegmentURLs


@dataclass(frozen=True)
class Representation:
    id: str
    bandwidth: int
    mime: str
    codecs: tuple[str, ...]
    content_type: str
    base: str                         # its BaseURL, resolved through every level
    protection: str | None            # the protection scheme, when it carries ContentProtection
    addressing: Addressing
    period_start: float               # seconds from the presentation's start
    period_duration: float | None

    @property
    def audio(self) -> bool:
        """Sound alone: no video codec, and audio by its codecs or, without codecs, by its type."""
        kind = self.content_type or self.mime.split("/", 1)[0]
        if self.codecs:
            if any(c.startswith(VIDEO_CODECS) for c in self.codecs):
                return False
            if all(c.startswith(_TEXT_CODECS) for c in self.codecs):
                return False
            return kind in ("audio", "video", "")
        return kind == "audio"

    @property
    def muxed(self) -> bool:
        """Video with its sound inside."""
        return any(c.startswith(VIDEO_CODECS) for c in self.codecs) and any(
            not c.startswith(VIDEO_CODECS + _TEXT_CODECS) for c in self.codecs)


@dataclass(frozen=True)
class Period:
    start: float
    duration: float | None
    representations: tuple[Representation, ...]


@dataclass(frozen=True)
class Manifest:
    url: str
    dynamic: bool
    duration: float | None            # mediaPresentationDuration
    availability_start: float | None  # epoch seconds
    minimum_update_period: float | None
    periods: tuple[Period, ...]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(el: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in el if _local(c.tag) == name]


def _child(el: ET.Element | None, name: str) -> ET.Element | None:
    if el is None:
        return None
    for c in el:
        if _local(c.tag) == name:
            return c
    return None


def _int(value: str | None, default: int | None = None) -> int | None:
    if value is None:
        return default
    try:
        n = int(value.strip())
    except ValueError:
        raise DashError(f"not a whole number: {value[:40]!r}") from None
    return n


def duration_seconds(value: str | None) -> float | None:
    """An xs:duration (PT1H2M3.5S, P1DT2H); None when absent. Years and months count as 365 and 30 days."""
    if value is None:
        return None
    m = _DURATION.match(value.strip())
    if m is None or not any(m.group(i) for i in range(2, 8)):
        raise DashError(f"not a duration: {value[:40]!r}")
    y, mo, d, h, mi, s = (float(m.group(i) or 0) for i in range(2, 8))
    total = ((y * 365 + mo * 30 + d) * 24 + h) * 3600 + mi * 60 + s
    if not math.isfinite(total):
        raise DashError(f"not a duration: {value[:40]!r}")
    return -total if m.group(1) else total


def date_seconds(value: str | None) -> float | None:
    """An xs:dateTime as epoch seconds (UTC when it names no zone); None when absent."""
    if value is None:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise DashError(f"not a date: {value[:40]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _read_xml(text: str) -> ET.Element:
    """The manifest's root, refused before parsing when it declares a DOCTYPE or entities, and while parsing
    when it has more than MAX_ELEMENTS elements."""
    if len(text) > MAX_MPD_BYTES:
        raise DashError(f"manifest larger than {MAX_MPD_BYTES} bytes")
    lowered = text[:MAX_MPD_BYTES].lower()
    if "<!doctype" in lowered or "<!entity" in lowered:
        raise DashError("the manifest declares a DOCTYPE or entities")
    parser: ET.XMLPullParser[ET.Element] = ET.XMLPullParser(events=("start",))
    count = 0
    root: ET.Element | None = None
    try:
        for i in range(0, len(text), 65536):
            parser.feed(text[i:i + 65536])
            for event in parser.read_events():
                if root is None and isinstance(event, tuple) and isinstance(event[-1], ET.Element):
                    root = event[-1]
                count += 1
                if count > MAX_ELEMENTS:
                    raise DashError(f"more than {MAX_ELEMENTS} elements in the manifest")
        parser.close()
    except ET.ParseError as exc:
        raise DashError(f"not XML: {exc}") from None
    if root is None or _local(root.tag) != "MPD":
        raise DashError("not a DASH manifest (no MPD element)")
    return root


def is_manifest_text(text: str) -> bool:
    return "<MPD" in text[:4096]


def parse(text: str, url: str) -> Manifest:
    """One MPD, its addresses made absolute against ``url``. Raises DashError for what is not a usable MPD."""
    root = _read_xml(text)
    dynamic = (root.get("type") or "static").strip() == "dynamic"
    total = duration_seconds(root.get("mediaPresentationDuration"))
    base = _base(url, root)
    period_elements = _children(root, "Period")
    periods: list[Period] = []
    start = 0.0
    for i, p in enumerate(period_elements):
        start = duration_seconds(p.get("start")) or 0.0 if p.get("start") is not None else start
        length = duration_seconds(p.get("duration"))
        if length is None:
            if i + 1 < len(period_elements) and period_elements[i + 1].get("start") is not None:
                length = (duration_seconds(period_elements[i + 1].get("start")) or 0.0) - start
            elif total is not None:
                length = total - start
        if length is not None and (length < 0 or not math.isfinite(length)):
            raise DashError("a period of negative length")
        periods.append(_period(p, _base(base, p), start, length))
        if length is not None:
            start += length
    if not periods:
        raise DashError("the manifest has no Period")
    return Manifest(url, dynamic, total, date_seconds(root.get("availabilityStartTime")),
                    duration_seconds(root.get("minimumUpdatePeriod")), tuple(periods))


def _base(base: str, el: ET.Element) -> str:
    """``base`` joined with the element's first BaseURL, if it has one."""
    b = _child(el, "BaseURL")
    if b is None or not (b.text or "").strip():
        return base
    try:
        return resolve(base, (b.text or "").strip())
    except InvalidURL as exc:
        raise DashError(f"bad BaseURL: {exc}") from None


def _period(p: ET.Element, base: str, start: float, length: float | None) -> Period:
    reps: list[Representation] = []
    for aset in _children(p, "AdaptationSet"):
        aset_base = _base(base, aset)
        aset_protection = _protection(aset)
        for r in _children(aset, "Representation"):
            codecs = r.get("codecs") or aset.get("codecs") or ""
            levels = (p, aset, r)
            reps.append(Representation(
                id=r.get("id") or "", bandwidth=_int(r.get("bandwidth"), 0) or 0,
                mime=(r.get("mimeType") or aset.get("mimeType") or "").strip().lower(),
                codecs=tuple(c.strip().lower() for c in codecs.split(",") if c.strip()),
                content_type=(r.get("contentType") or aset.get("contentType") or "").strip().lower(),
                base=_base(aset_base, r), protection=_protection(r) or aset_protection,
                addressing=_addressing(levels, _base(aset_base, r)), period_start=start, period_duration=length))
    return Period(start, length, tuple(reps))


def _protection(el: ET.Element) -> str | None:
    schemes = _children(el, "ContentProtection")
    if not schemes:
        return None
    for cp in schemes:
        if (cp.get("schemeIdUri") or "").strip().lower() == _MP4_PROTECTION and cp.get("value"):
            return (cp.get("value") or "").strip().lower()[:20]
    return "cenc"


def _addressing(levels: tuple[ET.Element, ...], base: str) -> Addressing:
    """The representation's addressing: the lowest level's SegmentTemplate (attributes inherited from the levels
    above), else SegmentList, else a single file at its BaseURL."""
    templates = [t for t in (_child(el, "SegmentTemplate") for el in levels) if t is not None]
    lists = [t for t in (_child(el, "SegmentList") for el in levels) if t is not None]
    if templates:
        attrs: dict[str, str] = {}
        timeline: ET.Element | None = None
        for t in templates:
            attrs.update(t.attrib)
            timeline = _child(t, "SegmentTimeline") or timeline
        if not attrs.get("media"):
            raise DashError("a SegmentTemplate without a media pattern")
        timescale, duration, start_number, offset = _timing(attrs)
        return Addressing("template", media=attrs["media"], initialization=attrs.get("initialization"),
                          timescale=timescale, duration=duration, start_number=start_number,
                          presentation_time_offset=offset, timeline=_timeline(timeline))
    if lists:
        attrs = {}
        for t in lists:
            attrs.update(t.attrib)
        own = lists[-1]
        init = _child(own, "Initialization")
        init_piece = None
        if init is not None:
            init_piece = Piece(_join(base, init.get("sourceURL")), _range(init.get("range")))
        pieces = tuple(Piece(_join(base, s.get("media")), _range(s.get("mediaRange")))
                       for s in _children(own, "SegmentURL"))
        timescale, duration, start_number, offset = _timing(attrs)
        return Addressing("list", timescale=timescale, duration=duration, start_number=start_number,
                          presentation_time_offset=offset, init_piece=init_piece, pieces=pieces)
    return Addressing("base")


def _timing(attrs: dict[str, str]) -> tuple[int, int | None, int, int]:
    """(timescale, duration, startNumber, presentationTimeOffset)."""
    timescale = _int(attrs.get("timescale"), 1) or 0
    if timescale <= 0:
        raise DashError("a timescale that is not positive")
    duration = _int(attrs.get("duration"))
    if duration is not None and duration <= 0:
        raise DashError("a segment duration that is not positive")
    return timescale, duration, _int(attrs.get("startNumber"), 1) or 0, _int(
        attrs.get("presentationTimeOffset"), 0) or 0


def _timeline(el: ET.Element | None) -> tuple[TimelineEntry, ...]:
    if el is None:
        return ()
    out = []
    for s in _children(el, "S"):
        d = _int(s.get("d"))
        if d is None or d <= 0:
            raise DashError("a SegmentTimeline entry without a positive duration")
        r = _int(s.get("r"), 0) or 0
        if r < -1:
            raise DashError("a SegmentTimeline repeat below -1")
        out.append(TimelineEntry(_int(s.get("t")), d, r))
    return tuple(out)


def _join(base: str, ref: str | None) -> str:
    if not ref:
        return base
    try:
        return resolve(base, ref)
    except InvalidURL as exc:
        raise DashError(f"bad segment address: {exc}") from None


def _range(value: str | None) -> ByteRange | None:
    if not value:
        return None
    first, _, last = value.strip().partition("-")
    try:
        a, b = int(first), int(last)
    except ValueError:
        raise DashError(f"bad byte range {value[:40]!r}") from None
    if a < 0 or b < a:
        raise DashError(f"bad byte range {value[:40]!r}")
    return ByteRange(b - a + 1, a)


def expand(template: str, rep: Representation, number: int = 0, time_: int = 0) -> str:
    """A SegmentTemplate pattern with its identifiers filled in ($$ is a dollar sign)."""
    def one(m: re.Match[str]) -> str:
        name, width = m.group(1), m.group(2)
        if name == "RepresentationID":
            return rep.id
        value = {"Number": number, "Bandwidth": rep.bandwidth, "Time": time_}[name]
        w = int(width) if width else 1
        if w > MAX_TEMPLATE_WIDTH:
            raise DashError(f"a template width of {w} digits")
        return str(value).rjust(w, "0") if value >= 0 else str(value)
    return _IDENTIFIER.sub(one, template).replace("$$", "$")


# --------------------------------------------------------------------------------------------- choosing
def choose_audio(period: Period) -> Representation | None:
    """The period's best audio representation (see the module's note), None when it has none. Raises Encrypted
    when every audio one is protected."""
    audio = [r for r in period.representations if r.audio]
    if not audio:
        return None
    clear = [r for r in audio if r.protection is None]
    if not clear:
        best = max(audio, key=lambda r: r.bandwidth)
        raise Encrypted(f"encrypted ({best.protection})")
    return max(clear, key=lambda r: r.bandwidth)


def chosen(manifest: Manifest) -> list[Representation]:
    """One audio representation per period that has one. Raises DashError when none has."""
    out: list[Representation] = []
    encrypted: Encrypted | None = None
    for period in manifest.periods:
        try:
            rep = choose_audio(period)
        except Encrypted as exc:
            encrypted = exc
            continue
        if rep is not None:
            out.append(rep)
    if encrypted is not None:
        raise encrypted
    if out:
        return out
    if any(r.muxed for p in manifest.periods for r in p.representations):
        raise DashError("no audio-only representation: its sound is only inside video")
    raise DashError("no audio representation")


def _init_piece(rep: Representation) -> Piece | None:
    a = rep.addressing
    if a.kind == "template":
        return Piece(_join(rep.base, expand(a.initialization, rep))) if a.initialization else None
    return a.init_piece


def _timeline_times(a: Addressing, end: int | None) -> Iterator[tuple[int, int]]:
    """(t, d) of each segment a timeline lists, r=-1 repeating to the next entry's t, else to ``end`` (in
    timescale units; None: not known, which is an error only when such a repeat needs it)."""
    t = a.presentation_time_offset
    for i, s in enumerate(a.timeline):
        if s.t is not None:
            t = s.t
        if s.r >= 0:
            repeats = s.r + 1
        else:
            nxt = a.timeline[i + 1].t if i + 1 < len(a.timeline) else None
            stop = nxt if nxt is not None else end
            if stop is None:
                raise DashError("a SegmentTimeline repeats to an end the manifest does not give")
            repeats = max(0, -(-(stop - t) // s.d))
        for _ in range(repeats):
            yield t, s.d
            t += s.d


def representation_segments(rep: Representation, *, until: float | None = None) -> list[Segment]:
    """The media segments of a representation, each with its init piece. ``until``: for a live presentation,
    the seconds since the period's start up to which segments exist (the live edge); else the period's end.
    Raises DashError past MAX_SEGMENTS."""
    a = rep.addressing
    init = _init_piece(rep)
    out: list[Segment] = []
    length = rep.period_duration if until is None else until

    def add(seg: Segment) -> None:
        if len(out) >= MAX_SEGMENTS:
            raise DashError(f"more than {MAX_SEGMENTS} segments")
        out.append(seg)

    if a.kind == "base":
        add(Segment(Piece(rep.base), rep.period_duration or 0.0, None))
        return out
    if a.kind == "list":
        each = a.duration / a.timescale if a.duration else (
            (rep.period_duration or 0.0) / len(a.pieces) if a.pieces else 0.0)
        for i, piece in enumerate(a.pieces):
            add(Segment(piece, each, init, a.start_number + i))
        return out
    assert a.media is not None
    if a.timeline:
        end = None if length is None else a.presentation_time_offset + int(length * a.timescale)
        for i, (t, d) in enumerate(_timeline_times(a, end)):
            if until is not None and end is not None and t + d > end:
                break                 # not yet available
            add(Segment(Piece(_join(rep.base, expand(a.media, rep, a.start_number + i, t))), d / a.timescale,
                        init, a.start_number + i, t))
        return out
    if a.duration is None:
        raise DashError("a SegmentTemplate with neither duration nor SegmentTimeline")
    if length is None:
        raise DashError("the presentation's length is not known")
    each = a.duration / a.timescale
    if until is None:
        count = max(0, math.ceil(length / each - 1e-9))
    else:
        count = max(0, math.floor(length / each + 1e-9))
    if count > MAX_SEGMENTS:
        raise DashError(f"more than {MAX_SEGMENTS} segments")
    for k in range(count):
        number = a.start_number + k
        t = a.presentation_time_offset + k * a.duration
        add(Segment(Piece(_join(rep.base, expand(a.media, rep, number, t))), each, init, number, t))
    return out


@dataclass(frozen=True)
class Plan:
    """What a static presentation's download fetches."""

    segments: tuple[Segment, ...]
    duration: float

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for s in self.segments:
            h.update((s.media.name() + "\n").encode("utf-8", "surrogatepass"))
            if s.init is not None:
                h.update(("init " + s.init.name() + "\n").encode("utf-8", "surrogatepass"))
        return h.hexdigest()


def static_plan(manifest: Manifest) -> Plan:
    """The segments to download, checked against the declared length. Raises DashError."""
    if manifest.duration is not None and manifest.duration > MAX_DURATION:
        raise DashError(f"declares {manifest.duration:.0f} s of audio, more than {MAX_DURATION:.0f} s")
    segments: list[Segment] = []
    for rep in chosen(manifest):
        segments += representation_segments(rep)
        if len(segments) > MAX_SEGMENTS:
            raise DashError(f"more than {MAX_SEGMENTS} segments")
    if not segments:
        raise DashError("the manifest names no segments")
    listed = sum(s.duration for s in segments)
    duration = manifest.duration if manifest.duration is not None else listed
    check_length(max(duration, listed), len(segments))
    return Plan(tuple(segments), duration)


# --------------------------------------------------------------------------------------------- live
@dataclass(frozen=True)
class LiveView:
    """What a live presentation offers at one moment: the segments available after the last one taken, and
    when to look again (seconds from now)."""

    segments: tuple[Segment, ...]
    wait: float


def live_representation(manifest: Manifest, now: float, previous: Representation | None = None) -> Representation:
    """The audio representation of the period playing at ``now`` (epoch seconds): the one recorded so far when
    the manifest still has it."""
    if manifest.availability_start is None:
        raise DashError("a dynamic manifest without availabilityStartTime")
    elapsed = now - manifest.availability_start
    playing = [p for p in manifest.periods if p.start <= elapsed] or [manifest.periods[0]]
    rep = choose_audio(playing[-1])
    if rep is None:
        raise DashError("no audio representation in the live period")
    if previous is not None:
        same = [r for r in playing[-1].representations if r.id == previous.id and r.audio]
        if same and same[0].protection is None:
            return same[0]
    return rep


def live_view(manifest: Manifest, rep: Representation, now: float, after: Segment | None) -> LiveView:
    """The segments available at ``now`` after ``after`` (the newest one alone when nothing was taken yet)."""
    assert manifest.availability_start is not None
    a = rep.addressing
    elapsed = now - manifest.availability_start - rep.period_start
    if a.kind != "template":
        raise DashError("a live representation without a SegmentTemplate")
    if not a.timeline:
        if a.duration is None:
            raise DashError("a SegmentTemplate with neither duration nor SegmentTimeline")
        each = a.duration / a.timescale
        if each < MIN_SEGMENT_SECONDS:
            raise DashError(f"live segments of {each:.3f} s")
        edge = math.floor(elapsed / each + 1e-9) - 1          # the newest whole segment, 0-based
        first = edge if after is None else after.number - a.start_number + 1
        first = max(first, 0, edge - MAX_LIVE_BATCH + 1)
        out = []
        for k in range(first, edge + 1):
            number, t = a.start_number + k, a.presentation_time_offset + k * a.duration
            out.append(Segment(Piece(_join(rep.base, expand(a.media or "", rep, number, t))), each,
                               _init_piece(rep), number, t))
        wait = (edge + 2) * each - elapsed                     # until the segment after the edge is whole
        return LiveView(tuple(out), max(0.0, wait))
    # Only the segments taken are built (their addresses made): the timeline before them is counted through.
    end = a.presentation_time_offset + int(max(0.0, elapsed) * a.timescale)
    picked: list[tuple[int, int, int]] = []
    newest = 0
    for i, (t, d) in enumerate(_timeline_times(a, end)):
        if i >= MAX_SEGMENTS:
            raise DashError(f"more than {MAX_SEGMENTS} segments")
        if t + d > end:
            break                     # not yet available
        newest = d
        if after is None:
            picked[:] = [(i, t, d)]
        elif t > after.time:
            picked.append((i, t, d))
            if len(picked) >= MAX_LIVE_BATCH:
                break
    init = _init_piece(rep)
    fresh = tuple(Segment(Piece(_join(rep.base, expand(a.media or "", rep, a.start_number + i, t))),
                          d / a.timescale, init, a.start_number + i, t) for i, t, d in picked)
    # Look again after a segment's length: a timeline whose last entry repeats (r=-1) grows with the clock alone,
    # another needs the manifest fetched again (refresh_every) to list more.
    return LiveView(fresh, max(MIN_REFRESH, newest / a.timescale))


def refresh_every(manifest: Manifest) -> float:
    """Seconds between fetches of a live manifest: its minimumUpdatePeriod, bounded below by MIN_REFRESH."""
    return max(MIN_REFRESH, manifest.minimum_update_period or 0.0)


# --------------------------------------------------------------------------------------------- the download
class DashDownloader:
    """One file per DASH item. Called by the Downloader, inside the item's host slot."""

    def __init__(self, client: httpx.AsyncClient, store: AudioStore, cfg: DownloadConfig, *,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 progress_every: float = PROGRESS_EVERY, archive: Archive = NO_ARCHIVE,
                 audio_payload: bool = False) -> None:
        """clock: wall-clock time, for records and a live presentation's edge; monotonic and sleep: the window's
        clock and how a recording waits for its next segment; archive: as hls.HlsDownloader's."""
        self.store, self.cfg, self._clock = store, cfg, clock
        self._monotonic, self._sleep, self.progress_every = monotonic, sleep, progress_every
        self._archive = None if isinstance(archive, NoArchive) else archive
        self._segments = SegmentClient(client, cfg, archive=self._archive, audio_payload=audio_payload)

    def claims(self, item: AudioItem, ext: str | None = None) -> bool:
        """Items the downloader hands to this module: DASH manifests. ext: media.url_extension(item.url), when
        the caller has it."""
        fmt = item.extra.get("format") if isinstance(item.extra, dict) else None
        # Asked before hls.py's: an address named .mpd is DASH unless the browser saw an HLS playlist there.
        return fmt == DASH or (fmt != "hls" and (media.url_extension(item.url) if ext is None else ext) == "mpd")

    def progress_path(self, key: str) -> Path:
        return self.store.partial_dir / f"{key}.dash.json"

    async def fetch(self, item: AudioItem, key: str, known: Finished | None = None,
                    deadline: Deadline | None = None, lease: LiveLease | None = None) -> AudioItem:
        """``deadline``: the downloader's whole-download deadline, stretched here by the bytes written; its expiry
        cancels this coroutine. ``lease``: the terms a live presentation is recorded under (transfer.py: the
        deadline covering the window, the host slot given back once the network part is over)."""
        item = item.replace(extra={**item.extra, "format": DASH})
        ids: list[str] = []     # the records of this item's exchanges, when they are archived
        try:
            manifest = await self._manifest(item, item.url, ids)
            if manifest.dynamic:
                return await self._record(item, key, manifest, deadline, ids, lease or LiveLease(
                    self.cfg.live_record_seconds, self.cfg.timeout, deadline))
            # Off the loop: a few lines of template may name tens of thousands of segments.
            plan = await asyncio.to_thread(static_plan, manifest)
            if known is not None and self.store.holds(known):
                # The same key finished before and its file is still there: a static presentation does not change.
                self._stored(item, known, ids)
                return self._done(item, known, plan)
            return await self._download(item, key, plan, deadline, ids)
        except Encrypted as exc:
            return item.replace(status=UNAVAILABLE, reason=f"dash: {exc}"[:300])
        except StreamError as exc:
            if isinstance(exc, StreamRefused):
                log.info("dash %s refused: %s", item.url[:200], exc)
            return item.replace(status=FAILED, reason=f"dash: {exc}"[:300])
        except ValueError as exc:   # a number or address in the manifest nothing could make sense of
            return item.replace(status=FAILED, reason=f"dash: unusable manifest: {exc}"[:300])
        except OSError as exc:
            return item.replace(status=FAILED, reason=f"storage: {exc}")

    async def _manifest(self, item: AudioItem, url: str, ids: list[str] | None = None) -> Manifest:
        text = (await self._segments.get(item, url, MAX_MPD_BYTES, role="playlist", ids=ids)).decode(
            "utf-8", "replace")
        # A big manifest is parsed off the loop: its size is the site's choice, up to the cap.
        return parse(text, url) if len(text) < 65536 else await asyncio.to_thread(parse, text, url)

    def _done(self, item: AudioItem, record: Finished, plan: Plan) -> AudioItem:
        return joined_row(item, record, len(plan.segments), plan.duration)

    def _stored(self, item: AudioItem, record: Finished, ids: list[str]) -> None:
        archive_stored(self._archive, item, record, ids, self._clock)

    def _budget(self, size: int) -> int:
        left = self.cfg.max_size - size
        if left <= 0:
            raise DashError(f"too large: more than {self.cfg.max_size} bytes")
        return min(left, MAX_SEGMENT_BYTES)

    async def _download(self, item: AudioItem, key: str, plan: Plan, deadline: Deadline | None,
                        ids: list[str]) -> AudioItem:
        joined = Joined(self.store, key, self.progress_path(key), monotonic=self._monotonic,
                        progress_every=self.progress_every)
        progress = await joined.open(item.url, plan.fingerprint(), len(plan.segments))
        try:
            for segment in plan.segments[progress.segments:]:
                pieces: list[bytes] = []
                init = segment.init.name() if segment.init is not None else None
                if segment.init is not None and init != progress.init:
                    pieces.append(await self._segments.get(item, segment.init.url, self._budget(progress.size),
                                                           segment.init.byterange, ids=ids))
                pieces.append(await self._segments.get(item, segment.media.url, self._budget(progress.size),
                                                       segment.media.byterange, ids=ids))
                await joined.append(pieces, init=init)
                if deadline is not None:
                    deadline.stretch(None, progress.size)
        finally:
            joined.close()
        ext, content_type = container(joined.first, any(s.init is not None for s in plan.segments))
        sha, size, rel = joined.commit(ext)
        record = Finished(url=item.url, sha256=sha, size=size, path=rel, content_type=content_type,
                          verified_at=self._clock())
        with contextlib.suppress(OSError):
            self.store.save_finished(key, record)
        self._stored(item, record, ids)
        return self._done(item, record, plan)

    # -- live -----------------------------------------------------------------------------------------
    async def _record(self, item: AudioItem, key: str, manifest: Manifest, deadline: Deadline | None,
                      ids: list[str], lease: LiveLease) -> AudioItem:
        """The live presentation recorded for the window (see the module's note)."""
        window = Window.open(lease.seconds, clock=self._clock, monotonic=self._monotonic)
        lease.opened()
        recorder = Recorder(self.store, live_key(key), self.cfg.max_size)
        await recorder.open()
        recorded_seconds, count = 0.0, 0
        try:
            rep = live_representation(manifest, self._clock())
            init = _init_piece(rep)
            if init is not None:
                await recorder.append(await self._segments.get(item, init.url, self._room(recorder),
                                                               init.byterange, ids=ids))
            last: Segment | None = None
            refreshed = self._monotonic()
            stalled = False
            misses = 0
            while not stalled and not window.closed(self._monotonic()):
                view = live_view(manifest, rep, self._clock(), last)
                for segment in view.segments:
                    if window.closed(self._monotonic()):
                        break
                    try:
                        data = await self._segments.get(item, segment.media.url, self._room(recorder),
                                                        segment.media.byterange, ids=ids)
                    except StreamError as exc:
                        if isinstance(exc, StreamRefused) or (count == 0 and misses >= MAX_EDGE_MISSES):
                            raise
                        if misses >= MAX_EDGE_MISSES:
                            log.info("dash %s: the live stream stopped: %s", item.url[:200], exc)
                            stalled = True        # what was recorded stands
                            break
                        # Likely the origin's clock is behind ours: the segment is not there yet. Asked again.
                        misses += 1
                        view = LiveView((), EDGE_RETRY)
                        break
                    misses = 0
                    await recorder.append(data)
                    recorded_seconds += segment.duration
                    count += 1
                    last = segment
                    if deadline is not None:
                        deadline.stretch(None, recorder.size)
                left = window.left(self._monotonic())
                if stalled or left <= 0:
                    break
                await self._sleep(min(left, max(view.wait, 0.05)))
                if window.closed(self._monotonic()):
                    break
                if rep.addressing.timeline and self._monotonic() - refreshed >= refresh_every(manifest):
                    manifest = await self._manifest(item, item.url, ids)
                    refreshed = self._monotonic()
                    if not manifest.dynamic:
                        break         # the event ended: what was recorded stands
                    rep = live_representation(manifest, self._clock(), rep)
            if count == 0:
                raise DashError("the live stream offered no segment within the window")
        except RecordingTooLarge:
            if count == 0:
                await recorder.discard()
                raise DashError(f"too large: more than {self.cfg.max_size} bytes") from None
        except BaseException:
            lease.closed()
            await recorder.discard()
            raise
        lease.closed()     # the network part is over: the host's slot is the next download's
        ext, content_type = container(recorder.first, True)
        record = await recorder.finish(item.url, ext, content_type, self._clock)
        self._stored(item, record, ids)
        row = recorded(item, record, window, recorded_seconds, DASH)
        return row.replace(extra={**row.extra, "segments": count})

    def _room(self, recorder: Recorder) -> int:
        left = self.cfg.max_size - recorder.size
        if left <= 0:
            raise RecordingTooLarge(f"too large: more than {self.cfg.max_size} bytes")
        return min(left, MAX_SEGMENT_BYTES)
