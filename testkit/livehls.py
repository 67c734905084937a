"""A live HLS stream on loopback whose window moves with the clock, as a broadcaster's packager serves one.

A long audio file is cut by ffmpeg into segments of about N seconds (``cut``: MPEG-TS, or fragmented MP4 with an
initialisation section). The server plays them in a loop from the moment it starts: at any time its media playlist
lists the last ``window`` segments that are complete, with EXT-X-MEDIA-SEQUENCE advancing as new ones appear.

    segments = cut(wav, tmp / "cut", seconds=2)
    async with LiveHls(segments, window=3, key=KEY, master=True) as live:
        live.stream                 # http://127.0.0.1:port/live/index.m3u8 (the master, or the media playlist)
        live.plain(seq)             # the plain bytes of segment ``seq``: what a recording must hold
        live.served                 # sequence numbers whose segment was sent, in order of request
        live.requests               # every path asked for

Time is ``clock``'s (``time.monotonic`` unless given): a test that drives a recorder by a fake clock gives the
same clock here, and the stream moves exactly as far as the recorder's sleeps advance it.

At the start (elapsed 0) the playlist already lists ``window`` segments, sequence 0 to window-1, as a stream that
was on air before anyone listened; segment ``window + i`` appears once the durations of segments window..window+i
have passed. A segment stays fetchable for ``window`` segments after it left the playlist (RFC 8216 6.2.2 asks
servers to keep it that long), then answers 404.

Options for the tests of what real streams do wrong:
    key            AES-128 encryption, the IV the media sequence number (RFC 8216 5.2); the key at /live/key.bin
    master         /live/index.m3u8 is a master playlist naming the media playlist (and a video variant to skip)
    end_at         seconds after the start at which the event ends: the playlist stops growing and gains
                   EXT-X-ENDLIST
    frozen_at      seconds after the start at which the playlist stops moving (no ENDLIST): a stalled packager
    playlist       a function of the elapsed time returning the media playlist's text instead (hostile tests);
                   every segment it names is then served
    target         the EXT-X-TARGETDURATION announced (by default the longest segment's, rounded up)
    pace           audio made per second of the clock (0.4: a segment of 2 s appears every 5 s, a packager
                   falling behind)
    pages          other paths served as given: {"/page.html": (body, content type)}
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from testkit.hls import encrypt
from testkit.loopback import LoopbackSite

MPEGURL = "application/vnd.apple.mpegurl"
_SEGMENT = re.compile(r"^/live/seg(\d{1,12})\.(ts|m4s)$")


@dataclass(frozen=True)
class Cut:
    """An audio file cut into segments: their bytes and EXTINF durations in order, and the init section of
    fragmented MP4 (None for MPEG-TS)."""

    segments: tuple[bytes, ...]
    durations: tuple[float, ...]
    init: bytes | None = None

    @property
    def ext(self) -> str:
        return "m4s" if self.init is not None else "ts"


def cut(source: Path, out_dir: Path, seconds: float = 2.0, fmt: str = "ts", bitrate: str = "64k") -> Cut:
    """``source`` encoded as AAC and cut by ffmpeg's HLS muxer into segments of about ``seconds`` each, in
    ``fmt`` "ts" (MPEG-TS) or "fmp4" (fragmented MP4 with an init section). The durations are ffmpeg's EXTINF
    values: AAC frames do not divide every N seconds evenly."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ext = "m4s" if fmt == "fmp4" else "ts"
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(source), "-vn", "-c:a", "aac", "-b:a", bitrate,
           "-f", "hls", "-hls_time", str(seconds), "-hls_list_size", "0", "-hls_playlist_type", "vod",
           "-hls_segment_filename", str(out_dir / f"seg%05d.{ext}")]
    if fmt == "fmp4":
        cmd += ["-hls_segment_type", "fmp4", "-hls_fmp4_init_filename", "init.mp4"]
    cmd.append(str(out_dir / "cut.m3u8"))
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    segments: list[bytes] = []
    durations: list[float] = []
    duration = 0.0
    for line in (out_dir / "cut.m3u8").read_text().splitlines():
        if line.startswith("#EXTINF:"):
            duration = float(line[8:].split(",", 1)[0])
        elif line and not line.startswith("#"):
            segments.append((out_dir / line).read_bytes())
            durations.append(duration)
    init = (out_dir / "init.mp4").read_bytes() if fmt == "fmp4" else None
    return Cut(tuple(segments), tuple(durations), init)


class LiveHls(LoopbackSite):
    """The live stream (see the module's docstring). ``start`` fixes the time the stream's clock counts from."""

    def __init__(self, source: Cut, *, window: int = 3, clock: Callable[[], float] = time.monotonic,
                 key: bytes | None = None, master: bool = False, end_at: float | None = None,
                 frozen_at: float | None = None, playlist: Callable[[float], str] | None = None,
                 pages: Mapping[str, tuple[bytes, str]] | None = None, target: int | None = None,
                 pace: float = 1.0) -> None:
        if not source.segments or window < 1:
            raise ValueError("a live stream needs segments and a window of at least one")
        self.source, self.window, self.clock = source, window, clock
        self.key, self.master, self.end_at, self.frozen_at = key, master, end_at, frozen_at
        self.playlist_text = playlist
        self.pages = dict(pages or {})
        self.target = target if target is not None else max(1, math.ceil(max(source.durations)))
        self.started = 0.0
        # When each new segment is complete, over one pass through the source from the first to appear
        # (sequence ``window``), counted from the start of the pass.
        first = window % len(source.durations)
        durations = source.durations[first:] + source.durations[:first]
        self._ends = list(itertools.accumulate(d / pace for d in durations))
        self.served: list[int] = []
        self.requests: list[str] = []     # every path asked for, in order
        self.playlist_requests = 0

    async def start(self) -> LiveHls:
        await super().start()
        self.started = self.clock()
        return self

    @property
    def stream(self) -> str:
        """The stream's address: the master playlist, or the media playlist when there is no master."""
        return f"{self.url}/live/index.m3u8" if self.master else f"{self.url}/live/audio.m3u8"

    # -- the stream's timeline ----------------------------------------------------------------------------
    def plain(self, seq: int) -> bytes:
        return self.source.segments[seq % len(self.source.segments)]

    def duration(self, seq: int) -> float:
        return self.source.durations[seq % len(self.source.durations)]

    def body(self, seq: int) -> bytes:
        """Segment ``seq`` as sent: encrypted when the stream has a key."""
        if self.key is None:
            return self.plain(seq)
        return encrypt(self.plain(seq), self.key, seq.to_bytes(16, "big"))

    def available(self, elapsed: float) -> int:
        """How many segments exist ``elapsed`` seconds after the start (the next sequence number to appear)."""
        for limit in (self.end_at, self.frozen_at):
            if limit is not None:
                elapsed = min(elapsed, limit)
        if elapsed <= 0:
            return self.window
        passes, into = divmod(elapsed, self._ends[-1])
        return self.window + int(passes) * len(self._ends) + bisect.bisect_right(self._ends, into + 1e-9)

    def listed(self, elapsed: float) -> range:
        """The sequence numbers the media playlist lists at ``elapsed``."""
        n = self.available(elapsed)
        return range(max(0, n - self.window), n)

    def elapsed(self) -> float:
        return self.clock() - self.started

    def media_playlist(self, elapsed: float) -> str:
        listed = self.listed(elapsed)
        lines = ["#EXTM3U", "#EXT-X-VERSION:7" if self.source.init is not None else "#EXT-X-VERSION:3",
                 f"#EXT-X-TARGETDURATION:{self.target}", f"#EXT-X-MEDIA-SEQUENCE:{listed.start}"]
        if self.source.init is not None:
            lines.append('#EXT-X-MAP:URI="init.mp4"')
        if self.key is not None:
            lines.append('#EXT-X-KEY:METHOD=AES-128,URI="key.bin"')
        for seq in listed:
            lines += [f"#EXTINF:{self.duration(seq):.6f},", f"seg{seq}.{self.source.ext}"]
        if self.end_at is not None and elapsed >= self.end_at:
            lines.append("#EXT-X-ENDLIST")
        return "\n".join(lines) + "\n"

    def master_playlist(self) -> str:
        return "\n".join([
            "#EXTM3U",
            '#EXT-X-STREAM-INF:BANDWIDTH=2000000,CODECS="avc1.4d401f,mp4a.40.2",RESOLUTION=1280x720',
            "video.m3u8",
            '#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS="mp4a.40.2"',
            "audio.m3u8"]) + "\n"

    # -- serving ------------------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.rel_url.path
        self.requests.append(path)
        if path in self.pages:
            body, content_type = self.pages[path]
            return web.Response(body=body, content_type=content_type)
        if path == "/live/index.m3u8" and self.master:
            return web.Response(text=self.master_playlist(), content_type=MPEGURL)
        if path == "/live/audio.m3u8":
            self.playlist_requests += 1
            elapsed = self.elapsed()
            text = self.playlist_text(elapsed) if self.playlist_text else self.media_playlist(elapsed)
            return web.Response(text=text, content_type=MPEGURL, headers={"Cache-Control": "no-cache"})
        if path == "/live/key.bin" and self.key is not None:
            return web.Response(body=self.key, content_type="application/octet-stream")
        if path == "/live/init.mp4" and self.source.init is not None:
            return web.Response(body=self.source.init, content_type="audio/mp4")
        m = _SEGMENT.match(path)
        if m:
            seq = int(m.group(1))
            n = self.available(self.elapsed())
            # A playlist of the test's own names what it likes: every segment it names is there.
            if self.playlist_text is not None or n - 2 * self.window <= seq < n:
                self.served.append(seq)
                return web.Response(body=self.body(seq), content_type="video/mp2t")
        return web.Response(status=404, text="not found")
