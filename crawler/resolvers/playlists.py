"""Playlist files (.m3u, .m3u8, .pls): the entries they list, with what they say about each."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLS_LINE = re.compile(r"^(File|Title|Length)(\d+)\s*=\s*(.*)$", re.IGNORECASE)
# Cap on entries read from one playlist: a hostile file must not turn into millions of items.
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class PlaylistEntry:
    target: str                 # as written: absolute or relative to the playlist
    title: str | None = None
    artist: str | None = None
    duration: float | None = None


def looks_like_playlist(text: str) -> str | None:
    """'m3u' or 'pls' when the text starts like one, else None."""
    head = text.lstrip("\ufeff \t\r\n")[:64].lower()
    if head.startswith("#extm3u"):
        return "m3u"
    if head.startswith("[playlist]"):
        return "pls"
    return None


def is_hls_media(text: str) -> bool:
    """An HLS media playlist lists the segments of one stream, not songs."""
    return "#EXT-X-TARGETDURATION" in text or "#EXT-X-MEDIA-SEQUENCE" in text


def parse_m3u(text: str) -> list[PlaylistEntry]:
    entries: list[PlaylistEntry] = []
    pending: tuple[float | None, str | None, str | None] = (None, None, None)
    for raw in text.splitlines():
        line = raw.strip().lstrip("\ufeff")
        if not line:
            continue
        if line.startswith("#"):
            if line[:8].upper() == "#EXTINF:":
                pending = _extinf(line[8:])
            continue
        duration, artist, title = pending
        entries.append(PlaylistEntry(line, title=title, artist=artist, duration=duration))
        pending = (None, None, None)
        if len(entries) >= MAX_ENTRIES:
            break
    return entries


def _extinf(rest: str) -> tuple[float | None, str | None, str | None]:
    length, _, name = rest.partition(",")
    # Attributes such as tvg-id="..." may follow the length; the length is the first token.
    token = length.strip().split(" ", 1)[0]
    try:
        seconds = float(token)
    except ValueError:
        seconds = -1.0
    duration = seconds if seconds > 0 else None
    artist, title = _artist_title(name)
    return duration, artist, title


def _artist_title(name: str) -> tuple[str | None, str | None]:
    """Players write "Artist - Title" in both m3u and pls; a name without the separator is a title."""
    name = name.strip()
    if not name:
        return None, None
    artist, sep, title = name.partition(" - ")
    if sep and artist.strip() and title.strip():
        return artist.strip(), title.strip()
    return None, name


def parse_pls(text: str) -> list[PlaylistEntry]:
    files: dict[int, str] = {}
    titles: dict[int, str] = {}
    lengths: dict[int, float] = {}
    for raw in text.splitlines():
        m = _PLS_LINE.match(raw.strip())
        if not m:
            continue
        key, index, value = m.group(1).lower(), int(m.group(2)), m.group(3).strip()
        if key == "file" and value:
            if len(files) < MAX_ENTRIES:
                files[index] = value
        elif key == "title" and value:
            titles[index] = value
        elif key == "length":
            try:
                seconds = float(value)
            except ValueError:
                continue
            if seconds > 0:
                lengths[index] = seconds
    out = []
    for i in sorted(files):
        artist, title = _artist_title(titles.get(i, ""))
        out.append(PlaylistEntry(files[i], title=title, artist=artist, duration=lengths.get(i)))
    return out
