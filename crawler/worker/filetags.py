"""What a downloaded audio file says about itself: tags, duration, bitrate and codec, read with mutagen.

mutagen reads ID3, Vorbis comments (Ogg Vorbis/Opus, FLAC), MP4 atoms, ASF and WAVE from the file's headers,
seeking rather than reading the whole file; it blocks, so the worker calls it in a thread. A file mutagen does
not understand, or that lies about itself, yields nothing rather than an error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mutagen

from crawler.resolvers.pagemeta import normalise

log = logging.getLogger(__name__)

# Tag keys per field, across the formats' own vocabularies (mutagen's "easy" ID3 and MP4, Vorbis, ASF).
_KEYS = {
    "title": ("title", "Title", "TITLE", "\xa9nam"),
    "artist": ("artist", "Author", "ARTIST", "\xa9ART", "albumartist", "WM/AlbumArtist"),
    "album": ("album", "WM/AlbumTitle", "ALBUM", "\xa9alb"),
}
# mutagen's class name -> the codec name the catalogue records (MP4 says its own codec).
_CODECS = {"MP3": "mp3", "EasyMP3": "mp3", "OggVorbis": "vorbis", "OggOpus": "opus", "OggFLAC": "flac",
           "OggSpeex": "speex", "FLAC": "flac", "ASF": "wma", "WAVE": "pcm", "AAC": "aac", "AIFF": "pcm",
           "MonkeysAudio": "ape", "WavPack": "wavpack", "TrueAudio": "tta", "Musepack": "musepack"}
_MP4_CODECS = {"mp4a.40.2": "aac", "mp4a.40.5": "aac", "mp4a.40.29": "aac", "mp4a": "aac", "alac": "alac",
               "ac-3": "ac3", "ec-3": "eac3", "mp4a.6b": "mp3", "mp4a.69": "mp3"}


def _first_text(tags: Any, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        try:
            value = tags.get(key) if hasattr(tags, "get") else None
        except (KeyError, ValueError, TypeError):
            value = None
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None and not isinstance(value, str):
            value = str(value)   # ASF attributes, MP4 freeform values
        if value and value.strip():
            return value
    return None


def read_file_tags(path: Path) -> dict[str, Any]:
    """title, artist, album, duration (s), bitrate (kbit/s) and codec of an audio file; {} when unreadable."""
    try:
        audio = mutagen.File(path, easy=True)
    except Exception as exc:   # mutagen raises many types on hostile input; none of them is ours to crash on
        log.debug("tags of %s not read: %s", path, exc)
        return {}
    if audio is None:
        return {}
    raw: dict[str, Any] = {}
    tags = audio.tags
    if tags is not None:
        for field_name, keys in _KEYS.items():
            raw[field_name] = _first_text(tags, keys)
    info = getattr(audio, "info", None)
    length = getattr(info, "length", None)
    if isinstance(length, (int, float)) and length > 0:
        raw["duration"] = round(float(length), 3)
    bitrate = getattr(info, "bitrate", None)
    if isinstance(bitrate, int) and bitrate > 0:
        raw["bitrate"] = round(bitrate / 1000)
    out = normalise(raw)
    kind = type(audio).__name__
    codec = _CODECS.get(kind)
    if kind in ("MP4", "EasyMP4"):
        codec = _MP4_CODECS.get(str(getattr(info, "codec", "")).lower(), "aac")
    if codec:
        out["codec"] = codec
    return out
