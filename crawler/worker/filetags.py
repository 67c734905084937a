"""What a downloaded audio file says about itself: tags, duration, bitrate and codec, read with mutagen.

mutagen reads ID3, Vorbis comments (Ogg Vorbis/Opus, FLAC), MP4 atoms, ASF and WAVE from the file's headers,
seeking rather than reading the whole file; it blocks, so the worker calls it in a thread. A file mutagen does
not understand, or that lies about itself, yields nothing rather than an error. An MP3 still in memory goes to
mp3tags.read_mp3 first, a FLAC, Ogg Vorbis, WAVE or ADTS AAC file to fasttags' readers: the same answer for a
fraction of the CPU, or None and mutagen reads it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mutagen
from mutagen.aac import AAC
from mutagen.aiff import AIFF
from mutagen.asf import ASF
from mutagen.easymp4 import EasyMP4
from mutagen.flac import FLAC
from mutagen.monkeysaudio import MonkeysAudio
from mutagen.mp3 import EasyMP3
from mutagen.oggflac import OggFLAC
from mutagen.oggopus import OggOpus
from mutagen.oggvorbis import OggVorbis
from mutagen.wave import WAVE

from crawler.resolvers.pagemeta import normalise
from crawler.web.media import HEAD_BYTES, sniff_audio
from crawler.worker.fasttags import read_aac, read_flac, read_ogg_vorbis, read_wave
from crawler.worker.mp3tags import read_mp3

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


# The formats a stored file's extension names (crawler/worker/audiostore.py picks it from the address or the
# media type). Asking those first spares scoring all of mutagen's two dozen formats on every file, which cost as
# much as reading the tags; a file that is none of them is asked about every format after all.
_BY_EXTENSION: dict[str, list[Any]] = {
    ".mp3": [EasyMP3], ".m4a": [EasyMP4], ".m4b": [EasyMP4], ".mp4": [EasyMP4], ".aac": [AAC],
    ".flac": [FLAC], ".ogg": [OggVorbis, OggOpus, OggFLAC], ".oga": [OggVorbis, OggOpus, OggFLAC],
    ".opus": [OggOpus], ".wav": [WAVE], ".wma": [ASF], ".ape": [MonkeysAudio], ".aif": [AIFF], ".aiff": [AIFF],
}

# In-memory readers that give mutagen's own answer or decline (None), by the extension that picks the hint list,
# with the mutagen class whose answer they give (its codec). For .ogg/.oga, OggVorbis is asked first: the reader
# declines anything mutagen would not read as Vorbis.
_FAST: dict[str, tuple[Callable[[bytes], dict[str, Any] | None], str]] = {
    ".mp3": (read_mp3, "EasyMP3"), ".flac": (read_flac, "FLAC"), ".ogg": (read_ogg_vorbis, "OggVorbis"),
    ".oga": (read_ogg_vorbis, "OggVorbis"), ".wav": (read_wave, "WAVE"), ".aac": (read_aac, "AAC"),
}


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


def read_file_tags(path: Path | bytes, ext: str = "", *, fast: bool = True) -> dict[str, Any]:
    """title, artist, album, duration (s), bitrate (kbit/s) and codec of an audio file; {} when unreadable.

    path is the stored file, or the whole file's bytes when they are still in memory (ext then gives the hint
    the file's name would). fast=False always asks mutagen (the fast path's tests compare against it)."""
    source: Path | io.BytesIO = io.BytesIO(path) if isinstance(path, bytes) else path
    try:
        kind = ext or (path.suffix.lower() if isinstance(path, Path) else "")
        hint = _BY_EXTENSION.get(kind)
        if hint is None and isinstance(path, bytes):
            # No extension to go by (a stream's address): the first bytes name the format just as well.
            kind = f".{sniff_audio(path[:HEAD_BYTES])}"
            hint = _BY_EXTENSION.get(kind)
        if kind == ".aac" and isinstance(source, io.BytesIO):
            # mutagen's AAC knows an ADTS stream by the file's name alone: named as the stored file is, the bytes
            # in memory give the stored file's answer.
            source.name = "memory.aac"
        if fast and hint is not None and kind in _FAST and isinstance(path, bytes):
            # Most downloads are MP3s, FLAC, Ogg, WAVE or AAC: read them without mutagen's file objects and
            # per-frame objects when that gives mutagen's own answer (the readers decline everything else).
            reader, mutagen_kind = _FAST[kind]
            fast_raw = reader(path)
            if fast_raw is not None:
                return {**normalise(fast_raw), "codec": _CODECS[mutagen_kind]}
        audio = mutagen.File(source, easy=True, options=hint) if hint else None
        if audio is None:
            if isinstance(source, io.BytesIO):
                source.seek(0)
            audio = mutagen.File(source, easy=True)
    except Exception as exc:   # mutagen raises many types on hostile input; none of them is ours to crash on
        log.debug("tags of %s not read: %s", "a file in memory" if isinstance(path, bytes) else path, exc)
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
    class_name = type(audio).__name__
    codec = _CODECS.get(class_name)
    if class_name in ("MP4", "EasyMP4"):
        codec = _MP4_CODECS.get(str(getattr(info, "codec", "")).lower(), "aac")
    if codec:
        out["codec"] = codec
    return out
