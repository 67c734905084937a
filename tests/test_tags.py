"""Every tag reader of crawler/web/tags.py, in both its modes, against mutagen on tags mutagen wrote.

Files of each format are generated with mutagen (ID3v2.3/2.4 with every text encoding, several values, cover
art, comments and padding; ID3v1; Vorbis comments alone, in FLAC, Ogg Vorbis and Ogg Opus), then reshaped the
ways mutagen reads but does not write (ID3v2.2, whole-tag and per-frame unsynchronisation, extended headers,
data length indicators, iTunes' plain v2.4 sizes). mutagen reads each one back, and:

- the lenient mode (a response's first bytes, crawler/web/media.py read_tags) gives mutagen's first values;
- the exact mode (the worker's fast paths) gives them too, or declines, and accepts what mutagen wrote as is;
- read_tags and the fast paths built on them (read_mp3, read_flac, read_ogg_vorbis) agree with mutagen;
- a tag cut at any byte gives a part of the whole tag's answer, never an exception or a different value.
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from collections.abc import Iterator

import pytest
from mutagen._vorbis import VComment
from mutagen.flac import FLAC, Picture
from mutagen.id3 import APIC, COMM, ID3, TALB, TIT2, TLEN, TPE1, TPE2, TXXX, Frame
from mutagen.id3._id3v1 import ParseID3v1
from mutagen.id3._util import ID3SaveConfig, unsynch
from mutagen.ogg import OggPage
from mutagen.oggopus import OggOpus
from mutagen.oggvorbis import OggVorbis

from crawler.web.media import HEAD_BYTES, read_tags
from crawler.web.tags import Decline, read_flac_meta, read_id3v1, read_id3v2, read_vorbis_comment
from crawler.worker.fasttags import read_flac, read_ogg_vorbis
from crawler.worker.filetags import read_file_tags
from crawler.worker.mp3tags import read_mp3

ID3_WANTED = ("TIT2", "TPE1", "TPE2", "TALB", "TLEN")
VORBIS_WANTED = frozenset({b"title", b"artist", b"album", b"albumartist", b"author", b"wm/albumtitle"})
_TEXTS = ["Déjà Vu", "林夕月", "Ünïcødé 歌手 \U0001f3b5", "plain", "  padded  ", "ÿÿ\xff y-umlauts", "a/b", "",
          "Zoë\nnew line", "\u3000", "x" * 300, "Les Étoiles", "AC/DC"]
_LATIN1 = ["Café Noël", "ÿÿÿ", "Björn Åkesson", "plain", " ", "Mañana", "a" * 40, ""]
_VORBIS_KEYS = ["TITLE", "title", "Title", "ARTIST", "artist", "ALBUM", "album", "ALBUMARTIST", "AUTHOR",
                "WM/AlbumTitle", "COMMENT", "DATE", "GENRE", "TRACKNUMBER"]
# 40 frames of MPEG-1 Layer III, 128 kbit/s, 44.1 kHz: what the tags sit in front of.
AUDIO = (b"\xff\xfb\x90\x64" + bytes(413)) * 40


# -- ID3v2 ----------------------------------------------------------------------------------------------------

def _values(rng: random.Random, texts: list[str]) -> list[str]:
    out = [rng.choice(texts) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return out if "".join(out) else ["x"]   # mutagen writes no frame whose text is empty


def _frames(rng: random.Random, v23: bool) -> list[Frame]:
    """Random wanted text frames (each kind once) among others: cover art, comments, user text."""
    frames: list[Frame] = []
    for kind in (TIT2, TPE1, TPE2, TALB):
        if rng.random() < 0.8:
            encoding = rng.choice([0, 1] if v23 else [0, 1, 2, 3])
            frames.append(kind(encoding=encoding, text=_values(rng, _LATIN1 if encoding == 0 else _TEXTS)))
    if rng.random() < 0.3:
        frames.append(TLEN(encoding=0, text=str(rng.randrange(1, 10**7))))
    if rng.random() < 0.3:
        frames.append(APIC(encoding=0, mime="image/jpeg", type=3, desc="", data=rng.randbytes(rng.randrange(10, 9000))))
    if rng.random() < 0.3:
        frames.append(COMM(encoding=1, lang="eng", desc="", text="a comment ÿ"))
    if rng.random() < 0.3:
        frames.append(TXXX(encoding=3 if not v23 else 1, desc="k", text="v"))
    rng.shuffle(frames)
    return frames


def _saved(frames: list[Frame], version: int, padding: int, v1: int = 0) -> bytes:
    """The frames saved by mutagen's ID3 in front of AUDIO (values joined with NULs in v2.3)."""
    tags = ID3()
    for frame in frames:
        tags.add(frame)
    fileobj = io.BytesIO(AUDIO)
    tags.save(fileobj, v2_version=version, v23_sep=None, padding=lambda info: padding, v1=v1)
    return fileobj.getvalue()


def _syncsafe(n: int) -> bytes:
    return bytes([(n >> 21) & 0x7F, (n >> 14) & 0x7F, (n >> 7) & 0x7F, n & 0x7F])


def _tag(version: int, flags: int, body: bytes) -> bytes:
    return b"ID3" + bytes([version, 0, flags]) + _syncsafe(len(body)) + body


def _payload(frame: Frame, version: int) -> bytes:
    return bytes(frame._writeData(ID3SaveConfig(v2_version=min(max(version, 3), 4))))


_V22 = {"TIT2": b"TT2", "TPE1": b"TP1", "TPE2": b"TP2", "TALB": b"TAL", "TLEN": b"TLE", "COMM": b"COM",
        "TXXX": b"TXX", "APIC": b"PIC"}


def _reshaped(rng: random.Random, frames: list[Frame], shape: str) -> bytes:
    """A tag of mutagen's frame payloads in a shape mutagen reads but does not write."""
    pad = b"\x00" * rng.choice([0, 0, 7, 300])
    if shape == "v22":
        body = b""
        for frame in frames:
            if type(frame) is APIC:
                continue   # v2.2's PIC has another layout
            payload = _payload(frame, 3)
            body += _V22[type(frame).__name__] + len(payload).to_bytes(3, "big") + payload
        return _tag(2, 0, body + pad) + AUDIO
    if shape in ("v22 unsync", "v23 unsync"):
        version = 2 if shape == "v22 unsync" else 3
        plain = _reshaped(rng, frames, "v22")[10:-len(AUDIO)] if version == 2 else b"".join(
            type(f).__name__.encode() + struct.pack(">LH", len(p := _payload(f, 3)), 0) + p for f in frames)
        return _tag(version, 0x80, unsynch.encode(plain + pad)) + AUDIO
    if shape in ("v23 extended", "v24 extended"):
        saved = _saved(frames, 3 if shape == "v23 extended" else 4, 0)
        b = saved[6:10]
        body = saved[10:10 + ((b[0] << 21) | (b[1] << 14) | (b[2] << 7) | b[3])]
        ext = struct.pack(">L", 6) + b"\x00" * 6 if shape == "v23 extended" else _syncsafe(6) + b"\x01\x00"
        return _tag(saved[3], 0x40, ext + body + pad) + AUDIO
    # v2.4 frames with flags: a data length indicator, per-frame or whole-tag unsynchronisation, or plain sizes.
    body = b""
    for frame in frames:
        payload = _payload(frame, 4)
        flags = 0
        if shape in ("v24 unsync frames", "v24 data length"):
            flags = rng.choice([0, 1, 2, 3]) if shape == "v24 unsync frames" else 1
            if flags & 2:
                payload = unsynch.encode(payload)
            if flags & 1:
                payload = _syncsafe(len(payload)) + payload
        elif shape == "v24 unsync tag":
            payload = unsynch.encode(payload)
        size = struct.pack(">L", len(payload)) if shape == "v24 itunes sizes" else _syncsafe(len(payload))
        body += type(frame).__name__.encode() + size + struct.pack(">H", flags) + payload
    return _tag(4, 0x80 if shape == "v24 unsync tag" else 0, body + pad) + AUDIO


SHAPES = ["v22", "v22 unsync", "v23 unsync", "v23 extended", "v24 extended", "v24 unsync frames",
          "v24 data length", "v24 unsync tag", "v24 itunes sizes"]


def mutagen_id3(data: bytes) -> dict[str, str]:
    """The first value of each wanted frame as mutagen reads the tag."""
    tags = ID3(io.BytesIO(data))
    return {key: tags[key].text[0] for key in ID3_WANTED if key in tags}


def _media_fields(frames: dict[str, str]) -> dict[str, str | float]:
    """What read_tags makes of a tag's first values: title/artist/album stripped, TLEN's milliseconds."""
    names = {"TIT2": "title", "TPE1": "artist", "TALB": "album"}
    out: dict[str, str | float] = {names[k]: v.strip() for k, v in frames.items() if k in names and v.strip()}
    length = frames.get("TLEN", "").strip()
    if length.isascii() and length.isdigit() and 0 < int(length) < 10**10:
        out["duration"] = int(length) / 1000
    return out


def _is_part_of(part: dict[str, str | float] | dict[str, str], whole: dict[str, str | float] | dict[str, str]) -> bool:
    return all(whole.get(key) == value for key, value in part.items())


def _check_id3(data: bytes, must_accept: bool) -> None:
    expected = mutagen_id3(data)
    assert read_id3v2(data, ID3_WANTED, exact=False)[0] == expected
    try:
        exact, size = read_id3v2(data, ID3_WANTED, exact=True)
    except Decline:
        assert not must_accept, "the exact mode declined what mutagen wrote"
    else:
        assert exact == expected
        assert data[size:] == AUDIO or data[size:].startswith(AUDIO)
    assert read_tags(data) == _media_fields(expected)
    assert _is_part_of(read_tags(data[:HEAD_BYTES]), _media_fields(expected))


@pytest.mark.parametrize("version", [3, 4])
def test_id3v2_written_by_mutagen_reads_as_mutagen_reads_it(version: int) -> None:
    rng = random.Random(version)
    for _ in range(150):
        data = _saved(_frames(rng, version == 3), version, rng.choice([0, 0, 10, 1024]))
        _check_id3(data, must_accept=True)
        if read_mp3(data) is not None:
            assert read_file_tags(data, ".mp3") == read_file_tags(data, ".mp3", fast=False)


@pytest.mark.parametrize("shape", SHAPES)
def test_id3v2_shapes_mutagen_reads_but_does_not_write(shape: str) -> None:
    rng = random.Random(shape)
    for _ in range(60):
        frames = _frames(rng, shape.startswith(("v22", "v23")))
        _check_id3(_reshaped(rng, frames, shape), must_accept=shape == "v24 itunes sizes")


def test_compressed_frames_are_skipped_leniently_and_declined_exactly() -> None:
    text = _payload(TIT2(encoding=3, text="squeezed"), 4)
    packed = zlib.compress(text)
    v24 = _tag(4, 0, b"TIT2" + _syncsafe(len(packed) + 4) + b"\x00\x09" + _syncsafe(len(text)) + packed
               + b"TPE1" + _syncsafe(3) + b"\x00\x00" + b"\x00ab")
    v23 = _tag(3, 0, b"TIT2" + struct.pack(">LH", len(packed) + 4, 0x80) + struct.pack(">L", len(text)) + packed)
    for data in (v24 + AUDIO, v23 + AUDIO):
        assert mutagen_id3(data)["TIT2"] == "squeezed"
        assert "TIT2" not in read_id3v2(data, ID3_WANTED, exact=False)[0]
        with pytest.raises(Decline):
            read_id3v2(data, ID3_WANTED, exact=True)
    assert read_tags(v24) == {"artist": "ab"}


def test_a_tag_cut_at_any_byte_gives_part_of_the_whole_answer() -> None:
    rng = random.Random(11)
    for version, shape in ((3, ""), (4, ""), (2, "v22"), (3, "v23 unsync"), (4, "v24 unsync frames")):
        frames = [TIT2(encoding=1, text=["Trunc ÿ歌", "two"]), TPE1(encoding=0, text="ÿÿ artist"),
                  TALB(encoding=1 if version < 4 else 3, text="Albüm"), TLEN(encoding=0, text="215000")]
        data = _reshaped(rng, frames, shape) if shape else _saved(frames, version, 20)
        whole = read_id3v2(data, ID3_WANTED, exact=False)[0]
        assert whole == mutagen_id3(data) and len(whole) == 4
        for end in range(len(data) - len(AUDIO) + 1):
            assert _is_part_of(read_id3v2(data[:end], ID3_WANTED, exact=False)[0], whole), (version, shape, end)
            assert _is_part_of(read_tags(data[:end]), _media_fields(whole))


def test_garbage_after_a_valid_header_never_raises() -> None:
    rng = random.Random(5)
    for _ in range(500):
        data = b"ID3" + bytes([rng.choice([2, 3, 4]), 0, rng.choice([0, 0x40, 0x80, 0xC0])]) + rng.randbytes(
            rng.randrange(4, 400))
        assert isinstance(read_tags(data), dict)
        try:
            read_id3v2(data, ID3_WANTED, exact=False)
        except (IndexError, ValueError, struct.error):
            pass   # read_tags' caller catches these; none other may escape


# -- ID3v1 ----------------------------------------------------------------------------------------------------

def test_id3v1_written_by_mutagen_reads_as_mutagen_reads_it() -> None:
    rng = random.Random(1)
    for _ in range(100):
        frames = [kind(encoding=0, text=rng.choice(_LATIN1) or "x") for kind in (TIT2, TPE1, TALB)
                  if rng.random() < 0.8]
        data = _saved(frames, 4, 0, v1=2)
        parsed = ParseID3v1(data[-128:]) or {}
        expected = {key: str(parsed[key]) for key in ("TIT2", "TPE1", "TALB") if key in parsed and str(parsed[key])}
        assert read_id3v1(data) == expected
        if read_mp3(data) is not None:
            assert read_file_tags(data, ".mp3") == read_file_tags(data, ".mp3", fast=False)
    assert read_id3v1(AUDIO) is None


# -- Vorbis comments ------------------------------------------------------------------------------------------

def _comment(rng: random.Random) -> VComment:
    vc = VComment()
    vc.vendor = rng.choice(["reference libFLAC 1.3.2", "Xiph.Org libVorbis I 20200704", "", "Lavf ÿ"])
    for _ in range(rng.randrange(0, 12)):
        vc.append((rng.choice(_VORBIS_KEYS), rng.choice(_TEXTS + ["a=b=c"])))
    return vc


def _first_values(pairs: list[tuple[str, str]]) -> dict[bytes, str]:
    """The first value of each wanted key, as mutagen's case-insensitive VCommentDict lists them."""
    out: dict[bytes, str] = {}
    for key, value in pairs:
        name = key.lower().encode()
        if name in VORBIS_WANTED:
            out.setdefault(name, value)
    return out


@pytest.mark.parametrize("framing", [True, False])
def test_vorbis_comments_written_by_mutagen_read_as_mutagen_reads_them(framing: bool) -> None:
    rng = random.Random(int(framing))
    for _ in range(200):
        data = _comment(rng).write(framing=framing)
        expected = _first_values(list(VComment(data, framing=framing)))
        exact, end = read_vorbis_comment(data, 0, len(data), VORBIS_WANTED, framing=framing, exact=True)
        assert (exact, end) == (expected, len(data))
        assert read_vorbis_comment(data, 0, len(data), VORBIS_WANTED, framing=framing, exact=False)[0] == expected
        for cut in range(0, len(data), 7):
            part = read_vorbis_comment(data, 0, cut, VORBIS_WANTED, framing=framing, exact=False)[0]
            assert _is_part_of(part, expected)


def test_vorbis_comment_counts_are_bounded() -> None:
    # A count of four billion comments over a few bytes: the exact mode declines at the data's end, the lenient
    # one stops there (and never reads more than 1000 comments).
    data = struct.pack("<I", 0) + struct.pack("<I", 2**32 - 1) + struct.pack("<I", 7) + b"TITLE=t" * 1
    with pytest.raises(Decline):
        read_vorbis_comment(data, 0, len(data), VORBIS_WANTED, framing=False, exact=True)
    assert read_vorbis_comment(data, 0, len(data), VORBIS_WANTED, framing=False, exact=False)[0] == {b"title": "t"}
    many = struct.pack("<II", 0, 5000) + (struct.pack("<I", 3) + b"x=y") * 4999 + struct.pack("<I", 7) + b"title=t"
    assert read_vorbis_comment(many, 0, len(many), VORBIS_WANTED, framing=False, exact=True)[0] == {b"title": "t"}
    assert read_vorbis_comment(many, 0, len(many), VORBIS_WANTED, framing=False, exact=False)[0] == {}


# -- FLAC -----------------------------------------------------------------------------------------------------

def _streaminfo(rate: int, total: int) -> bytes:
    packed = (rate << 44) | (1 << 41) | (15 << 36) | total
    return struct.pack(">HH", 4096, 4096) + b"\x00\x00\x10\x00\x20\x00" + struct.pack(">Q", packed) + b"\x5a" * 16


def _flac(rng: random.Random) -> bytes:
    """A FLAC file tagged by mutagen: random comments, maybe cover art, random padding."""
    rate = rng.choice([8000, 44100, 48000, 96000])
    total = rng.choice([0, rate * rng.randrange(1, 600)])
    fileobj = io.BytesIO(b"fLaC" + b"\x80" + (34).to_bytes(3, "big") + _streaminfo(rate, total)
                         + b"\xff\xf8\x69\x18" + rng.randbytes(rng.randrange(100, 3000)))
    audio = FLAC(fileobj)
    audio.add_tags()
    assert audio.tags is not None
    for key, value in _comment(rng):
        audio.tags.append((key, value))
    if rng.random() < 0.3:
        picture = Picture()
        picture.type, picture.mime, picture.desc = 3, "image/jpeg", "Front é"
        picture.data = rng.randbytes(rng.randrange(10, 20_000))
        audio.add_picture(picture)
    fileobj.seek(0)
    audio.save(fileobj, padding=lambda info: rng.choice([0, 10, 1024, 8192]))
    return fileobj.getvalue()


def test_flac_written_by_mutagen_reads_as_mutagen_reads_it() -> None:
    rng = random.Random(3)
    for _ in range(100):
        data = _flac(rng)
        audio = FLAC(io.BytesIO(data))
        expected = _first_values(list(audio.tags or []))
        for exact in (True, False):
            rate, total, comments, _ = read_flac_meta(data, VORBIS_WANTED, exact=exact)
            assert (comments, rate, total) == (expected, audio.info.sample_rate, audio.info.total_samples)
        fields = {name: value.strip() for key, value in expected.items()
                  if (name := key.decode()) in ("title", "artist", "album") and value.strip()}
        duration = {"duration": audio.info.length} if audio.info.total_samples else {}
        assert read_tags(data) == {**fields, **duration}
        assert _is_part_of(read_tags(data[:HEAD_BYTES]), {**fields, **duration})
        assert read_flac(data) is not None
        assert read_file_tags(data, ".flac") == read_file_tags(data, ".flac", fast=False)


def test_flac_blocks_are_bounded() -> None:
    # Thousands of empty padding blocks: the exact mode declines after 64, the lenient one stops there.
    data = b"fLaC" + b"\x00" + (34).to_bytes(3, "big") + _streaminfo(44100, 44100) + b"\x01\x00\x00\x00" * 5000
    with pytest.raises(Decline):
        read_flac_meta(data, VORBIS_WANTED, exact=True)
    assert read_tags(data) == {"duration": 1.0}


# -- Ogg Vorbis and Opus --------------------------------------------------------------------------------------

def _ogg(packets: list[bytes], audio: list[bytes], granule: int) -> io.BytesIO:
    """An Ogg stream: the first packet alone on the first page, the headers on the next, then audio pages."""
    first = OggPage()
    first.packets, first.serial, first.sequence, first.first, first.position = [packets[0]], 0x5EED, 0, True, 0
    headers = OggPage.from_packets(packets[1:], sequence=1)
    for page in headers:
        page.serial, page.position = 0x5EED, 0
    tail = OggPage.from_packets(audio, sequence=1 + len(headers))
    for page in tail:
        page.serial, page.position = 0x5EED, granule
    tail[-1].last = True
    return io.BytesIO(b"".join(page.write() for page in [first, *headers, *tail]))


def _packets(data: bytes) -> Iterator[bytes]:
    fileobj, pages = io.BytesIO(data), []
    while fileobj.tell() < len(data):
        pages.append(OggPage(fileobj))
    yield from OggPage.to_packets(pages)


def _tagged_ogg(rng: random.Random, kind: type[OggVorbis] | type[OggOpus]) -> bytes:
    vc = _comment(rng)
    if kind is OggVorbis:
        head = b"\x01vorbis" + struct.pack("<IBIiiiBB", 0, 2, 44100, 0, 128000, 0, 0xB8, 1)
        packets = [head, b"\x03vorbis" + VComment().write(framing=True), b"\x05vorbis" + rng.randbytes(300)]
    else:
        head = b"OpusHead" + struct.pack("<BBHIhB", 1, 2, 312, 48000, 0, 0)
        packets = [head, b"OpusTags" + VComment().write(framing=False)]
    fileobj = _ogg(packets, [rng.randbytes(rng.randrange(10, 400)) for _ in range(10)], 48000 * 3)
    audio = kind(fileobj)
    assert audio.tags is not None
    for key, value in vc:
        audio.tags.append((key, value))
    fileobj.seek(0)
    audio.save(fileobj, padding=lambda info: rng.choice([0, 10, 1024]))
    return fileobj.getvalue()


@pytest.mark.parametrize("kind", [OggVorbis, OggOpus])
def test_ogg_comments_written_by_mutagen_read_as_mutagen_reads_them(kind: type[OggVorbis] | type[OggOpus]) -> None:
    rng = random.Random(kind.__name__)
    skip, framing = (7, True) if kind is OggVorbis else (8, False)
    for _ in range(60):
        data = _tagged_ogg(rng, kind)
        expected = _first_values(list(kind(io.BytesIO(data)).tags or []))
        packet = list(_packets(data))[1]
        for exact in (True, False):
            got = read_vorbis_comment(packet, skip, len(packet), VORBIS_WANTED, framing=framing, exact=exact)[0]
            assert got == expected
        if kind is OggVorbis:
            assert read_ogg_vorbis(data) is not None
            assert read_file_tags(data, ".ogg") == read_file_tags(data, ".ogg", fast=False)

