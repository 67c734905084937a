"""Fast readers of an in-memory FLAC, Ogg Vorbis, WAVE or ADTS AAC file that give mutagen's own answer or decline.

mutagen costs 40-50 µs of CPU per small file of these formats (about 100 for ADTS AAC, whose frames it follows
bit by bit), most of it in file objects, per-block and per-page objects and its format scoring; the catalogue
keeps only the title, artist, album, duration and bitrate. These read them straight from the bytes, mirroring
mutagen 1.48 only where the outcome is certain:

- FLAC (flac.py FLAC.load, StreamInfo, VCFLACDict, Picture): the stream must start with "fLaC" (no ID3 tag
  before it); crawler/web/tags.py's read_flac_meta walks the blocks as mutagen walks them, the comment and
  picture blocks by their contents (mutagen distrusts their declared sizes, so one whose contents end elsewhere
  is declined). Declined: a cue sheet, a second STREAMINFO, comment or seek table block, anything cut short.
- Ogg Vorbis (oggvorbis.py OggVorbisInfo and OggVCommentDict, ogg.py OggPage, to_packets and find_last): the
  identification header alone on the first page, the comment packet from the next pages (it may span several;
  tags.py's read_vorbis_comment reads it), the length from the last page's granule position, found as find_last
  finds it. Pages' CRCs are not checked, as mutagen does not check them. Declined: Opus or FLAC in Ogg
  (read_file_tags' hint list asks OggVorbis first only when its header says vorbis), pages of another logical
  stream before the first one ends (multiplexed; a chained stream after it is never read), page sequence or
  continuation gaps, a comment packet without its framing bit.
- WAVE (wave.py WaveStreamInfo, _riff.py, _iff.py): the RIFF's direct chunks walked as IffContainerChunkMixin
  walks them, the length from the "data" chunk's declared size and the "fmt " chunk. mutagen's WAVE reads tags
  only from an ID3 chunk, and read_file_tags' keys never name an ID3 frame, so a WAVE file gives no text fields;
  a file with an ID3 chunk is declined (mutagen's ID3 reader decides whether it loads at all).
- ADTS AAC (aac.py AACInfo._parse_adts, _ADTSStream): the length as mutagen estimates it, from the first sync
  word (of up to 10, each searched for within 512 bytes) that 3 frames follow, over at most 100 of them. mutagen's
  AAC reads no tags (an ID3v2 tag in front is skipped by its declared size, never read) and gives its bitrate as
  a float, which read_file_tags does not take: no text fields, no bitrate. Declined: ADIF, no such stream.

Everything else -- text that is not UTF-8 where mutagen would substitute characters, more chunks or pages than a
real file has, anything the mirror did not foresee -- returns None and read_file_tags asks mutagen as before.
tests/test_fasttags.py holds the two to the same output.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from crawler.web.tags import Decline, read_flac_meta, read_vorbis_comment


# How mutagen's case-insensitive VCommentDict answers read_file_tags' _KEYS, per field and in order: keys that
# are not valid Vorbis keys (the MP4 atoms' "\xa9nam") raise and are skipped; the case variants find the same
# values. tests/test_fasttags.py derives this from filetags._KEYS to keep the two in step.
VORBIS_KEYS: dict[str, tuple[bytes, ...]] = {
    "title": (b"title",),
    "artist": (b"artist", b"author", b"albumartist", b"wm/albumartist"),
    "album": (b"album", b"wm/albumtitle"),
}
_WANTED = frozenset(key for keys in VORBIS_KEYS.values() for key in keys)
_U32 = struct.Struct("<I")
# More chunks or pages than a real file has before its audio: mutagen's to read (the fast path's work stays small).
_MAX_CHUNKS = 64


def _fields(comments: dict[bytes, str]) -> dict[str, Any]:
    """filetags._first_text over a VCommentDict: per field, the first key whose first value is not blank."""
    raw: dict[str, Any] = {}
    for field_name, keys in VORBIS_KEYS.items():
        raw[field_name] = None
        for key in keys:
            value = comments.get(key)
            if value and value.strip():
                raw[field_name] = value
                break
    return raw


def stream_facts(raw: dict[str, Any], length: float, bitrate: int) -> dict[str, Any]:
    """raw with the stream's duration and bitrate as read_file_tags gives mutagen's: a duration only when
    positive, rounded to ms; a bitrate in kbit/s only when positive."""
    if length > 0:
        raw["duration"] = round(float(length), 3)
    if bitrate > 0:
        raw["bitrate"] = round(bitrate / 1000)
    return raw


# -- FLAC ---------------------------------------------------------------------------------------------------

def read_flac(data: bytes) -> dict[str, Any] | None:
    """read_file_tags' raw fields (before normalise) for a FLAC file in memory, or None to ask mutagen."""
    if not data.startswith(b"fLaC"):
        return None   # an ID3 tag first, or no FLAC at all
    try:
        sample_rate, total_samples, comments, end = read_flac_meta(data, _WANTED, exact=True)
    except (Decline, IndexError, ValueError, struct.error):
        return None
    assert sample_rate   # exact mode declines a missing STREAMINFO and a zero rate
    length = total_samples / float(sample_rate)
    bitrate = int(float(len(data) - end) * 8 / length) if length else 0
    raw = _fields(comments) if comments is not None else {}
    return stream_facts(raw, length, bitrate)


# -- Ogg Vorbis ---------------------------------------------------------------------------------------------

_OGG_HEADER = struct.Struct("<4sBBqIIiB")   # OggS, version, flags, granule, serial, sequence, crc, segments


def _ogg_header(data: bytes, pos: int) -> tuple[int, int, int, int, bytes, int] | None:
    """(flags, granule, serial, sequence, lacing, where the packets start) of the page at pos, None where
    OggPage raises on its header."""
    if pos + 27 > len(data):
        return None
    magic, version, flags, granule, serial, sequence, _crc, segments = _OGG_HEADER.unpack_from(data, pos)
    if magic != b"OggS" or version != 0:
        return None
    lacing = data[pos + 27:pos + 27 + segments]
    if len(lacing) != segments:
        return None
    return flags, granule, serial, sequence, lacing, pos + 27 + segments


def _ogg_page(data: bytes, pos: int) -> tuple[int, int, int, int, list[bytes], bool, int] | None:
    """OggPage at pos: (flags, granule, serial, sequence, packets, complete, end), None where OggPage raises."""
    header = _ogg_header(data, pos)
    if header is None:
        return None
    flags, granule, serial, sequence, lacing, at = header
    packets: list[bytes] = []
    total = 0
    for c in lacing:
        total += c
        if c < 255:
            packets.append(data[at:at + total])
            at += total
            total = 0
    complete = True
    if total:
        packets.append(data[at:at + total])
        at += total
        complete = False
    if at > len(data):
        return None   # a packet runs past the end
    return flags, granule, serial, sequence, packets, complete, at


def _ogg_page_end(data: bytes, pos: int) -> tuple[int, int, int, int] | None:
    """(flags, granule, serial, end) of the page at pos, None where OggPage raises: the checks without the
    packets, for the pages whose packets are not read."""
    header = _ogg_header(data, pos)
    if header is None:
        return None
    flags, granule, serial, _sequence, lacing, at = header
    end = at + sum(lacing)
    return None if end > len(data) else (flags, granule, serial, end)


def _ogg_last_granule(data: bytes, serial: int) -> int | None:
    """OggPage.find_last(serial, finishing=True)'s page's granule position, or None where it finds none."""
    index = data.rfind(b"OggS", max(0, len(data) - 65536))
    if index == -1:
        raise Decline   # mutagen raises
    page = _ogg_page_end(data, index)
    if page is not None and page[2] == serial and page[1] != -1 and page[0] & 4:
        return page[1]   # the stream's last page, at the end: the usual case
    # The slow way, as mutagen does: every page from the start, to the stream's last page or the first bad one.
    best: int | None = None
    pos = 0
    while (page := _ogg_page_end(data, pos)) is not None:
        flags, granule, page_serial, pos = page
        if page_serial != serial:
            raise Decline   # another logical stream before this one's last page: multiplexed
        if granule != -1:
            best = granule
        if flags & 4:
            break
    return best


def read_ogg_vorbis(data: bytes) -> dict[str, Any] | None:
    """read_file_tags' raw fields (before normalise) for an Ogg Vorbis file in memory, or None to ask mutagen."""
    if not data.startswith(b"OggS") or b"\x01vorbis" not in data[:128]:
        return None   # mutagen.File would not score OggVorbis first
    try:
        first = _ogg_page(data, 0)
        if first is None:
            raise Decline
        flags, _granule, serial, sequence, packets, complete, pos = first
        if not flags & 2 or len(packets) != 1 or not complete or not packets[0].startswith(b"\x01vorbis") \
                or len(packets[0]) < 28:
            raise Decline   # the identification header alone on the stream's first page, or mutagen judges
        _channels, sample_rate, max_rate, nominal, min_rate = struct.unpack_from("<BI3i", packets[0], 11)
        if sample_rate == 0:
            raise Decline
        max_rate, min_rate, nominal = max(0, max_rate), max(0, min_rate), max(0, nominal)
        if nominal == 0:
            bitrate = (max_rate + min_rate) // 2
        elif max_rate and max_rate < nominal:
            bitrate = max_rate
        elif min_rate > nominal:
            bitrate = min_rate
        else:
            bitrate = nominal
        # OggVCommentDict: the next pages of the stream up to the one its first packet ends on.
        parts: list[bytes] = []
        for n in range(_MAX_CHUNKS + 1):
            page = _ogg_page(data, pos)
            if page is None or n == _MAX_CHUNKS:
                raise Decline
            flags, _granule, page_serial, page_sequence, packets, complete, pos = page
            if page_serial != serial or page_sequence != sequence + 1 + n or not packets \
                    or bool(flags & 1) != (n > 0):
                raise Decline   # another stream, a gap, or a continuation where none belongs (or is missing)
            parts.append(packets[0])
            if complete or len(packets) > 1:
                break
        packet = b"".join(parts)
        if not packet.startswith(b"\x03vorbis"):
            raise Decline
        comments, _ = read_vorbis_comment(packet, 7, len(packet), _WANTED, framing=True, exact=True)
        granule = _ogg_last_granule(data, serial)
        if granule is None:
            raise Decline   # mutagen raises
    except (Decline, IndexError, ValueError, struct.error):
        return None
    return stream_facts(_fields(comments), granule / float(sample_rate), bitrate)


# -- WAVE ---------------------------------------------------------------------------------------------------

_CHUNK_HEADER = struct.Struct("<4sI")


def read_wave(data: bytes) -> dict[str, Any] | None:
    """read_file_tags' raw fields (before normalise) for a WAVE file in memory, or None to ask mutagen."""
    if len(data) < 12 or not data.startswith(b"RIFF") or data[8:12] != b"WAVE":
        return None
    root_size = _U32.unpack_from(data, 4)[0]
    if root_size < 4:
        return None   # mutagen raises: no room for the form's name
    root_end = 8 + root_size + root_size % 2
    fmt: bytes | None = None
    data_size: int | None = None
    pos = 12
    chunks = 0
    # IffContainerChunkMixin.subchunks: headers while inside the RIFF's declared size; a short header or an
    # invalid id ends the walk quietly; each chunk's declared size (plus its pad byte) leads to the next.
    while pos < root_end:
        if pos + 8 > len(data):
            break
        chunks += 1
        if chunks > _MAX_CHUNKS:
            return None
        raw_id, size = _CHUNK_HEADER.unpack_from(data, pos)
        try:
            cid = raw_id.decode("ascii").rstrip()
        except UnicodeDecodeError:
            break
        if not cid or min(cid) < " " or max(cid) > "~":
            break
        if cid in ("LIST", "RIFF"):
            if size < 4:
                break   # a container too small for its name is invalid: the walk ends
            if not data[pos + 8:pos + 12].isascii():
                return None   # mutagen raises on the name
        elif cid in ("id3", "ID3"):
            return None   # mutagen's ID3 reader decides what this gives
        elif cid == "fmt" and fmt is None:
            fmt = data[pos + 8:pos + 8 + size]
        elif cid == "data" and data_size is None:
            data_size = size
        pos += 8 + size + size % 2
    if fmt is None or len(fmt) < 16:
        return None   # mutagen raises
    _format, channels, sample_rate, _byte_rate, block_align, bits = struct.unpack_from("<HHLLHH", fmt)
    samples: float = 0
    if block_align > 0 and data_size is not None:
        samples = data_size / block_align
    length = samples / sample_rate if sample_rate > 0 else 0.0
    # Tags come from an ID3 chunk only (none here): read_file_tags' raw has no text fields.
    return stream_facts({}, length, channels * bits * sample_rate)


# -- ADTS AAC -----------------------------------------------------------------------------------------------

_AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)
_ADTS_SYNC = re.compile(rb"\xff[\xf0-\xff]")


def _adts_sync(data: bytes, pos: int, budget: int) -> int:
    """Where _ADTSStream.sync, reading from pos with budget bytes, finds a sync word, or -1.

    It spends a byte of budget per byte read and takes the byte after a lone 0xFF with it; that byte never
    starts a sync word (as a 0xFF it would have completed one), so it finds the first one that starts within
    the budget and whose second byte is in the data."""
    match = _ADTS_SYNC.search(data, pos, pos + max(budget, 2) + 1)
    return match.start() if match else -1


def read_aac(data: bytes) -> dict[str, Any] | None:
    """read_file_tags' raw fields (before normalise) for an ADTS AAC file in memory, or None to ask mutagen."""
    start = 0
    if data.startswith(b"ID3"):
        for byte in data[6:10]:   # BitPaddedInt of what there is of the size; the tag itself is never read
            start = start << 7 | byte & 0x7F
        start += 10
    if data[start:start + 4] == b"ADIF":
        return None
    seek = start
    for _ in range(10):   # _parse_adts: up to 10 syncs, each followed for up to 100 frames, until 3 parse
        sync = _adts_sync(data, seek, 512)
        if sync == -1:
            return None   # mutagen raises
        frames = samples = key = 0
        end = at = sync
        for _ in range(100):
            head = data[at:at + 7]
            if len(head) < 7:
                break   # the header runs past the end
            header = int.from_bytes(head, "big")
            key = key or header >> 28   # the sync word and the fixed header, the same in every frame
            frame_length = header >> 13 & 0x1FFF
            if header >> 28 != key or frame_length < 7:
                break   # another stream's fixed header, or a frame shorter than its header
            # The frame's payload is skipped by seeking, so one cut short by the end still counts whole.
            frames += 1
            samples += ((header & 3) + 1) * 1024
            end = at + frame_length
            at = end if data[end:end + 2] >= b"\xff\xf0" else _adts_sync(data, end, 10)
            if at == -1:
                break
        if frames >= 3:
            break
        seek = sync + 1
    else:
        return None   # mutagen raises: no stream of 3 frames
    rate_index = key >> 6 & 0xF
    rate = _AAC_RATES[rate_index] if rate_index < len(_AAC_RATES) else 0
    # AACInfo's estimate, with its offsets as they are: the stream's size counts from where the try's search
    # began, and the size to the file's end from the sync word plus one plus the sync's distance again.
    stream_size = len(data) - (sync + 1 + sync - seek)
    length = float(samples * stream_size) / (float(end - seek) * rate) if rate else 0.0
    # ID3 tags before the stream are skipped, never read (AAC has no tags); the bitrate is a float, which
    # read_file_tags does not take.
    return stream_facts({}, length, 0)
