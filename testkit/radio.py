"""A loopback internet radio station (SHOUTcast/Icecast) for the tests: an asyncio server that plays a schedule of
audio files in a loop, paced at its bitrate by a clock, with the ICY metadata interleave when the listener asks for
it (``Icy-MetaData: 1``) and a new ``StreamTitle`` at each track change.

    tracks = mp3_tracks(tmp, {"Song A": 11, "Song B": 12}, seconds=4)
    async with Station(tracks, name="Loopback FM") as station:
        station.url                     # http://127.0.0.1:PORT/stream
        station.listeners[0].audio      # the audio bytes one listener was sent (metadata left out)
        station.listeners[0].titles     # [(audio byte offset, StreamTitle), ...] as that listener was told

The answer is the SHOUTcast one (``ICY 200 OK``, which HTTP clients refuse) or, with ``icecast=True``, Icecast's
``HTTP/1.0 200 OK`` with the same ``icy-*`` headers; either way the body has no length and never ends. A station can
also misbehave: hang up after some audio (``hang_up_after``) or answer its head and then send nothing (``silent``).

Each listener hears the schedule from its first track (a real station's listeners share one broadcast; starting
each at the top makes what a recording holds, and when each title comes, known to the test). Pacing: the station
sends ``chunk_seconds`` of audio at a time, each when the clock says it is due at ``bitrate``
(after an optional ``burst`` sent at once, as real servers fill a new listener's buffer), so a recording of N
seconds holds about N seconds of audio, as from a real station.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from testkit import music

MAX_LISTENERS = 1_000     # listeners remembered (a test has a handful)


@dataclass(frozen=True)
class Track:
    title: str
    audio: bytes


@dataclass
class Listener:
    """What one connection was sent: its request head, the audio bytes (metadata blocks left out) and the titles
    with the audio byte offset at which each was told."""

    request: bytes = b""
    metadata: bool = False
    audio: bytearray = field(default_factory=bytearray)
    titles: list[tuple[int, str]] = field(default_factory=list)
    closed: bool = False


def metadata_block(title: str | None, url: str = "", encoding: str = "utf-8") -> bytes:
    """One metadata block: the length byte (16-byte units) and the text padded with NULs; an empty block (the
    single byte 0) when nothing changed."""
    if title is None:
        return b"\x00"
    text = f"StreamTitle='{title}';StreamUrl='{url}';".encode(encoding)[:255 * 16]
    units = -(-len(text) // 16)
    return bytes([units]) + text.ljust(units * 16, b"\x00")


def mp3_tracks(folder: Path, works: dict[str, int], seconds: float, bitrate: int = 64) -> list[Track]:
    """Constant-bitrate MP3s of testkit/music.py's works (title: seed), as a station's encoder would send them:
    bare MPEG frames, no ID3 tag and no Xing header."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for k, (title, seed) in enumerate(works.items()):
        wav = music.write_wav(folder / f"track{k}.wav", music.work(seed, seconds))
        mp3 = folder / f"track{k}.mp3"
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), "-c:a", "libmp3lame",
                        "-b:a", f"{bitrate}k", "-ar", "44100", "-write_xing", "0", "-id3v2_version", "0",
                        "-write_id3v1", "0", "-f", "mp3", str(mp3)], check=True, capture_output=True, timeout=120)
        out.append(Track(title, mp3.read_bytes()))
    return out


class Station:
    def __init__(self, tracks: list[Track], *, name: str = "Loopback FM", genre: str = "Test", site: str = "",
                 bitrate: int = 64, metaint: int = 8192, icecast: bool = False, mount: str = "/stream",
                 chunk_seconds: float = 0.05, burst: float = 0.0, hang_up_after: float | None = None,
                 silent: bool = False, title_encoding: str = "utf-8",
                 clock: Callable[[], float] = time.monotonic, host: str = "127.0.0.1",
                 keep_audio: bool = True) -> None:
        """host: the loopback address to listen on (stations on addresses of their own are hosts of their own to
        the crawler's politeness); keep_audio: remember what each listener was sent (a benchmark of many
        stations does not)."""
        if not tracks:
            raise ValueError("a station plays at least one track")
        self.tracks, self.name, self.genre, self.site = tracks, name, genre, site
        self.bitrate, self.metaint, self.icecast, self.mount = bitrate, metaint, icecast, mount
        self.rate = bitrate * 1000 / 8        # bytes per second
        self.chunk = max(1, int(self.rate * chunk_seconds))
        self.burst = int(self.rate * burst)
        self.hang_up_after = None if hang_up_after is None else int(self.rate * hang_up_after)
        self.silent, self.title_encoding, self.clock = silent, title_encoding, clock
        self.host, self.keep_audio = host, keep_audio
        self.listeners: list[Listener] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}{self.mount}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._stopping.set()         # every listener's loop ends within one chunk's time
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=5)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def head(self, metadata: bool) -> bytes:
        status = "HTTP/1.0 200 OK" if self.icecast else "ICY 200 OK"
        lines = [status]
        if not self.icecast:
            lines += ["icy-notice1:<BR>This stream requires a media player<BR>", "icy-notice2:Loopback<BR>"]
        lines += [f"icy-name:{self.name}", f"icy-genre:{self.genre}", f"icy-br:{self.bitrate}",
                  "icy-pub:0", "content-type:audio/mpeg"]
        if self.site:
            lines.append(f"icy-url:{self.site}")
        if metadata:
            lines.append(f"icy-metaint:{self.metaint}")
        if self.icecast:
            lines += ["Cache-Control: no-cache", "Server: Icecast 2.4.4"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        listener = Listener()
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            listener.request = request
            first = request.split(b"\r\n", 1)[0].split()
            path = first[1].decode("latin-1") if len(first) > 1 else ""
            if path.split("?")[0] != self.mount:
                writer.write(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            listener.metadata = any(line.lower().replace(b" ", b"") == b"icy-metadata:1"
                                    for line in request.split(b"\r\n"))
            if len(self.listeners) < MAX_LISTENERS:
                self.listeners.append(listener)
            writer.write(self.head(listener.metadata))
            await writer.drain()
            if self.silent:
                await self._stopping.wait()
                return
            await self._play(listener, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            listener.closed = True
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _play(self, listener: Listener, writer: asyncio.StreamWriter) -> None:
        """The schedule in a loop, paced at the bitrate; a title change is told in the first metadata block after
        its track begins."""
        start = self.clock()
        sent = 0                 # audio bytes sent
        track, pos = 0, 0        # where in the schedule
        told: str | None = None  # the title this listener was last told
        until_meta = self.metaint
        while (self.hang_up_after is None or sent < self.hang_up_after) and not self._stopping.is_set():
            due = start + max(0, sent - self.burst) / self.rate
            wait = due - self.clock()
            if wait > 0:
                await asyncio.sleep(wait)
            n = self.chunk
            if self.hang_up_after is not None:
                n = min(n, self.hang_up_after - sent)
            out = bytearray()
            while n > 0:
                audio = self.tracks[track].audio
                take = min(n, len(audio) - pos)
                if listener.metadata:
                    take = min(take, until_meta)
                piece = audio[pos:pos + take]
                out += piece
                if self.keep_audio:
                    listener.audio += piece
                sent += take
                pos += take
                n -= take
                if pos >= len(audio):
                    track, pos = (track + 1) % len(self.tracks), 0
                if listener.metadata:
                    until_meta -= take
                    if until_meta == 0:
                        # The track on air is the one the next audio byte belongs to.
                        title = self.tracks[track].title
                        new = title if title != told else None
                        if new is not None:
                            listener.titles.append((sent, new))
                            told = new
                        out += metadata_block(new, encoding=self.title_encoding)
                        until_meta = self.metaint
            writer.write(bytes(out))
            await writer.drain()


async def serve_many(count: int, folder: Path, *, bitrate: int, track_seconds: float) -> None:
    """``count`` stations, each on a loopback address of its own (127.1.x.y), playing two synthesised works in a
    loop; their addresses are printed one per line, then a blank line, and they play until the process is ended."""
    tracks = mp3_tracks(folder, {"Artist A - Work A": 501, "Artist B - Work B": 502}, seconds=track_seconds,
                        bitrate=bitrate)
    stations = [Station(tracks, name=f"Station {i}", bitrate=bitrate, chunk_seconds=0.25, keep_audio=False,
                        host=f"127.1.{i // 250}.{i % 250 + 1}") for i in range(count)]
    for station in stations:
        await station.start()
    print("\n".join(s.url for s in stations) + "\n", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description="loopback internet radio stations, for benchmarks")
    ap.add_argument("--stations", type=int, default=1)
    ap.add_argument("--bitrate", type=int, default=128)
    ap.add_argument("--track-seconds", type=float, default=30.0)
    ap.add_argument("--folder", type=Path, required=True)
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_many(args.stations, args.folder, bitrate=args.bitrate, track_seconds=args.track_seconds))


if __name__ == "__main__":
    main()
