"""The one reader of each tag format audio carries: ID3v2 (2.2, 2.3, 2.4), ID3v1, Vorbis comments and the FLAC
metadata blocks that hold them.

Two callers read them with two needs, so each reader has two modes over one walk of the bytes:

- exact (the worker's fast paths, crawler/worker/mp3tags.py and fasttags.py): the whole file is in memory and
  the answer must be mutagen 1.48's own (id3/_tags.py read_frames and determine_bpi, id3/_specs.py's text specs,
  id3/_id3v1.py, _vorbis.py VComment, flac.py); anything the mirror is not sure of raises Decline and the caller
  asks mutagen.
- lenient (crawler/web/media.py read_tags, on a response's first bytes): the tag may be cut short; read what
  the bytes hold, the same way, and stop quietly at the first thing that does not add up: unsynchronisation,
  extended headers, ID3v2.2 and text that does not decode cleanly are read rather than declined.

Hostile input is bounded the same way in both: every loop advances through the bytes at hand, counts are capped
(Vorbis comments, FLAC blocks), and a text frame longer than any title is not decoded value by value.
tests/test_tags.py holds both modes to mutagen's answer on files mutagen wrote.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection

from mutagen.id3 import Frames


class Decline(Exception):
    """The bytes hold something only mutagen should judge (exact mode)."""


# -- ID3v2 --------------------------------------------------------------------------------------------------

_KNOWN_FRAMES = frozenset(Frames)
_EMPTY_HEADER = b"\x00" * 10
# A text frame longer than this is no title: the exact mode leaves it to mutagen, the lenient one takes its
# first value without walking the rest.
_MAX_TEXT = 4096
_CODECS = ("latin-1", "utf-16", "utf-16-be", "utf-8")
# ID3v2.2's three-letter names of the text frames a caller may want, by their v2.3/2.4 names.
_V22_NAMES = {b"TT2": "TIT2", b"TP1": "TPE1", b"TP2": "TPE2", b"TAL": "TALB", b"TLE": "TLEN"}
# \xff then a byte no unsynchronisation writes, or at the end: mutagen reads such data as it is.
_UNSAFE = re.compile(rb"\xff(?:[\xe0-\xff]|\Z)")


def _syncsafe(n: int) -> int:
    # BitPaddedInt of a 32-bit int: 7 low bits of each byte.
    return ((n >> 24) & 0x7F) << 21 | ((n >> 16) & 0x7F) << 14 | ((n >> 8) & 0x7F) << 7 | (n & 0x7F)


def _undo_unsync(data: bytes) -> bytes:
    """unsynch.decode, or the data as it is where mutagen's decode fails (as mutagen then reads it)."""
    if b"\xff" not in data or _UNSAFE.search(data) is not None:
        return data
    return data.replace(b"\xff\x00", b"\xff")


def _walk(data: bytes, syncsafe: bool) -> tuple[int, int]:
    """determine_bpi's count of known frame names and how far past the end the walk lands."""
    o = found = 0
    while o < len(data) - 10:
        part = data[o:o + 10]
        if part == _EMPTY_HEADER:
            return found, -((len(data) - o) % 10)
        size = struct.unpack_from(">L", part, 4)[0]
        o += 10 + (_syncsafe(size) if syncsafe else size)
        try:
            name = part[:4].decode("ascii")
        except UnicodeDecodeError:
            continue
        found += name in _KNOWN_FRAMES
    return found, o - len(data)


def _v24_sizes_are_syncsafe(data: bytes) -> bool:
    # iTunes once wrote plain sizes in v2.4 tags; mutagen guesses which reading finds more frames.
    asbpi, bpioff = _walk(data, True)
    asint, intoff = _walk(data, False)
    return not (asint > asbpi or (asint == asbpi and (bpioff >= 1 and intoff <= 1)))


def _first_value(payload: bytes, v24: bool) -> str | None:
    """The first of a text frame's values as mutagen's MultiSpec(EncodedTextSpec) reads them, having checked
    that all of them decode (else mutagen tries fix-ups or drops the frame: Decline); None: mutagen drops the
    frame."""
    if len(payload) < 2 or payload[0] > 3:
        return None   # cut short by the tag's end, a bad encoding or no text: mutagen drops the frame as junk
    if len(payload) > _MAX_TEXT:
        raise Decline
    enc, pos, size = payload[0], 1, len(payload)
    codec = _CODECS[enc]
    # v2.3 had no multiple values: mutagen stops where only zero padding is left rather than read empty ones.
    last = len(payload.rstrip(b"\x00")) if not v24 else size
    first: str | None = None
    while pos < size:
        start = pos
        if enc in (0, 3):
            end = payload.find(b"\x00", pos)
            stop, pos = (size, size) if end == -1 else (end, end + 1)
        else:
            if enc == 1 and payload[pos:pos + 2] not in (b"\xff\xfe", b"\xfe\xff"):
                raise Decline   # mutagen's BOM-less fix-ups
            end = payload.find(b"\x00\x00", pos)
            while end != -1 and (end - pos) % 2:   # a NUL code unit starts on an even byte
                end = payload.find(b"\x00\x00", end + 1)
            if end == -1 and (size - pos) % 2:
                raise Decline   # half a code unit at the end: mutagen's fix-ups again
            stop, pos = (size, size) if end == -1 else (end, end + 2)
        try:
            value = payload[start:stop].decode(codec)
        except UnicodeDecodeError:
            raise Decline from None
        if first is None:
            first = value
        if pos >= last:
            break
    return first


def _loose_value(payload: bytes) -> str:
    """The first value of a text frame mutagen would repair or that does not decode: what it says, with
    replacement characters (lenient mode)."""
    raw = payload[1:]
    if payload[0] in (1, 2) and len(raw) % 2:
        raw = raw[:-1]
    # Multiple values are separated with NUL; the first is the one players show.
    return raw.decode(_CODECS[payload[0]], errors="replace").split("\x00", 1)[0]


def read_id3v2(data: bytes, wanted: Collection[str], *, exact: bool) -> tuple[dict[str, str], int]:
    """The first value of each wanted text frame (by its v2.3/2.4 name) of the ID3v2 tag data starts with, and
    the tag's size, header included.

    A frame kind's first frame that mutagen keeps gives it (a later one only appends values). exact: mutagen's
    answer for the whole tag in data, or Decline (ID3v2.2, header or frame flags, a tag running past the data,
    text mutagen would repair). Lenient: the frames the data holds whole (a tag cut short by the data's end is
    read up to the cut), values mutagen would repair read with replacement characters; compressed and
    encrypted frames skipped.
    """
    if len(data) < 10 or data[:3] != b"ID3":
        if exact:
            raise Decline
        return {}, 0
    major, flags = data[3], data[5]
    sizes = struct.unpack_from(">L", data, 6)[0]
    size = _syncsafe(sizes) + 10
    if exact:
        if major not in (3, 4) or flags or sizes & 0x80808080:
            raise Decline
        if size > len(data):
            raise Decline   # mutagen's read_full fails on a short tag
    elif major not in (2, 3, 4):
        return {}, size   # mutagen does not read other versions
    body = data[10:size]
    unsync = bool(flags & 0x80)
    if unsync and major < 4:   # whole-tag unsynchronisation; a cut may leave half of an escaped \xff
        body = _undo_unsync(body[:-1] if size > len(data) and body[-1:] == b"\xff" else body)
    pos = 0
    if major > 2 and flags & 0x40 and body[:4].decode("ascii", "replace") not in _KNOWN_FRAMES:
        # An extended header (a frame name instead: some taggers set the flag without writing one).
        ext = struct.unpack_from(">L", body)[0]
        pos = _syncsafe(ext) if major == 4 else 4 + ext   # v2.4 counts the size's own 4 bytes, v2.3 does not
    v24 = major == 4
    syncsafe = v24 and _v24_sizes_are_syncsafe(body)
    found: dict[str, str] = {}
    v22 = major == 2
    header_len = 6 if v22 else 10
    cut = size > len(data)
    while pos + header_len <= len(body):   # by position: slicing off each frame would copy the rest of the tag
        if v22:
            name = body[pos:pos + 3]
            fsize = int.from_bytes(body[pos + 3:pos + 6], "big")
            frame_flags = 0
            key = _V22_NAMES.get(name, "")
        else:
            name = body[pos:pos + 4]
            fsize, frame_flags = struct.unpack_from(">LH", body, pos + 4)
            if syncsafe:
                fsize = _syncsafe(fsize)
            key = name.decode("latin-1")
        if not name.strip(b"\x00"):
            break   # padding
        if name[-1] == 0 and exact:
            raise Decline   # a v2.2 name in a v2.3/4 tag: mutagen maps it (the lenient mode skips it)
        start, pos = pos + header_len, pos + header_len + fsize
        if cut and pos > len(body):
            break   # cut short by the end of the bytes at hand (lenient): the rest of the tag is not here
        if fsize == 0 or key not in wanted or key in found:
            # mutagen drops empty frames; other frames are skipped undecoded; a later frame of a kind
            # already read only appends values after the first (TextFrame._merge_frame), which is all we keep.
            continue
        payload = body[start:pos]
        if frame_flags or (unsync and v24):
            if exact:
                raise Decline   # compressed, encrypted, grouped or unsynchronised text
            if v24:
                if frame_flags & 0x0009:   # compressed, or a data length indicator: 4 bytes before the data
                    payload = payload[4:]
                if frame_flags & 0x0002 or unsync:
                    payload = _undo_unsync(payload)
                if frame_flags & 0x000C:
                    continue   # compressed or encrypted: not worth the trouble
            elif frame_flags & 0x00C0:
                continue
        if exact:
            value = _first_value(payload, v24)
        else:
            try:
                value = _first_value(payload, v24)
            except Decline:
                value = _loose_value(payload)
        if value is not None:
            found[key] = value
    return found, size


# -- ID3v1 --------------------------------------------------------------------------------------------------

def read_id3v1(data: bytes) -> dict[str, str] | None:
    """The ID3v1 tag at the end of data: title, artist and album (non-empty ones, by their ID3v2 names), None
    without one; Decline where mutagen may take stray bytes for a short v1 tag."""
    window = data[-131:]   # find_id3v1 reads 128 bytes plus len("APE") before them
    at = window.find(b"TAG")
    if at == -1:
        return None
    if at != len(window) - 128 or len(window) < 131 or b"APETAGEX" in window:
        raise Decline   # "TAG" elsewhere: mutagen may take stray bytes for a short v1 tag
    fields = {}
    for key, start in (("TIT2", 3), ("TPE1", 33), ("TALB", 63)):
        text = window[at + start:at + start + 30].split(b"\x00")[0].strip().decode("latin-1")
        if text:
            fields[key] = text
    return fields


# -- Vorbis comments (Ogg Vorbis, Opus, FLAC) ---------------------------------------------------------------

_U32 = struct.Struct("<I")
# Comments read from one block in lenient mode: a hostile count must not turn into a long loop.
_MAX_COMMENTS = 1000


def read_vorbis_comment(data: bytes, pos: int, end: int, wanted: Collection[bytes], *, framing: bool,
                        exact: bool) -> tuple[dict[bytes, str], int]:
    """The first value of each wanted (lower-case) key of the Vorbis comment at data[pos:end], and where it
    ends.

    mutagen decodes a key, replaces non-ASCII by "?" and compares it lower-cased: a wanted key matches exactly
    when the bytes, ASCII-lower-cased, are it. exact: VComment.load's answer, or Decline where a read runs
    past `end` (a strict file in FLAC, a short uint or a missing framing byte in Ogg) or a value is not UTF-8
    (mutagen substitutes U+FFFD). Lenient: up to the first comment that runs past `end`, values decoded with
    replacement characters, no framing bit asked for.
    """
    if pos + 4 > end:
        if exact:
            raise Decline
        return {}, pos
    pos += 4 + _U32.unpack_from(data, pos)[0]   # the vendor string, decoded with "replace": never fails
    if pos + 4 > end:
        if exact:
            raise Decline
        return {}, pos
    count = _U32.unpack_from(data, pos)[0]
    pos += 4
    found: dict[bytes, str] = {}
    # Each comment takes at least 4 bytes: in exact mode the loop is bounded by the data.
    for _ in range(count if exact else min(count, _MAX_COMMENTS)):
        if pos + 4 > end:
            if exact:
                raise Decline
            return found, pos
        start = pos + 4
        pos = start + _U32.unpack_from(data, pos)[0]
        if pos > end:
            if exact:
                raise Decline
            return found, pos
        eq = data.find(b"=", start, pos)
        if eq == -1:
            continue   # mutagen names it "unknownN": never a wanted key
        key = data[start:eq].lower()
        if key in wanted and key not in found:
            try:
                found[key] = data[eq + 1:pos].decode("utf-8")
            except UnicodeDecodeError:
                if exact:
                    raise Decline from None
                found[key] = data[eq + 1:pos].decode("utf-8", errors="replace")
    if framing and exact:
        if pos >= end or not data[pos] & 1:
            raise Decline
        pos += 1
    return found, pos


# -- FLAC metadata blocks -----------------------------------------------------------------------------------

# More blocks than a real file has before its audio: mutagen's to read (the walk's work stays small).
_MAX_BLOCKS = 64


# What a FLAC stream's metadata blocks say: STREAMINFO's sample rate (None without one) and total samples, the
# wanted comment keys' first values (None without a comment block), and where the metadata ends (the audio
# starts). A plain tuple: it is read for every FLAC download and must cost nothing to make.
FlacMeta = tuple[int | None, int, dict[bytes, str] | None, int]


def _flac_picture_end(data: bytes, pos: int) -> int:
    """Where Picture.load, reading a strict file from pos, stops: type and MIME type, description, then the
    image's dimensions and data."""
    if pos + 8 > len(data):
        raise Decline
    pos += 8 + struct.unpack_from(">I", data, pos + 4)[0]
    if pos + 4 > len(data):
        raise Decline
    pos += 4 + struct.unpack_from(">I", data, pos)[0]
    if pos + 20 > len(data):
        raise Decline
    pos += 20 + struct.unpack_from(">I", data, pos + 16)[0]
    if pos > len(data):
        raise Decline
    return pos


def read_flac_meta(data: bytes, wanted: Collection[bytes], *, exact: bool) -> FlacMeta:
    """The stream facts and Vorbis comments of the FLAC stream data starts with ("fLaC").

    exact: FLAC.load's answer for the whole file, or Decline (a cue sheet, a second STREAMINFO, comment or seek
    table block, a comment or picture block whose contents end elsewhere than its declared size, no STREAMINFO
    or a zero sample rate, anything cut short). Lenient: the blocks the data holds, a repeated one ignored."""
    if not data.startswith(b"fLaC"):
        raise Decline
    pos = 4
    rate: int | None = None
    total = 0
    comments: dict[bytes, str] | None = None
    seen: set[int] = set()
    last = False
    blocks = 0
    n = len(data)
    while not last:
        blocks += 1
        if pos + 4 > n or blocks > _MAX_BLOCKS:
            if exact:
                raise Decline
            break
        byte = data[pos]
        size = int.from_bytes(data[pos + 1:pos + 4], "big")
        code, last = byte & 0x7F, bool(byte & 0x80)
        start = pos + 4
        pos = start + size
        if code in seen and code in (0, 3, 4):
            if exact:
                raise Decline   # a second STREAMINFO, seek table or comment block
            continue
        seen.add(code)
        if not exact:
            if code == 0 and min(pos, len(data)) - start >= 18:
                packed = int.from_bytes(data[start + 10:start + 18], "big")
                rate, total = packed >> 44, packed & 0xFFFFFFFFF
            elif code == 4:
                comments, _ = read_vorbis_comment(data, start, min(pos, len(data)), wanted, framing=False,
                                                  exact=False)
            continue
        if code == 5:
            raise Decline   # a cue sheet: its reader has checks of its own
        if code == 4:
            comments, end = read_vorbis_comment(data, start, len(data), wanted, framing=False, exact=True)
            if end != pos:
                raise Decline   # mutagen goes on from where the comments end, not the declared size
        elif code == 6:
            if _flac_picture_end(data, start) != pos:
                raise Decline
        elif pos > len(data):
            raise Decline   # a strict read runs short: mutagen fails
        elif code == 0:
            if size < 34:
                raise Decline
            packed = int.from_bytes(data[start + 10:start + 18], "big")
            rate, total = packed >> 44, packed & 0xFFFFFFFFF
            if not rate:
                raise Decline   # mutagen raises on a zero sample rate
    if exact and rate is None:
        raise Decline   # no STREAMINFO: mutagen raises
    return rate, total, comments, pos
