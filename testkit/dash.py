"""DASH presentations made in the test with ffmpeg's dash muxer, as a packager would, and a live one on loopback.

    p = make(Path("song.wav"), site / "dash" / "song", kind="number")
    p.mpd                    # site/dash/song/manifest.mpd
    p.files                  # the init segment and the media segments the MPD names, in order
    p.joined()               # what a downloaded copy must hold: their bytes joined

Kinds: ``number`` (SegmentTemplate $Number$ over duration/timescale), ``timeline`` (SegmentTemplate with a
SegmentTimeline, $Number$), ``time`` (the same named by $Time$), ``webm`` (Opus in WebM segments, a timeline),
``list`` (one file, a SegmentList of mediaRanges). ``protected=True`` adds ContentProtection (CENC, and a DRM
system's UUID) to the adaptation set, as an encrypted presentation declares it (the bytes are not encrypted:
nothing must be fetched anyway).

``LiveServer`` serves a dynamic MPD made from a ``number`` presentation of a long file: segment k (from 0) of the
live stream is available once ``availabilityStartTime + (k + 1) * seconds`` has passed on its clock, and is the
file's segment k modulo their count; a segment asked for before that is 404, as on a real origin. With
``timeline=True`` the MPD lists the available segments in a SegmentTimeline named by $Time$, for clients that
fetch the manifest again.
"""

from __future__ import annotations

import hashlib
import math
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from aiohttp import web

MPD = "manifest.mpd"
KINDS = ("number", "timeline", "time", "webm", "list")


@dataclass
class Presentation:
    root: Path
    kind: str
    seconds: float                                  # the segment duration asked of the packager
    files: list[Path] = field(default_factory=list)  # init first, then the media segments, in the MPD's order
    ranges: list[tuple[int, int]] = field(default_factory=list)   # ``list``: (first, last) byte of each piece

    @property
    def mpd(self) -> Path:
        return self.root / MPD

    def joined(self) -> bytes:
        if self.kind == "list":
            data = self.files[0].read_bytes()
            return b"".join(data[a:b + 1] for a, b in self.ranges)
        return b"".join(f.read_bytes() for f in self.files)

    def sha256(self) -> str:
        return hashlib.sha256(self.joined()).hexdigest()


def make(source: Path, dest: Path, *, kind: str = "number", seconds: float = 2.0, bitrate: str = "64k",
         protected: bool = False) -> Presentation:
    """A presentation of ``source`` (any audio ffmpeg reads) in ``dest``, its manifest ``dest/manifest.mpd``."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {KINDS}")
    dest.mkdir(parents=True, exist_ok=True)
    codec = ["-c:a", "libopus"] if kind == "webm" else ["-c:a", "aac"]
    args = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y", "-i", str(source), "-vn", *codec,
            "-b:a", bitrate, "-f", "dash", "-seg_duration", str(seconds),
            "-use_template", "1", "-use_timeline", "0" if kind == "number" else "1"]
    if kind == "webm":
        args += ["-dash_segment_type", "webm"]
    if kind == "list":
        args += ["-single_file", "1"]
    subprocess.run([*args, str(dest / MPD)], check=True, capture_output=True)
    p = Presentation(dest, kind, seconds)
    text = p.mpd.read_text()
    ext = ".webm" if kind == "webm" else ".m4s"
    if kind == "list":
        p.files = [dest / re.search(r"<BaseURL>([^<]+)</BaseURL>", text).group(1)]     # type: ignore[union-attr]
        p.ranges = [_span(m) for m in re.findall(r'(?:range|mediaRange)="(\d+-\d+)"', text)]
    else:
        chunks = sorted(dest.glob(f"chunk-stream0-*{ext}"))
        count = _named_count(text, len(chunks))
        for extra in chunks[count:]:      # written past the presentation's end: no client asks for them
            extra.unlink()
        p.files = [dest / f"init-stream0{ext}", *chunks[:count]]
        if kind == "time":
            p.files[1:] = _by_time(text, p.files[1:])
            text = text.replace("chunk-stream$RepresentationID$-$Number%05d$.m4s",
                                "chunk-stream$RepresentationID$-t$Time$.m4s")
    if protected:
        text = re.sub(r"(<AdaptationSet[^>]*>)", r'\1\n\t\t\t<ContentProtection schemeIdUri='
                      r'"urn:mpeg:dash:mp4protection:2011" value="cenc"/>\n\t\t\t<ContentProtection '
                      r'schemeIdUri="urn:uuid:edef8ba9-79d6-4ace-a3c8-27dcd51d21ed"/>', text, count=1)
    p.mpd.write_text(text)
    return p


def _span(text: str) -> tuple[int, int]:
    a, b = text.split("-")
    return int(a), int(b)


def _timeline(text: str) -> list[tuple[int, int]]:
    """(t, d) of each segment the MPD's SegmentTimeline lists."""
    out, t = [], 0
    for attrs in re.findall(r"<S ([^>]*)/>", text):
        a = dict(re.findall(r'(\w+)="(-?\d+)"', attrs))
        t = int(a.get("t", t))
        for _ in range(int(a.get("r", 0)) + 1):
            out.append((t, int(a["d"])))
            t += int(a["d"])
    return out


def _named_count(text: str, written: int) -> int:
    """How many media segments the MPD names."""
    if "<SegmentTimeline>" in text:
        return len(_timeline(text))
    total = re.search(r'mediaPresentationDuration="PT(?:(\d+)H)?(?:(\d+)M)?([\d.]+)S"', text)
    template = re.search(r'timescale="(\d+)" duration="(\d+)"', text)
    if total is None or template is None:
        return written
    seconds = int(total.group(1) or 0) * 3600 + int(total.group(2) or 0) * 60 + float(total.group(3))
    each = int(template.group(2)) / int(template.group(1))
    return min(written, math.ceil(seconds / each - 1e-9))


def _by_time(text: str, chunks: list[Path]) -> list[Path]:
    """The segments renamed by their start time, as a $Time$ template names them."""
    out = []
    for (t, _), chunk in zip(_timeline(text), chunks, strict=True):
        named = chunk.with_name(f"chunk-stream0-t{t}.m4s")
        chunk.rename(named)
        out.append(named)
    return out


# --------------------------------------------------------------------------------------------- live
def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class LiveServer:
    """A dynamic presentation on loopback (see the module's note); ``url`` is its manifest's address.

        async with LiveServer(make(long_wav, tmp / "live", seconds=1.0)) as live:
            live.url          # http://127.0.0.1:<port>/live/manifest.mpd
            live.log          # (path, status) of every request
    """

    def __init__(self, source: Presentation, *, timeline: bool = False, history: float = 3.0,
                 clock: Callable[[], float] = time.time) -> None:
        if source.kind != "number":
            raise ValueError("a live stream is cut from a 'number' presentation")
        self.source, self.timeline, self.clock = source, timeline, clock
        self.seconds = source.seconds
        self.start_at = clock() - history            # availabilityStartTime: a few segments exist already
        self.init = source.files[0].read_bytes()
        self.segments = [f.read_bytes() for f in source.files[1:]]
        self.log: list[tuple[str, int]] = []
        self.last: int | None = None                 # the stream's last segment, when it is to end
        self._runner: web.ServerRunner | None = None
        self.url = ""

    def edge(self, now: float | None = None) -> int:
        """The newest whole segment (from 0), -1 when none is yet."""
        elapsed = (self.clock() if now is None else now) - self.start_at
        return int(elapsed // self.seconds) - 1

    def manifest(self) -> str:
        ms = round(self.seconds * 1000)
        if self.timeline:
            edge = self.edge()
            first = max(0, edge - 9)
            entries = f'<S t="{first * ms}" d="{ms}" r="{edge - first}"/>' if edge >= 0 else ""
            template = (f'<SegmentTemplate timescale="1000" initialization="init.m4s" media="seg-t$Time$.m4s" '
                        f'startNumber="1"><SegmentTimeline>{entries}</SegmentTimeline></SegmentTemplate>')
        else:
            template = (f'<SegmentTemplate timescale="1000" duration="{ms}" initialization="init.m4s" '
                        f'media="seg-$Number$.m4s" startNumber="1"/>')
        return (f'<?xml version="1.0" encoding="utf-8"?>\n<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" '
                f'profiles="urn:mpeg:dash:profile:isoff-live:2011" type="dynamic" '
                f'availabilityStartTime="{_iso(self.start_at)}" publishTime="{_iso(self.clock())}" '
                f'minimumUpdatePeriod="PT{self.seconds}S" timeShiftBufferDepth="PT30S" '
                f'minBufferTime="PT2S"><Period id="0" start="PT0S"><AdaptationSet contentType="audio" '
                f'mimeType="audio/mp4" segmentAlignment="true"><Representation id="a" codecs="mp4a.40.2" '
                f'bandwidth="64000">{template}</Representation></AdaptationSet></Period></MPD>\n')

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        name = request.path.rsplit("/", 1)[-1]
        response = self._answer(name)
        self.log.append((request.path, response.status))
        return response

    def _answer(self, name: str) -> web.Response:
        if name == MPD:
            return web.Response(text=self.manifest(), content_type="application/dash+xml")
        if name == "init.m4s":
            return web.Response(body=self.init, content_type="audio/mp4")
        m = re.fullmatch(r"seg-(t?)(\d+)\.m4s", name)
        if m is None:
            return web.Response(status=404)
        k = int(m.group(2)) // round(self.seconds * 1000) if m.group(1) else int(m.group(2)) - 1
        if k < 0 or k > self.edge() or (self.last is not None and k > self.last):
            return web.Response(status=404)          # not yet available (or never)
        return web.Response(body=self.segments[k % len(self.segments)], content_type="audio/mp4")

    async def start(self, host: str = "127.0.0.1") -> LiveServer:
        self._runner = web.ServerRunner(web.Server(self._handle, access_log=None), handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{host}:{port}/live/{MPD}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> LiveServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

