"""Is this audio? Answers from a URL's extension, a Content-Type, or a response's first bytes."""

from __future__ import annotations

import re
from urllib.parse import unquote

AUDIO_EXTENSIONS = frozenset({
    "mp3", "mp2", "mpga", "wma", "wav", "m4a", "m4b", "flac", "ogg", "oga", "opus", "aac", "ape",
    "aif", "aiff", "amr", "mka", "wv", "ra", "weba", "mpc", "ac3",
})
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
