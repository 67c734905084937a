"""Generate the demo music site: plain static files that nginx or scripts/siteserver.py can serve as they are.

The site is shaped like the sites the crawler is built for: a home page, paginated song lists, an artist index,
artist and album pages, song pages that each carry one audio reference in one of several embedding styles, and the
awkward parts a real site has (broken links, redirects, off-site links, a robots.txt-protected area, pages that talk
about ".mp3" without offering any). Everything comes from one seeded random generator, so a seed always yields
byte-identical files, and the returned Manifest says what a correct crawl of the site must find.

Paths in the manifest are site-relative ("/song/12.html"); callers join them with the server's origin.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import os
import random
import shutil
import struct
import sys
import zlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- site constants that the server, the nginx rules and the tests share -------------------------------------------

HOME = "/"
REDIRECTS_FILE = "_redirects.json"
MANIFEST_FILE = "manifest.json"
NGINX_FRAGMENT_FILE = "nginx.conf.fragment"
# Written next to the pages for tooling, never served: the server and the nginx rules answer 404 for them.
UNSERVED_FILES = frozenset({REDIRECTS_FILE, MANIFEST_FILE, NGINX_FRAGMENT_FILE})
STREAM_PREFIX = "/stream/"
STREAM_CONTENT_TYPE = "audio/mpeg"
OFFSITE_ORIGIN = "http://example.invalid"
PRIVATE_PREFIX = "/private/"

# Content types by extension, for the loopback server and the nginx rules alike (nginx's stock mime.types knows
# neither flac, wav, wma, aac nor the playlist formats).
CONTENT_TYPES: Mapping[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".txt": "text/plain; charset=utf-8",
    ".json": "application/json",
    ".png": "image/png",
    ".mp4": "video/mp4",
    ".mp3": "audio/mpeg",
    ".ogg": "audio/ogg",
    ".m4a": "audio/mp4",
    ".flac": "audio/flac",
    ".wav": "audio/wav",
    ".wma": "audio/x-ms-wma",
    ".aac": "audio/aac",
    ".m3u": "audio/x-mpegurl",
    ".pls": "audio/x-scpls",
}

# The embedding styles, in rotation order: song i (1-based) uses STYLES[(i - 1) % 9]. "embed" alternates
# between an <embed> (.wma) and an <object> (.mp3); "playlist" is an .m3u, and every fourth one a .pls.
STYLES = ("link", "audio-src", "audio-source", "data-attr", "script-object", "json-block", "embed", "stream",
          "playlist")
# The style names that appear in the manifest: "embed" splits by element.
MANIFEST_STYLES = ("link", "audio-src", "audio-source", "data-attr", "script-object", "json-block", "embed",
                   "object", "stream", "playlist")

# Every generated file gets this mtime, so ETag and Last-Modified are as reproducible as the bytes.
FIXED_MTIME = 1_700_000_000

# --- the manifest ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExpectedAudio:
    """One audio item a correct crawl reports: where the sniffer sees it and what it is."""

    url: str            # site-relative; for playlists the entry's URL, for streams the /stream/<id> URL
    page: str           # the song page that carries (or links) it
    title: str
    artist: str
    album: str
    style: str          # one of MANIFEST_STYLES
    size: int
    sha256: str
    duration: int       # seconds, as the page and the playlist state it
    playlist: str | None = None   # the .m3u/.pls that lists it, for the playlist style

    def to_json(self) -> dict[str, Any]:
        d = {"url": self.url, "page": self.page, "title": self.title, "artist": self.artist, "album": self.album,
             "style": self.style, "size": self.size, "sha256": self.sha256, "duration": self.duration}
        if self.playlist is not None:
            d["playlist"] = self.playlist
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ExpectedAudio:
        return cls(url=d["url"], page=d["page"], title=d["title"], artist=d["artist"], album=d["album"],
                   style=d["style"], size=d["size"], sha256=d["sha256"], duration=d["duration"],
                   playlist=d.get("playlist"))


@dataclass(frozen=True, slots=True)
class Redirect:
    location: str
    status: int


@dataclass(frozen=True)
class Manifest:
    """What a crawl of the generated site should see. Written as OUT_DIR/manifest.json."""

    seed: int
    songs: int
    home: str
    pages: tuple[str, ...]                 # reachable from home through in-site links, redirects followed
    depth: Mapping[str, int]               # shortest link distance from home, per reachable page
    not_found: tuple[str, ...]             # linked in-site paths that answer 404
    redirects: Mapping[str, Redirect]      # source path -> where it points (sources are not pages)
    offsite: tuple[str, ...]               # linked URLs on other hosts: never to be fetched
    robots_disallowed: tuple[str, ...]     # pages linked but excluded by robots.txt
    audio: tuple[ExpectedAudio, ...]
    large: tuple[str, ...]                 # audio URLs of the big files, for resumable-download tests
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_depth(self) -> int:
        return max(self.depth.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "songs": self.songs, "home": self.home, "pages": list(self.pages),
            "depth": dict(self.depth), "max_depth": self.max_depth, "not_found": list(self.not_found),
            "redirects": {k: {"location": r.location, "status": r.status} for k, r in self.redirects.items()},
            "offsite": list(self.offsite), "robots_disallowed": list(self.robots_disallowed),
            "audio": [a.to_json() for a in self.audio], "large": list(self.large), "extra": dict(self.extra),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Manifest:
        return cls(seed=d["seed"], songs=d["songs"], home=d["home"], pages=tuple(d["pages"]),
                   depth=dict(d["depth"]), not_found=tuple(d["not_found"]),
                   redirects={k: Redirect(v["location"], v["status"]) for k, v in d["redirects"].items()},
                   offsite=tuple(d["offsite"]), robots_disallowed=tuple(d["robots_disallowed"]),
                   audio=tuple(ExpectedAudio.from_json(a) for a in d["audio"]), large=tuple(d["large"]),
                   extra=dict(d.get("extra") or {}))

    @classmethod
    def load(cls, site_dir: Path) -> Manifest:
        return cls.from_json(json.loads((Path(site_dir) / MANIFEST_FILE).read_text("utf-8")))


def load_redirects(site_dir: Path) -> dict[str, Redirect]:
    """The redirect map the generator wrote; empty when the directory has none (a hand-made site)."""
    p = Path(site_dir) / REDIRECTS_FILE
    if not p.is_file():
        return {}
    raw = json.loads(p.read_text("utf-8"))
    return {k: Redirect(v["location"], int(v["status"])) for k, v in raw.items()}


# --- audio and media files: small, but with the headers real files start with ----------------------------------------

def _id3v23(title: str, artist: str, album: str) -> bytes:
    def frame(fid: bytes, text: str) -> bytes:
        try:
            payload = b"\x00" + text.encode("latin-1")
        except UnicodeEncodeError:
            # ID3v2.3 has no UTF-8: non-Latin text goes as UTF-16 with a byte order mark.
            payload = b"\x01\xff\xfe" + text.encode("utf-16-le")
        return fid + struct.pack(">I", len(payload)) + b"\x00\x00" + payload

    body = frame(b"TIT2", title) + frame(b"TPE1", artist) + frame(b"TALB", album)
    n = len(body)
    syncsafe = bytes([(n >> 21) & 0x7F, (n >> 14) & 0x7F, (n >> 7) & 0x7F, n & 0x7F])
    return b"ID3\x03\x00\x00" + syncsafe + body


def _mp3(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    # MPEG-1 Layer III, 128 kbit/s, 44.1 kHz, stereo, no padding: 417-byte frames.
    header = b"\xff\xfb\x90\x64"
    out = bytearray(_id3v23(title, artist, album))
    while len(out) < size:
        out += header + rng.randbytes(413)
    return bytes(out)


_BIT_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _ogg_crc(data: bytes) -> int:
    """Ogg's CRC-32: zlib's polynomial, but MSB-first with zero init and no final xor. zlib only runs it
    LSB-first, so feed it bit-reversed bytes (starting from a zero register) and reverse the result: a
    byte-at-a-time loop in Python would dominate generation time."""
    reflected = zlib.crc32(data.translate(_BIT_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def _ogg_page(payload: bytes, *, seq: int, header_type: int, granule: int) -> bytes:
    segs = []
    rest = len(payload)
    while rest >= 255:
        segs.append(255)
        rest -= 255
    segs.append(rest)
    head = (b"OggS\x00" + bytes([header_type]) + struct.pack("<qII", granule, 0x5EED, seq)
            + b"\x00\x00\x00\x00" + bytes([len(segs)]) + bytes(segs))
    page = head + payload
    return page[:22] + struct.pack("<I", _ogg_crc(page)) + page[26:]


def _vorbis_comments(title: str, artist: str, album: str) -> bytes:
    vendor = b"demo-site"
    items = [f"TITLE={title}", f"ARTIST={artist}", f"ALBUM={album}"]
    out = struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", len(items))
    for it in items:
        b = it.encode("utf-8")
        out += struct.pack("<I", len(b)) + b
    return out


def _ogg(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    ident = b"\x01vorbis" + struct.pack("<IBIiiiBB", 0, 2, 44100, 0, 128000, 0, 0xB8, 1)
    comment = b"\x03vorbis" + _vorbis_comments(title, artist, album) + b"\x01"
    out = bytearray(_ogg_page(ident, seq=0, header_type=2, granule=0))
    out += _ogg_page(comment, seq=1, header_type=0, granule=0)
    seq = 2
    while len(out) < size:
        chunk = min(4000, max(1, size - len(out) - 40))
        out += _ogg_page(rng.randbytes(chunk), seq=seq, header_type=0, granule=seq * 1024)
        seq += 1
    return bytes(out)


def _flac(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    # STREAMINFO: block sizes, frame sizes, then 44.1 kHz / 2 channels / 16 bits packed into 64 bits, then MD5.
    packed = (44100 << 44) | (1 << 41) | (15 << 36) | (44100 * 180)
    streaminfo = struct.pack(">HH", 4096, 4096) + b"\x00\x00\x00" * 2 + struct.pack(">Q", packed) + b"\x00" * 16
    comments = _vorbis_comments(title, artist, album)
    out = bytearray(b"fLaC")
    out += bytes([0]) + len(streaminfo).to_bytes(3, "big") + streaminfo
    out += bytes([0x80 | 4]) + len(comments).to_bytes(3, "big") + comments
    while len(out) < size:
        out += b"\xff\xf8\x69\x18" + rng.randbytes(1020)
    return bytes(out)


def _wav(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    def chunk(cid: bytes, data: bytes) -> bytes:
        pad = b"\x00" if len(data) % 2 else b""
        return cid + struct.pack("<I", len(data)) + data + pad

    fmt = struct.pack("<HHIIHH", 1, 2, 44100, 44100 * 4, 4, 16)
    info = b"INFO" + b"".join(chunk(cid, text.encode("utf-8") + b"\x00")
                              for cid, text in ((b"INAM", title), (b"IART", artist), (b"IPRD", album)))
    head = chunk(b"fmt ", fmt) + chunk(b"LIST", info)
    n = max(4, (size - 12 - len(head) - 8) // 4 * 4)
    body = head + chunk(b"data", rng.randbytes(n))
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WAVE" + body


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _m4a(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    ftyp = _box(b"ftyp", b"M4A " + struct.pack(">I", 0) + b"M4A mp42isom")
    return ftyp + _box(b"mdat", rng.randbytes(max(0, size - len(ftyp) - 8)))


def _mp4_video(rng: random.Random, size: int) -> bytes:
    ftyp = _box(b"ftyp", b"isom" + struct.pack(">I", 512) + b"isomiso2avc1mp41")
    return ftyp + _box(b"mdat", rng.randbytes(max(0, size - len(ftyp) - 8)))


_ASF_HEADER = bytes.fromhex("3026B2758E66CF11A6D900AA0062CE6C")
_ASF_CONTENT_DESCRIPTION = bytes.fromhex("3326B2758E66CF11A6D900AA0062CE6C")
_ASF_DATA = bytes.fromhex("3626B2758E66CF11A6D900AA0062CE6C")


def _wma(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    strings = [(s + "\x00").encode("utf-16-le") for s in (title, artist, "", "", "")]
    desc_body = struct.pack("<5H", *(len(s) for s in strings)) + b"".join(strings)
    desc = _ASF_CONTENT_DESCRIPTION + struct.pack("<Q", 24 + len(desc_body)) + desc_body
    header = _ASF_HEADER + struct.pack("<QIBB", 30 + len(desc), 1, 1, 2) + desc
    n = max(0, size - len(header) - 50)
    data = _ASF_DATA + struct.pack("<Q", 50 + n) + b"\x00" * 16 + struct.pack("<QBB", 0, 1, 1) + rng.randbytes(n)
    return header + data


def _aac(rng: random.Random, size: int, title: str, artist: str, album: str) -> bytes:
    out = bytearray()
    while len(out) < size:
        frame_len = 7 + 249
        # ADTS: sync, MPEG-4, no CRC; AAC LC, 44.1 kHz (index 4), 2 channels, 13-bit frame length, VBR fullness.
        hdr = bytes([0xFF, 0xF1, (1 << 6) | (4 << 2), (2 << 6) | (frame_len >> 11),
                     (frame_len >> 3) & 0xFF, ((frame_len & 7) << 5) | 0x1F, 0xFC])
        out += hdr + rng.randbytes(frame_len - 7)
    return bytes(out)


_AUDIO_BUILDERS = {".mp3": _mp3, ".ogg": _ogg, ".flac": _flac, ".wav": _wav, ".m4a": _m4a, ".wma": _wma,
                   ".aac": _aac}


def _png(rgb: tuple[int, int, int]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(rgb) * 16 for _ in range(16))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


# --- names ------------------------------------------------------------------------------------------------------

_EN = ("Midnight", "River", "Echo", "Golden", "Summer", "Rain", "Neon", "Heart", "Paper", "Ocean", "Silver",
       "Lights", "Dancing", "Shadow", "Wild", "Velvet", "Morning", "Highway", "Stone", "Fire", "Blue", "Garden",
       "Northern", "Electric", "Quiet", "Storm", "Harbour", "Glass", "Falling", "Static")
_ACCENTED = ("Café", "Mañana", "Déjà Vu", "Été", "Señorita", "Über", "Naïve", "Crème", "São Paulo", "Noël",
             "Fjärran", "Łódź", "Çoban", "Año Nuevo")
_ZH = ("月光", "夜曲", "晴天", "青花", "稻香", "星空", "海风", "雨后", "小城", "故乡", "红豆", "江南", "白鸽", "灯塔")
_FIRST = ("Ada", "Marco", "Lena", "Tomás", "Zoë", "Björn", "Noor", "Kofi", "Inès", "Yuki", "Ravi", "Élodie",
          "Sven", "Mia", "Joaquín", "Hana")
_LAST = ("Lindqvist", "Moreau", "Okafor", "Åkesson", "Navarro", "Sato", "Brennan", "Dvořák", "Haddad", "Kowalski",
         "Müller", "Oyelaran", "Fontaine", "Castillo")
_ZH_SURNAMES = ("林", "陈", "周", "王", "李", "赵")
_ZH_GIVEN = ("夕月", "晓风", "海音", "子涵", "青山", "小雨")
_BANDS = ("Paper Lanterns", "The Velvet Owls", "Static Harbour", "Les Étoiles", "Northern Glass", "Sonido Sur")


def _title(rng: random.Random, i: int) -> str:
    # A fixed rotation guarantees non-ASCII titles appear even on small sites.
    if i % 7 == 0:
        return rng.choice(_ZH) + rng.choice(_ZH)
    if i % 7 == 3:
        return f"{rng.choice(_ACCENTED)} {rng.choice(_EN)}"
    return f"{rng.choice(_EN)} {rng.choice(_EN)}"


def _artist_name(rng: random.Random, i: int) -> str:
    if i % 5 == 2:
        return rng.choice(_ZH_SURNAMES) + rng.choice(_ZH_GIVEN)
    if i % 5 == 4:
        return f"{rng.choice(_BANDS)} {i}" if i >= len(_BANDS) else rng.choice(_BANDS)
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _album_name(rng: random.Random, i: int) -> str:
    if i % 6 == 1:
        return rng.choice(_ZH) + "集"
    return f"{rng.choice(_EN)} {rng.choice(('Sessions', 'Tapes', 'Nights', 'Songs', 'Stories', 'Years'))}"


# --- the site model ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Song:
    id: int
    title: str
    artist: int
    album: int
    duration: int

    @property
    def page(self) -> str:
        return f"/song/{self.id}.html"


@dataclass
class _Page:
    """An HTML page being written; every href goes through link() so the generator knows the link graph."""

    path: str
    links: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    def link(self, href: str) -> str:
        self.links.append(href)
        return html.escape(href, quote=True)

    def a(self, href: str, text: str, **attrs: str) -> str:
        extra = "".join(f' {k.replace("_", "-")}="{html.escape(v, quote=True)}"' for k, v in attrs.items())
        return f'<a href="{self.link(href)}"{extra}>{html.escape(text)}</a>'

    def add(self, *chunks: str) -> None:
        self.parts.extend(chunks)


def _e(s: str) -> str:
    return html.escape(s, quote=True)


def _js(value: Any) -> str:
    # Inside <script>, "</" would end the element early; JSON allows "\/" for "/".
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def _pager(n: int, total: int) -> list[int]:
    """Page numbers a pager on page n links to: neighbours, ends, its own run of ten, the tens of its hundred and
    every hundred, so any page is a few clicks from any other however long the list."""
    decade = (n // 10) * 10
    hundred = (n // 100) * 100
    nums = {1, total, n - 1, n + 1}
    nums.update(range(decade, decade + 10))
    nums.update(range(10, total + 1, 10) if total <= 200 else range(hundred, hundred + 100, 10))
    nums.update(range(100, total + 1, 100))
    return sorted(k for k in nums if 1 <= k <= total and k != n)


def _duration_text(secs: int) -> str:
    return f"{secs // 60}:{secs % 60:02d}"


class _SiteWriter:
    def __init__(self, out_dir: Path) -> None:
        self.out = out_dir
        self.written: set[str] = set()
        self.dirs: set[Path] = set()
        self.pages: dict[str, _Page] = {}

    def put(self, path: str, data: bytes) -> None:
        assert path not in self.written, path
        self.written.add(path)
        target = self.out / path.lstrip("/")
        if target.parent not in self.dirs:
            target.parent.mkdir(parents=True, exist_ok=True)
            self.dirs.add(target.parent)
        target.write_bytes(data)
        os.utime(target, (FIXED_MTIME, FIXED_MTIME))

    def page(self, path: str, title: str, *, head: Iterable[str] = (), nav: bool = True) -> _Page:
        p = _Page(path)
        p.add("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
              f"<title>{_e(title)} | Demo Music</title>\n",
              '<link rel="stylesheet" href="/static/site.css">\n', *head, "</head>\n<body>\n")
        if nav:
            p.add("<nav>", p.a(HOME, "Home"), " | ", p.a("/list/1.html", "Songs"), " | ",
                  p.a("/artists/1.html", "Artists"), " | ", p.a("/about.html", "About"), "</nav>\n")
        self.pages[path] = p
        return p

    def finish(self, p: _Page) -> None:
        p.add("<footer><p>&copy; Demo Music. ", p.a("/help.html", "Help"), "</p></footer>\n</body>\n</html>\n")
        file_path = p.path + "index.html" if p.path.endswith("/") else p.path
        self.put(file_path, "".join(p.parts).encode("utf-8"))

def generate(out_dir: Path, *, songs: int = 1000, seed: int = 7, artists: int | None = None,
             page_size: int = 20, audio_size: int = 4096, large_files: int = 3,
             large_size: int = 2 * 1024 * 1024, replace: bool = False) -> Manifest:
    """Write the site into out_dir and return (and write) its manifest.

    audio_size is the typical size of an audio file (each varies from half to one and a half times it);
    large_files of them, spread over the styles, are large_size bytes instead. out_dir must be empty or absent;
    with replace=True a directory holding an earlier generated site (it has a manifest.json) is cleared first.
    """
    if songs < 1 or page_size < 1:
        raise ValueError("songs and page_size must be at least 1")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (replace and (out_dir / MANIFEST_FILE).is_file()):
            raise FileExistsError(f"{out_dir} is not empty (pass replace=True to regenerate a generated site)")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    rng = random.Random(seed)
    n_artists = max(1, min(songs, artists if artists is not None else songs // 10))
    w = _SiteWriter(out_dir)

    # Artists, then songs assigned to them (the first n_artists songs one each, so no artist is empty).
    artist_names = [_artist_name(rng, i) for i in range(n_artists)]
    song_artist = [i if i < n_artists else rng.randrange(n_artists) for i in range(songs)]
    by_artist: dict[int, list[int]] = {a: [] for a in range(n_artists)}
    for idx, a in enumerate(song_artist):
        by_artist[a].append(idx + 1)
    # Albums: each artist's songs in runs of 4-10.
    album_names: list[str] = []
    album_artist: list[int] = []
    song_album: dict[int, int] = {}
    album_songs: list[list[int]] = []
    for a in range(n_artists):
        ids = by_artist[a]
        k = 0
        while k < len(ids):
            run = ids[k:k + rng.randint(4, 10)]
            k += len(run)
            album_id = len(album_names) + 1
            album_names.append(_album_name(rng, album_id))
            album_artist.append(a)
            album_songs.append(run)
            for sid in run:
                song_album[sid] = album_id
    all_songs = [_Song(i, _title(rng, i), song_artist[i - 1], song_album[i], rng.randint(95, 420))
                 for i in range(1, songs + 1)]
    large_ids = set(rng.sample(range(1, songs + 1), min(large_files, songs)))
    large_pages = {f"/song/{i}.html" for i in large_ids}

    def artist_path(a: int, page: int = 1) -> str:
        return f"/artist/{a + 1}.html" if page == 1 else f"/artist/{a + 1}-{page}.html"

    def album_path(al: int) -> str:
        return f"/album/{al}.html"

    def song_line(p: _Page, s: _Song) -> str:
        return (f"<li>{p.a(s.page, s.title)} - {p.a(artist_path(s.artist), artist_names[s.artist])} "
                f"<span class=\"len\">{_duration_text(s.duration)}</span></li>\n")

    not_found: set[str] = set()
    offsite: set[str] = set()
    redirects: dict[str, Redirect] = {}

    def broken(p: _Page, href: str, text: str) -> str:
        not_found.add(href)
        return p.a(href, text)

    def away(p: _Page, href: str, text: str) -> str:
        offsite.add(href)
        return p.a(href, text, rel="nofollow")

    def moved(p: _Page, src: str, dst: str, status: int, text: str) -> str:
        redirects[src] = Redirect(dst, status)
        return p.a(src, text)

    # Song lists.
    n_lists = (songs + page_size - 1) // page_size
    for n in range(1, n_lists + 1):
        path = f"/list/{n}.html"
        head = []
        if n > 1:
            head.append(f'<link rel="prev" href="/list/{n - 1}.html">\n')
        if n < n_lists:
            head.append(f'<link rel="next" href="/list/{n + 1}.html">\n')
        p = w.page(path, f"All songs, page {n}", head=head)
        if n < n_lists:
            p.link(f"/list/{n + 1}.html")   # the <link rel=next> above is a link too
        p.add(f"<h1>All songs</h1>\n<p>Page {n} of {n_lists}</p>\n<ol start=\"{(n - 1) * page_size + 1}\">\n")
        for s in all_songs[(n - 1) * page_size:n * page_size]:
            p.add(song_line(p, s))
        p.add("</ol>\n<p class=\"pager\">")
        if n > 1:
            p.add(p.a(f"/list/{n - 1}.html", "« Prev", rel="prev"), " ")
        for k in _pager(n, n_lists):
            p.add(p.a(f"/list/{k}.html", str(k)), " ")
        if n < n_lists:
            p.add(p.a(f"/list/{n + 1}.html", "Next »", rel="next"))
        p.add("</p>\n")
        w.finish(p)

    # Artist index.
    n_artist_pages = (n_artists + page_size - 1) // page_size
    for n in range(1, n_artist_pages + 1):
        p = w.page(f"/artists/{n}.html", f"Artists, page {n}")
        p.add(f"<h1>Artists</h1>\n<p>Page {n} of {n_artist_pages}</p>\n<ul>\n")
        for a in range(n_artists)[(n - 1) * page_size:n * page_size]:
            p.add(f"<li>{p.a(artist_path(a), artist_names[a])} ({len(by_artist[a])} songs)</li>\n")
        p.add("</ul>\n<p class=\"pager\">")
        for k in _pager(n, n_artist_pages):
            p.add(p.a(f"/artists/{k}.html", str(k)), " ")
        if n < n_artist_pages:
            p.add(p.a(f"/artists/{n + 1}.html", "Next »", rel="next"))
        p.add("</p>\n")
        w.finish(p)

    # Artist pages, paginated when an artist has more songs than a page holds.
    for a in range(n_artists):
        ids = by_artist[a]
        n_pages = (len(ids) + page_size - 1) // page_size
        albums = [al + 1 for al in range(len(album_names)) if album_artist[al] == a]
        for n in range(1, n_pages + 1):
            p = w.page(artist_path(a, n), artist_names[a])
            p.add(f"<h1>{_e(artist_names[a])}</h1>\n<h2>Albums</h2>\n<ul>\n")
            for al in albums:
                p.add(f"<li>{p.a(album_path(al), album_names[al - 1])}</li>\n")
            p.add("</ul>\n<h2>Songs</h2>\n<ul>\n")
            for sid in ids[(n - 1) * page_size:n * page_size]:
                p.add(song_line(p, all_songs[sid - 1]))
            p.add("</ul>\n")
            if n > 1:
                p.add(p.a(artist_path(a, n - 1), "« Prev", rel="prev"), " ")
            if n < n_pages:
                p.add(p.a(artist_path(a, n + 1), "Next »", rel="next"))
            w.finish(p)

    # Album pages.
    for al, ids in enumerate(album_songs, start=1):
        a = album_artist[al - 1]
        p = w.page(album_path(al), album_names[al - 1])
        p.add(f"<h1>{_e(album_names[al - 1])}</h1>\n<p>by {p.a(artist_path(a), artist_names[a])}</p>\n",
              '<img src="/img/cover.png" alt="cover">\n<ol>\n')
        for sid in ids:
            p.add(song_line(p, all_songs[sid - 1]))
        p.add("</ol>\n")
        w.finish(p)

    # Song pages and their audio.
    expected: list[ExpectedAudio] = []
    playlist_count = 0
    removed = 0
    for s in all_songs:
        title, artist, album = s.title, artist_names[s.artist], album_names[s.album - 1]
        style = STYLES[(s.id - 1) % len(STYLES)]
        if style == "embed" and ((s.id - 1) // len(STYLES)) % 2:
            style = "object"
        ext = {"link": ".mp3", "audio-src": ".ogg", "audio-source": ".m4a", "data-attr": ".flac",
               "script-object": ".wav", "json-block": ".aac", "embed": ".wma", "object": ".mp3",
               "stream": ".mp3", "playlist": ".mp3"}[style]
        size = large_size if s.id in large_ids else rng.randint(audio_size // 2, audio_size * 3 // 2)
        data = _AUDIO_BUILDERS[ext](rng, size, title, artist, album)
        media_url = f"/stream/{s.id}" if style == "stream" else f"/media/{s.id}{ext}"
        w.put(media_url, data)

        ld = {"@context": "https://schema.org", "@type": "MusicRecording", "name": title,
              "byArtist": {"@type": "MusicGroup", "name": artist},
              "inAlbum": {"@type": "MusicAlbum", "name": album},
              "duration": f"PT{s.duration // 60}M{s.duration % 60}S"}
        head = [f'<meta property="og:title" content="{_e(title)}">\n',
                f'<meta property="music:musician" content="{_e(artist)}">\n',
                '<meta property="og:type" content="music.song">\n',
                f'<script type="application/ld+json">{_js(ld)}</script>\n']
        p = w.page(s.page, f"{title} - {artist}", head=head)
        p.add(f"<h1>{_e(title)}</h1>\n<p class=\"by\">by {p.a(artist_path(s.artist), artist)} ",
              f"from {p.a(album_path(s.album), album)} &middot; {_duration_text(s.duration)}</p>\n")
        meta_attrs = f'data-title="{_e(title)}" data-artist="{_e(artist)}"'
        playlist = None
        if style == "link":
            audio = f'<a href="{p.link(media_url)}" {meta_attrs}>Download</a>'
        elif style == "audio-src":
            audio = f'<audio src="{p.link(media_url)}" controls {meta_attrs}></audio>'
        elif style == "audio-source":
            audio = (f'<audio controls {meta_attrs}><source src="{p.link(media_url)}" type="audio/mp4">'
                     "Your browser does not play audio.</audio>")
        elif style == "data-attr":
            audio = f'<div class="player" data-audio="{p.link(media_url)}" {meta_attrs}></div>'
        elif style == "script-object":
            p.link(media_url)
            obj = _js({"file": media_url, "title": title, "artist": artist})
            audio = f'<div id="player"></div>\n<script>\nvar player = {obj};\nstartPlayer("player", player);\n</script>'
        elif style == "json-block":
            p.link(media_url)
            blob = _js({"song": {"url": media_url, "title": title, "artist": artist, "album": album,
                                 "duration": s.duration}})
            audio = f'<script type="application/json" id="song-data">{blob}</script>'
        elif style == "embed":
            audio = f'<embed src="{p.link(media_url)}" type="audio/x-ms-wma" {meta_attrs}>'
        elif style == "object":
            audio = f'<object data="{p.link(media_url)}" type="audio/mpeg" {meta_attrs}></object>'
        elif style == "stream":
            audio = p.a(media_url, "Listen", data_title=title, data_artist=artist)
        else:
            playlist_count += 1
            pext = ".pls" if playlist_count % 4 == 0 else ".m3u"
            playlist = f"/playlists/{s.id}{pext}"
            if pext == ".m3u":
                body = f"#EXTM3U\n#EXTINF:{s.duration},{artist} - {title}\n{media_url}\n"
            else:
                body = (f"[playlist]\nFile1={media_url}\nTitle1={artist} - {title}\nLength1={s.duration}\n"
                        "NumberOfEntries=1\nVersion=2\n")
            w.put(playlist, body.encode("utf-8"))
            audio = p.a(playlist, "Playlist")
        p.add(f'<section class="audio">\n{audio}\n</section>\n')
        expected.append(ExpectedAudio(url=media_url, page=s.page, title=title, artist=artist, album=album,
                                      style=style, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                                      duration=s.duration, playlist=playlist))
        p.add("<p class=\"around\">")
        if s.id > 1:
            p.add(p.a(all_songs[s.id - 2].page, "Previous song"), " ")
        if s.id < songs:
            p.add(p.a(all_songs[s.id].page, "Next song"))
        p.add("</p>\n")
        if s.id % 97 == 0:
            removed += 1
            p.add("<p>Also try: ", broken(p, f"/song/removed-{removed}.html", "a removed song"), "</p>\n")
        if s.id % 50 == 0:
            p.add("<p>", away(p, f"{OFFSITE_ORIGIN}/buy/{s.id}", "Buy this song elsewhere"), "</p>\n")
        w.finish(p)

    # Pages reached only through redirects.
    p = w.page("/charts.html", "Charts")
    p.add("<h1>Top songs</h1>\n<ol>\n")
    for s in all_songs[:10]:
        p.add(song_line(p, s))
    p.add("</ol>\n")
    w.finish(p)
    p = w.page("/news/", "News")
    p.add("<h1>News</h1>\n<p>New this week: ",
          ", ".join(p.a(s.page, s.title) for s in all_songs[-3:]), ".</p>\n")
    w.finish(p)
    redirects["/r/blog"] = Redirect("/news/", 302)

    # Help, about and friends: no audio, but the things that look like it.
    p = w.page("/about.html", "About")
    p.add('<h1>About Demo Music</h1>\n<img src="/img/logo.png" alt="logo">\n',
          '<video controls width="320"><source src="/video/intro.mp4" type="video/mp4"></video>\n',
          "<p>Most tracks download as .mp3; a few are .flac or .wav. A file called my-song.mp3 plays anywhere, "
          "and audio/mpeg is the type your browser sees.</p>\n<p>Old links keep working: ")
    for s in all_songs[:3]:
        p.add(moved(p, f"/old/song/{s.id}.html", s.page, 301, s.title), " ")
    p.add("</p>\n<p>", p.a("/stores.html", "Where to buy"), " &middot; ",
          broken(p, "/help/old-faq.html", "the old FAQ"), " &middot; ",
          away(p, f"{OFFSITE_ORIGIN}/press", "Press"), "</p>\n")
    w.finish(p)

    p = w.page("/help.html", "Help")
    p.add("<h1>Help</h1>\n<p>Files named like track01.wav or song.m4a are audio. Playlists (.m3u, .pls) list "
          "songs.</p>\n<img src=\"/img/logo.png\" alt=\"\" usemap=\"#m\">\n<map name=\"m\">",
          f'<area shape="rect" coords="0,0,8,8" href="{p.link("/contact.html")}" alt="Contact">', "</map>\n",
          f'<iframe src="{p.link("/widgets/newsletter.html")}" title="newsletter"></iframe>\n',
          "<p>", away(p, f"{OFFSITE_ORIGIN}/support?topic=audio", "Support forum"), "</p>\n")
    w.finish(p)

    for path, title, text in (("/contact.html", "Contact", "Write to us. We answer within a week."),
                              ("/stores.html", "Stores", "Our songs are sold in many places."),
                              ("/widgets/newsletter.html", "Newsletter", "Sign up for the weekly mail.")):
        p = w.page(path, title, nav=path != "/widgets/newsletter.html")
        p.add(f"<h1>{title}</h1>\n<p>{text}</p>\n")
        w.finish(p)

    # The robots-protected corner.
    p = w.page("/private/index.html", "Staff")
    p.add("<h1>Staff only</h1>\n<p>", p.a("/private/unreleased.html", "Unreleased"), "</p>\n")
    w.finish(p)
    p = w.page("/private/unreleased.html", "Unreleased")
    p.add("<h1>Unreleased</h1>\n<p>Nothing to see yet.</p>\n")
    w.finish(p)

    # Home.
    p = w.page(HOME, "Home", head=['<meta name="description" content="Songs, artists and albums">\n'])
    p.add("<h1>Demo Music</h1>\n<h2>Latest songs</h2>\n<ul>\n")
    for s in all_songs[:10]:
        p.add(song_line(p, s))
    p.add("</ul>\n<h2>Browse</h2>\n<p>", p.a("/list/1.html", "All songs"), " &middot; ",
          p.a("/artists/1.html", "All artists"), " &middot; ",
          moved(p, "/songs.html", "/list/1.html", 301, "Songs (old address)"), " &middot; ",
          moved(p, "/top.html", "/charts.html", 302, "Charts"), " &middot; ",
          moved(p, "/blog.html", "/r/blog", 301, "News"), "</p>\n<p>",
          p.a("/help.html", "Help"), " &middot; ", p.a("/private/index.html", "Staff"), " &middot; ",
          broken(p, "/events.html", "Events"), " &middot; ",
          away(p, f"{OFFSITE_ORIGIN}/", "Our label"), "</p>\n")
    w.finish(p)

    # Assets.
    w.put("/img/logo.png", _png((200, 40, 60)))
    w.put("/img/cover.png", _png((40, 90, 200)))
    w.put("/video/intro.mp4", _mp4_video(rng, 6000))
    w.put("/static/site.css", b"body{font-family:sans-serif;max-width:48em;margin:auto}nav{margin:1em 0}\n")
    w.put("/robots.txt", f"User-agent: *\nDisallow: {PRIVATE_PREFIX}\n".encode())

    # The link graph, walked from home the way a scoped crawler does.
    depth, robots, seen_404 = _walk(w.pages, redirects)
    assert seen_404 == not_found, (seen_404 ^ not_found)
    assert not set(w.pages) - set(depth) - robots, "unreachable pages"

    manifest = Manifest(
        seed=seed, songs=songs, home=HOME, pages=tuple(sorted(depth)), depth=dict(sorted(depth.items())),
        not_found=tuple(sorted(not_found)), redirects=dict(sorted(redirects.items())),
        offsite=tuple(sorted(offsite)), robots_disallowed=tuple(sorted(robots)), audio=tuple(expected),
        large=tuple(e.url for e in expected if e.size >= large_size and e.page in large_pages),
        extra={"artists": n_artists, "albums": len(album_names), "page_size": page_size})
    w.put("/" + REDIRECTS_FILE, _json_bytes({k: {"location": r.location, "status": r.status}
                                             for k, r in manifest.redirects.items()}))
    w.put("/" + NGINX_FRAGMENT_FILE, nginx_fragment(manifest.redirects).encode())
    w.put("/" + MANIFEST_FILE, _json_bytes(manifest.to_json()))
    return manifest


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, indent=1, sort_keys=True) + "\n").encode("utf-8")


def _walk(pages: Mapping[str, _Page], redirects: Mapping[str, Redirect]
          ) -> tuple[dict[str, int], set[str], set[str]]:
    """BFS from home over the recorded links: (reachable page -> depth, robots-excluded pages, 404 paths).

    The first pass is what a robots-obeying crawler reaches; the second starts at the disallowed pages it skipped
    and collects what only they lead to."""
    missing: set[str] = set()
    skipped: set[str] = set()

    def targets(cur: str) -> Iterable[str]:
        for href in pages[cur].links:
            if not href.startswith("/"):
                continue
            hops = 0
            while href in redirects and hops < 10:
                href = redirects[href].location
                hops += 1
            if not href.endswith((".html", "/")):
                continue   # audio, playlists, streams and other assets are not pages
            if href not in pages:
                missing.add(href)
                continue
            yield href

    depth = {HOME: 0}
    queue = deque([HOME])
    while queue:
        cur = queue.popleft()
        for href in targets(cur):
            if href.startswith(PRIVATE_PREFIX):
                skipped.add(href)
            elif href not in depth:
                depth[href] = depth[cur] + 1
                queue.append(href)
    robots = set(skipped)
    queue = deque(sorted(skipped))
    while queue:
        for href in targets(queue.popleft()):
            if href not in depth and href not in robots:
                robots.add(href)
                queue.append(href)
    return depth, robots, missing


def nginx_fragment(redirects: Mapping[str, Redirect]) -> str:
    """Location rules that make nginx serve the site like scripts/siteserver.py: include inside a server block
    whose root is the site directory."""
    types = " ".join(f"{ct.split(';')[0]} {ext[1:]};" for ext, ct in sorted(CONTENT_TYPES.items()))
    lines = [
        "# Generated by scripts/sitegen.py. Include inside: server { root /path/to/site; include this; }",
        "index index.html;",
        "charset utf-8;",
        "absolute_redirect off;",
        f"types {{ {types} }}",
        "default_type application/octet-stream;",
        "# Extensionless stream files are MP3.",
        f"location {STREAM_PREFIX} {{ types {{ }} default_type {STREAM_CONTENT_TYPE}; }}",
        "# Generator bookkeeping is not part of the site.",
        "location ~ ^/(_|manifest\\.json$|nginx\\.conf\\.fragment$) { return 404; }",
    ]
    for src, r in redirects.items():
        lines.append(f"location = {src} {{ return {r.status} {r.location}; }}")
    return "\n".join(lines) + "\n"


def nginx_config(site_dir: Path, port: int, run_dir: Path) -> str:
    """A complete nginx.conf serving site_dir on 127.0.0.1:port, for `nginx -p RUN_DIR -c FILE` (benchmarks)."""
    site_dir, run_dir = Path(site_dir).resolve(), Path(run_dir).resolve()
    # Started as root, nginx drops its workers to "nobody", who cannot read a site under a private temporary
    # directory (pytest's are mode 700); keep the invoking user instead. Ignored when not started as root.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"{user}daemon off;\nworker_processes 1;\npid {run_dir}/nginx.pid;\nerror_log {run_dir}/error.log warn;\n"
            "events { worker_connections 4096; }\n"
            f"http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 100000;\n"
            f"  client_body_temp_path {run_dir}/tmp; proxy_temp_path {run_dir}/tmp;\n"
            f"  fastcgi_temp_path {run_dir}/tmp; uwsgi_temp_path {run_dir}/tmp; scgi_temp_path {run_dir}/tmp;\n"
            f"  server {{\n    listen 127.0.0.1:{port};\n    root {site_dir};\n"
            f"    include {site_dir}/{NGINX_FRAGMENT_FILE};\n  }}\n}}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate the demo music site.")
    ap.add_argument("out_dir", type=Path, help="where to write the site (absent or empty, or see --replace)")
    ap.add_argument("--songs", type=int, default=1000, help="song pages to generate (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=7,
                    help="random seed: the same seed makes the same site (default: %(default)s)")
    ap.add_argument("--artists", type=int, default=None,
                    help="artists the songs are spread over (default: about one per 10 songs)")
    ap.add_argument("--page-size", type=int, default=20,
                    help="songs per listing page; fewer makes the site deeper (default: %(default)s)")
    ap.add_argument("--audio-size", type=int, default=4096,
                    help="typical audio file size in bytes (default: %(default)s)")
    ap.add_argument("--large-files", type=int, default=3,
                    help="audio files made --large-mb big, to exercise resumable downloads (default: %(default)s)")
    ap.add_argument("--large-mb", type=float, default=2.0,
                    help="size of each large file in MiB (default: %(default)s)")
    ap.add_argument("--replace", action="store_true", help="regenerate over an earlier generated site")
    a = ap.parse_args(argv)
    try:
        m = generate(a.out_dir, songs=a.songs, seed=a.seed, artists=a.artists, page_size=a.page_size,
                     audio_size=a.audio_size, large_files=a.large_files, large_size=int(a.large_mb * 1024 * 1024),
                     replace=a.replace)
    except (FileExistsError, ValueError) as e:
        print(f"sitegen: {e}", file=sys.stderr)
        return 2
    print(f"{a.out_dir}: {len(m.pages)} pages (max depth {m.max_depth}), {len(m.audio)} audio items, "
          f"{len(m.large)} large, {len(m.redirects)} redirects, {len(m.not_found)} broken links, "
          f"{len(m.offsite)} off-site links, {len(m.robots_disallowed)} robots-disallowed pages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
