"""A site whose song pages name their song in the heading and the <title> only, and link its audio the ways that
tell nothing by their name: an extension-less stream (/stream/N, served as audio/mpeg by scripts/siteserver.py,
with Range), an .m3u or .pls playlist listing such a stream or a named file, or a named file behind a terse
download label in one of the crawl's languages. No file carries tags, so every title comes from the song page.

generate() writes the files for siteserver.start() and returns what a crawl must find.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from html import escape
from pathlib import Path

# The labels sites put on the link instead of the song's name.
LABELS = ("Download", "下载", "MP3", "Listen", "Play", "Télécharger", "Descargar", "320kbps", "Click here",
          "Скачать mp3", "ダウンロード", "Baixar música", "Jetzt anhören", "点击下载", "Download MP3 (3.5 MB)")
# How each song page links its audio.
KINDS = ("stream", "stream-small", "m3u-stream", "pls-stream", "named", "m3u-named")
_WORDS = ("Amber", "Silent", "Northern", "Velvet", "Paper", "Golden", "Hollow", "Crimson")
_NOUNS = ("Harbour", "Lanterns", "Orchard", "Meridian", "Tide", "Avenue", "Comet", "Garden")

FRAME = 417          # bytes of one MPEG-1 layer III frame at 128 kbit/s, 44.1 kHz


@dataclass(frozen=True)
class Song:
    page: str           # site-relative
    audio: str          # the address the catalogue lists it under
    title: str
    artist: str
    kind: str
    label: str
    size: int
    playlist: str | None = None


def mp3(rng: random.Random, size: int) -> bytes:
    """An untagged MP3 of about `size` bytes: frame headers a sniffer knows, noise for the rest."""
    frames = max(1, size // FRAME)
    return b"".join(b"\xff\xfb\x90\x64" + rng.randbytes(FRAME - 4) for _ in range(frames))


def generate(root: Path, songs: int = 24, seed: int = 3) -> list[Song]:
    rng = random.Random(seed)
    out: list[Song] = []
    rows = []
    for n in range(1, songs + 1):
        kind = KINDS[(n - 1) % len(KINDS)]
        label = LABELS[(n - 1) % len(LABELS)]
        title = f"{_WORDS[n % len(_WORDS)]} {_NOUNS[(n * 3) % len(_NOUNS)]} {n}"
        artist = f"Singer {chr(ord('A') + n % 7)}"
        page = f"/song/{n}.html"
        # Larger than a page fetch reads of audio (64 KiB), except the small stream, which one read holds whole.
        size = rng.randint(20_000, 40_000) if kind == "stream-small" else rng.randint(150_000, 260_000)
        data = mp3(rng, size)
        named = kind in ("named", "m3u-named")
        audio = f"/media/{n}.mp3" if named else f"/stream/{n}"
        _put(root, audio, data)
        playlist = None
        if kind in ("m3u-stream", "m3u-named"):
            playlist = f"/playlists/{n}.m3u"
            _put(root, playlist, f"#EXTM3U\n{audio}\n".encode())
        elif kind == "pls-stream":
            playlist = f"/playlists/{n}.pls"
            _put(root, playlist, f"[playlist]\nFile1={audio}\nNumberOfEntries=1\nVersion=2\n".encode())
        href = playlist or audio
        body = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{escape(title)} – {escape(artist)}"
                f" | Stream Site</title></head>\n<body><nav><a href=\"/\">Home</a> <a href=\"/about.html\">About</a>"
                f"</nav>\n<h1>{escape(title)}</h1>\n<p>by <span class=\"artist\">{escape(artist)}</span></p>\n"
                f"<p class=\"get\"><a href=\"{href}\">{escape(label)}</a></p>\n"
                f"<p><a href=\"/song/{n % songs + 1}.html\">Next</a></p></body></html>\n")
        _put(root, page, body.encode())
        rows.append(f'<li><a href="{page}">{escape(title)}</a></li>')
        out.append(Song(page, audio, title, artist, kind, label, len(data), playlist))
    index = ("<!doctype html>\n<html><head><title>Stream Site</title></head><body><h1>All songs</h1>\n<ul>"
             + "\n".join(rows) + "</ul>\n<a href=\"/about.html\">About</a></body></html>\n")
    _put(root, "/index.html", index.encode())
    _put(root, "/about.html", b"<!doctype html><html><head><title>About</title></head><body><h1>About</h1>"
                              b"<a href=\"/\">Home</a></body></html>")
    return out


def _put(root: Path, path: str, data: bytes) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
