"""What audio looks like on the web: by a URL's extension, by media type, by a file's first bytes and tags, and
as playlists.

One table of each: the audio extensions, the media type each maps to a stored file's extension, the playlist
extensions and types. A URL naming audio is found by ``is_audio_url``; a response's media type is read by
``media_type``; the bytes decide with ``sniff_audio`` and ``is_media``; ``read_tags`` takes title, artist, album
and duration from a file's leading tag; ``looks_like_playlist``, ``parse_m3u`` and ``parse_pls`` read playlists.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from urllib.parse import unquote

from crawler.web.tags import Decline, read_flac_meta, read_id3v2

# Extensions that name audio: a link ending in one is catalogued as audio.
AUDIO_EXTENSIONS = frozenset({
    "mp3", "mp2", "mpga", "wma", "wav", "m4a", "m4b", "flac", "ogg", "oga", "opus", "aac", "ape",
    "aif", "aiff", "amr", "mka", "wv", "ra", "weba", "mpc", "ac3", "au", "caf",
})
# Extensions a downloaded file may keep although a link with them is not taken for audio: containers that carry
# video as often as audio (the bytes decided before the file was kept) and MIDI scores.
STORED_EXTENSIONS = AUDIO_EXTENSIONS | {"mp4", "webm", "3gp", "mid", "midi"}
# The extension a stored file takes from its media type when its address names none.
EXTENSION_BY_TYPE = {
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/mpeg3": "mp3", "audio/x-mpeg": "mp3",
    "audio/mp4": "m4a", "audio/x-m4a": "m4a", "audio/m4a": "m4a", "audio/aac": "aac",
    "audio/aacp": "aac", "audio/x-aac": "aac", "audio/wav": "wav", "audio/x-wav": "wav",
    "audio/wave": "wav", "audio/vnd.wave": "wav",
    "audio/x-ms-wma": "wma", "audio/flac": "flac", "audio/x-flac": "flac", "audio/ogg": "ogg",
    "application/ogg": "ogg", "audio/opus": "opus", "audio/ape": "ape", "audio/x-ape": "ape",
    "audio/amr": "amr", "audio/aiff": "aiff", "audio/x-aiff": "aiff", "audio/midi": "mid",
    "audio/x-matroska": "mka", "audio/webm": "weba", "video/webm": "webm", "video/mp4": "mp4",
    "audio/3gpp": "3gp", "audio/basic": "au", "audio/x-caf": "caf",
}
PLAYLIST_EXTENSIONS = frozenset({"m3u", "m3u8", "pls"})
PLAYLIST_TYPES = frozenset({
    "audio/x-mpegurl", "audio/mpegurl", "application/x-mpegurl", "application/vnd.apple.mpegurl",
    "audio/x-scpls", "application/pls+xml",
})
# Containers that carry video as often as audio: the bytes decide.
_MAYBE_AUDIO_TYPES = frozenset({
    "video/x-ms-asf", "application/vnd.ms-asf", "video/ogg", "video/mp4", "application/mp4",
})

_ASF_HEADER = bytes.fromhex("3026b2758e66cf11a6d900aa0062ce6c")
_ASF_VIDEO_MEDIA = bytes.fromhex("c0ef19bc4d5bcf11a8fd00805f5c442b")
_AUDIO_BRANDS = (b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B ")
_OGG_AUDIO_CODECS = (b"\x01vorbis", b"OpusHead", b"\x7fFLAC", b"Speex   ")
_OGG_VIDEO_CODECS = (b"\x80theora", b"\x80kate", b"fishead")
_HANDLER = re.compile(rb"hdlr.{8}(soun|vide)", re.DOTALL)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_C0_OR_SPACE = "".join(map(chr, range(33)))   # what urlsplit strips from the front


def url_extension(url: str) -> str:
    """The lower-case extension of the URL's path ('' if none); query and fragment do not count.

    The path's last segment, percent-decoded, after its last dot (not a leading one). The same answer as
    urlsplit() and posixpath.basename() give, found with str methods: it runs for every reference on every page.
    """
    if url[:1] <= " ":
        url = url.lstrip(_C0_OR_SPACE)
    if "\t" in url or "\n" in url or "\r" in url:
        url = url.replace("\t", "").replace("\n", "").replace("\r", "")
    end = url.find("?")
    if end < 0:
        end = len(url)
    fragment = url.find("#", 0, end)
    if fragment >= 0:
        end = fragment
    if url.startswith("http", 0, end) and url[4:5] == ":" or url.startswith("https:", 0, end):
        start = url.find(":") + 1      # the web's schemes, most URLs: no regex needed to know them for one
    else:
        start = 0
        colon = url.find(":", 0, end)
        if colon > 0 and _SCHEME.fullmatch(url, 0, colon) is not None:
            start = colon + 1
    if url.startswith("//", start, end):
        start = url.find("/", start + 2, end)
        if start < 0:
            return ""       # scheme://host with no path
    slash = url.rfind("/", start, end)
    name = url[slash + 1 if slash >= 0 else start:end]
    if "%" in name:
        name = unquote(name).rpartition("/")[2]
    stem, dot, ext = name.rpartition(".")
    return ext.lower() if dot and stem else ""


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type value, lower case, without its parameters ("text/html; charset=x")."""
    return (content_type or "").split(";", 1)[0].strip().lower()


def is_audio_url(url: str) -> bool:
    return url_extension(url) in AUDIO_EXTENSIONS


def is_playlist_url(url: str) -> bool:
    return url_extension(url) in PLAYLIST_EXTENSIONS


def is_audio_type(content_type: str) -> bool:
    """True for a media type that names audio (playlists excluded: they list audio, they are not audio)."""
    ct = content_type.lower()
    if ct in PLAYLIST_TYPES:
        return False
    return ct.startswith("audio/") or ct == "application/ogg"


def maybe_audio_type(content_type: str) -> bool:
    return content_type.lower() in _MAYBE_AUDIO_TYPES


def sniff_audio(head: bytes) -> str | None:
    """The audio format the first bytes announce ('mp3', 'flac', ...) or None.

    Containers that also carry video (ASF, MP4, Ogg) count as audio only when what we can see of them
    says so, so a WMV or MP4 film is not catalogued as a song.
    """
    if len(head) < 4:
        return None
    if head[:3] == b"ID3" and len(head) >= 10 and head[3] in (2, 3, 4):
        return "mp3"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"MAC ":
        return "ape"
    if head[:6] == b"#!AMR\n":
        return "amr"
    if head[:4] == b"OggS":
        first_page = head[:4096]
        if any(c in first_page for c in _OGG_VIDEO_CODECS):
            return None
        return "ogg" if any(c in first_page for c in _OGG_AUDIO_CODECS) else None
    if head[:16] == _ASF_HEADER:
        return None if _ASF_VIDEO_MEDIA in head else "wma"
    if head[4:8] == b"ftyp":
        return _sniff_mp4(head)
    return _sniff_frame_sync(head)


# Enough of a file's start for sniff_audio and is_media to decide.
HEAD_BYTES = 4096
_MATROSKA = b"\x1a\x45\xdf\xa3"
_MP4_BOXES = (b"ftyp", b"styp", b"moof", b"sidx")   # a file, or a fragment of one (CMAF / fMP4 segments)


def is_media(head: bytes) -> bool:
    """Whether a file that starts with head can be what a download of audio should bring.

    Audio that sniff_audio recognises, and the containers that may carry it but whose first bytes cannot
    always tell (MP4 with its index at the end, fragmented MP4 segments, Ogg, ASF, Matroska/WebM, an MPEG
    transport stream: HLS and DASH segments are the last two). An HTML error page, a JSON answer or an
    executable is none of these.
    """
    if sniff_audio(head) is not None:
        return True
    if head[4:8] in _MP4_BOXES or head[:4] in (b"OggS", _MATROSKA) or head[:16] == _ASF_HEADER:
        return True
    return len(head) > 188 and head[0] == 0x47 and head[188] == 0x47   # TS packets: a sync byte every 188


def _sniff_mp4(head: bytes) -> str | None:
    size = int.from_bytes(head[:4], "big")
    brands = head[8:min(max(size, 16), 64)]
    if head[8:12] in _AUDIO_BRANDS or any(brands[i:i + 4] in _AUDIO_BRANDS for i in range(8, len(brands), 4)):
        return "m4a"
    # A generic brand (isom, mp42): only the track handlers tell audio from video, when moov is up front.
    handlers = {m.group(1) for m in _HANDLER.finditer(head)}
    return "m4a" if handlers == {b"soun"} else None


def _sniff_frame_sync(head: bytes) -> str | None:
    """An MPEG audio frame or an ADTS (AAC) header at offset 0, with its reserved values ruled out."""
    b0, b1, b2 = head[0], head[1], head[2]
    if b0 != 0xFF or (b1 & 0xE0) != 0xE0:
        return None
    version = (b1 >> 3) & 0x3
    layer = (b1 >> 1) & 0x3
    if layer == 0:
        # ADTS: MPEG-2/4 AAC; sampling index 13..15 is reserved.
        return "aac" if (b1 & 0xF6) == 0xF0 and ((b2 >> 2) & 0xF) < 13 else None
    bitrate_index = b2 >> 4
    sample_index = (b2 >> 2) & 0x3
    if version == 1 or bitrate_index in (0, 15) or sample_index == 3:
        return None
    return "mp3" if layer == 1 else "mp2"


# -- playlists (.m3u, .m3u8, .pls): the entries they list, with what they say about each ------------------

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


def is_hls(text: str) -> bool:
    """An HLS stream: a media playlist, or a master playlist naming its renditions (RFC 8216), not a song list."""
    return is_hls_media(text) or "#EXT-X-STREAM-INF" in text


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


# -- tags at the start of an audio file: ID3v2 text frames and FLAC Vorbis comments -------------------------
# Only the first bytes of a response are at hand: tags.py's readers, in their lenient mode, take what they can
# from a truncated buffer and stop quietly at the first thing that does not add up.

_ID3_FIELDS = {"TIT2": "title", "TPE1": "artist", "TALB": "album", "TLEN": "length_ms"}
_VORBIS_FIELDS = {b"title": "title", b"artist": "artist", b"album": "album"}


def read_tags(head: bytes) -> dict[str, str | float]:
    """title/artist/album (str) and duration (seconds) found in the file's leading tag, if any."""
    found: dict[str, str | float] = {}
    try:
        if head[:3] == b"ID3":
            frames, _ = read_id3v2(head, _ID3_FIELDS, exact=False)
            found = {_ID3_FIELDS[key]: value.strip() for key, value in frames.items()}
        elif head[:4] == b"fLaC":
            rate, samples, comments, _ = read_flac_meta(head, _VORBIS_FIELDS, exact=False)
            found = {_VORBIS_FIELDS[key]: value.strip() for key, value in (comments or {}).items()}
            if rate and samples:
                found["duration"] = samples / rate
        else:
            return {}
    except (IndexError, ValueError, struct.error, Decline):
        return {}
    out: dict[str, str | float] = {k: v for k, v in found.items() if k != "length_ms" and v}
    length = found.get("length_ms")
    if isinstance(length, str) and re.fullmatch(r"\s*[0-9]{1,10}\s*", length) and int(length) > 0:
        out["duration"] = int(length) / 1000
    elif isinstance(found.get("duration"), float):
        out["duration"] = found["duration"]
    return out
