"""Metadata embedded at the start of audio files: ID3v2 text frames and FLAC Vorbis comments.

Only the first bytes of a response are at hand, so both readers take what they can from a truncated
buffer and stop quietly at the first thing that does not add up.
"""

from __future__ import annotations

import re

_ID3_FIELDS = {
    b"TIT2": "title", b"TPE1": "artist", b"TALB": "album", b"TLEN": "length_ms",
    b"TT2": "title", b"TP1": "artist", b"TAL": "album", b"TLE": "length_ms",
}
_VORBIS_FIELDS = {"TITLE": "title", "ARTIST": "artist", "ALBUM": "album"}
_ENCODINGS = {0: "latin-1", 1: "utf-16", 2: "utf-16-be", 3: "utf-8"}


def read_tags(head: bytes) -> dict[str, str | float]:
    """title/artist/album (str) and duration (seconds) found in the file's leading tag, if any."""
    try:
        if head[:3] == b"ID3":
            found = _read_id3v2(head)
        elif head[:4] == b"fLaC":
            found = _read_flac(head)
        else:
            return {}
    except (IndexError, ValueError):
        return {}
    out: dict[str, str | float] = {k: v for k, v in found.items() if k != "length_ms" and v}
    length = found.get("length_ms")
    if isinstance(length, str) and re.fullmatch(r"\s*[0-9]{1,10}\s*", length) and int(length) > 0:
        out["duration"] = int(length) / 1000
    elif isinstance(found.get("duration"), float):
        out["duration"] = found["duration"]
    return out


def _synchsafe(b: bytes) -> int:
    return (b[0] << 21) | (b[1] << 14) | (b[2] << 7) | b[3]


def _read_id3v2(head: bytes) -> dict[str, str | float]:
    if len(head) < 10:
        return {}
    major, flags = head[3], head[5]
    size = _synchsafe(head[6:10])
    body = head[10:10 + size]
    if major in (2, 3) and flags & 0x80:
        body = body.replace(b"\xff\x00", b"\xff")  # whole-tag unsynchronisation
    pos = 0
    if major in (3, 4) and flags & 0x40:  # extended header: skip it
        ext = _synchsafe(body[0:4]) if major == 4 else int.from_bytes(body[0:4], "big") + 4
        pos = ext
    out: dict[str, str | float] = {}
    id_len, header_len = (3, 6) if major == 2 else (4, 10)
    while pos + header_len <= len(body):
        frame_id = body[pos:pos + id_len]
        if not frame_id.strip(b"\x00") or not frame_id.isalnum():
            break  # padding or garbage
        if major == 2:
            frame_size = int.from_bytes(body[pos + 3:pos + 6], "big")
            frame_flags = 0
        elif major == 4:
            frame_size = _synchsafe(body[pos + 4:pos + 8])
            frame_flags = int.from_bytes(body[pos + 8:pos + 10], "big")
        else:
            frame_size = int.from_bytes(body[pos + 4:pos + 8], "big")
            frame_flags = int.from_bytes(body[pos + 8:pos + 10], "big")
        data = body[pos + header_len:pos + header_len + frame_size]
        pos += header_len + frame_size
        key = _ID3_FIELDS.get(frame_id)
        if key is None or key in out or len(data) < 2:
            continue
        if major == 4:
            if frame_flags & 0x000C:  # compressed or encrypted: not worth the trouble
                continue
            if frame_flags & 0x0002:
                data = data.replace(b"\xff\x00", b"\xff")
            if frame_flags & 0x0001:  # data length indicator
                data = data[4:]
        elif major == 3 and frame_flags & 0x00C0:
            continue
        text = _decode_text(data)
        if text:
            out[key] = text
    return out


def _decode_text(data: bytes) -> str:
    encoding = _ENCODINGS.get(data[0])
    if encoding is None:
        return ""
    raw = data[1:]
    if encoding.startswith("utf-16"):
        if len(raw) % 2:
            raw = raw[:-1]
        text = raw.decode(encoding, errors="replace")
    else:
        text = raw.decode(encoding, errors="replace")
    # v2.4 separates multiple values with NUL; the first is the one players show.
    return text.split("\x00", 1)[0].strip()


def _read_flac(head: bytes) -> dict[str, str | float]:
    pos = 4
    out: dict[str, str | float] = {}
    while pos + 4 <= len(head):
        block_header = head[pos]
        last, block_type = block_header & 0x80, block_header & 0x7F
        length = int.from_bytes(head[pos + 1:pos + 4], "big")
        block = head[pos + 4:pos + 4 + length]
        pos += 4 + length
        if block_type == 0 and len(block) >= 18:
            rate = int.from_bytes(block[10:13], "big") >> 4
            samples = int.from_bytes(block[13:18], "big") & 0xFFFFFFFFF
            if rate and samples:
                out["duration"] = samples / rate
        elif block_type == 4:
            out.update(_vorbis_comments(block))
        if last:
            break
    return out


def _vorbis_comments(block: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    vendor_len = int.from_bytes(block[0:4], "little")
    pos = 4 + vendor_len
    count = int.from_bytes(block[pos:pos + 4], "little")
    pos += 4
    for _ in range(min(count, 1000)):
        n = int.from_bytes(block[pos:pos + 4], "little")
        entry = block[pos + 4:pos + 4 + n].decode("utf-8", errors="replace")
        pos += 4 + n
        key, eq, value = entry.partition("=")
        field_name = _VORBIS_FIELDS.get(key.upper())
        if eq and field_name and field_name not in out and value.strip():
            out[field_name] = value.strip()
        if pos >= len(block):
            break
    return out
