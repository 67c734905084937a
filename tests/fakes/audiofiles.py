"""Small audio files with real containers, tagged with mutagen the way taggers write them.

The streams are noise, but every header a tag reader looks at is real: MPEG frame headers, the Ogg Vorbis
identification header, FLAC STREAMINFO, and an MP4 movie box with a sound track, its duration and the
AAC decoder configuration that carries the average bitrate.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import mutagen.asf
import mutagen.flac
import mutagen.id3
import mutagen.mp4
import mutagen.oggvorbis

from testkit import sitegen


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full(kind: bytes, payload: bytes, version: int = 0) -> bytes:
    return _box(kind, bytes([version, 0, 0, 0]) + payload)


def _descriptor(tag: int, payload: bytes) -> bytes:
    return bytes([tag, len(payload)]) + payload


def m4a_body(seconds: int, kbps: int) -> bytes:
    """An AAC-LC .m4a: ftyp, a moov whose one track is sound with the given length and average bitrate."""
    timescale = 44100
    duration = seconds * timescale
    mvhd = _full(b"mvhd", struct.pack(">IIII", 0, 0, timescale, duration) + b"\x00\x01\x00\x00\x01\x00"
                 + bytes(10) + bytes(36) + bytes(24) + struct.pack(">I", 2))
    mdhd = _full(b"mdhd", struct.pack(">IIIIHH", 0, 0, timescale, duration, 0x55C4, 0))
    hdlr = _full(b"hdlr", struct.pack(">I", 0) + b"soun" + bytes(12) + b"sound\x00")
    config = _descriptor(0x05, b"\x12\x10")   # AudioSpecificConfig: AAC LC, 44.1 kHz, 2 channels
    decoder = _descriptor(0x04, bytes([0x40, 0x15]) + b"\x00\x00\x00" + struct.pack(">II", kbps * 1000,
                                                                                    kbps * 1000) + config)
    es = _descriptor(0x03, struct.pack(">HB", 1, 0) + decoder + _descriptor(0x06, b"\x02"))
    esds = _full(b"esds", es)
    mp4a = _box(b"mp4a", bytes(6) + struct.pack(">H", 1) + bytes(8) + struct.pack(">HHHH", 2, 16, 0, 0)
                + struct.pack(">I", timescale << 16) + esds)
    stsd = _full(b"stsd", struct.pack(">I", 1) + mp4a)
    stbl = _box(b"stbl", stsd + _full(b"stts", bytes(4)) + _full(b"stsc", bytes(4))
                + _full(b"stsz", bytes(8)) + _full(b"stco", bytes(4)))
    minf = _box(b"minf", _full(b"smhd", bytes(4)) + stbl)
    mdia = _box(b"mdia", mdhd + hdlr + minf)
    tkhd = _full(b"tkhd", struct.pack(">IIIII", 0, 0, 1, 0, duration) + bytes(60), version=0)
    moov = _box(b"moov", mvhd + _box(b"trak", tkhd + mdia))
    ftyp = _box(b"ftyp", b"M4A " + struct.pack(">I", 0) + b"M4A mp42isom")
    return ftyp + moov + _box(b"mdat", random.Random(seconds).randbytes(2048))


def write(path: Path, kind: str, title: str, artist: str, album: str, *, size: int = 60_000) -> Path:
    """An audio file of kind mp3/ogg/flac/m4a/wma at path, its tags written by mutagen."""
    rng = random.Random(f"{title}/{kind}")
    if kind == "mp3":
        # MPEG-1 Layer III, 128 kbit/s: ~3.75 s for 60 kB.
        frames = b"".join(b"\xff\xfb\x90\x64" + rng.randbytes(413) for _ in range(size // 417))
        path.write_bytes(frames)
        tags = mutagen.id3.ID3()
        tags.add(mutagen.id3.TIT2(encoding=3, text=title))
        tags.add(mutagen.id3.TPE1(encoding=3, text=artist))
        tags.add(mutagen.id3.TALB(encoding=3, text=album))
        tags.save(path)
    elif kind == "ogg":
        path.write_bytes(sitegen._ogg(rng, size, "x", "x", "x"))
        f = mutagen.oggvorbis.OggVorbis(path)
        f.delete()
        f["title"], f["artist"], f["album"] = title, artist, album
        f.save()
    elif kind == "flac":
        path.write_bytes(sitegen._flac(rng, size, "x", "x", "x"))
        f = mutagen.flac.FLAC(path)
        f.delete()
        f["title"], f["artist"], f["album"] = title, artist, album
        f.save()
    elif kind == "wma":
        path.write_bytes(sitegen._wma(rng, size, "x", "x", "x"))
        f = mutagen.asf.ASF(path)
        f["Title"], f["Author"], f["WM/AlbumTitle"] = [title], [artist], [album]
        f.save()
    elif kind == "m4a":
        path.write_bytes(m4a_body(seconds=95, kbps=96))
        f = mutagen.mp4.MP4(path)
        f["\xa9nam"], f["\xa9ART"], f["\xa9alb"] = [title], [artist], [album]
        f.save()
    else:
        raise ValueError(kind)
    return path
