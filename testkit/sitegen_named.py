"""A variant of the demo site for metadata and new sources: names only as plain text, feeds, sitemaps.

Every song page shows its title and artist only as text in named elements (<h1 class="title">,
<span class="artist">): no data-* attributes, no JSON-LD, no Open Graph. Every third song's audio link has no
extension (the file is identified by its first bytes). The album is said nowhere but in the file's own tags.
A third of the song pages are linked from no page at all: only the sitemap (robots.txt -> a sitemap index ->
a gzip sitemap) leads to them. A podcast feed (RSS 2.0, announced by <link rel="alternate">) carries episodes
as enclosures, and an Atom feed links more.

    manifest = generate_named(out_dir, songs=150, write_audio=my_writer)

write_audio(path, kind, title, artist, album) writes one audio file (kind: mp3, ogg, flac, m4a); by default
the demo generator's own builders are used.
"""

from __future__ import annotations

import argparse
import gzip
import html
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from testkit import sitegen
except ImportError:   # run as a file: its own directory is on sys.path, the repository root may not be
    import sitegen  # type: ignore[no-redef]

KINDS = ("mp3", "ogg", "flac", "m4a")
PODCAST = "/podcast.xml"
ATOM = "/news.atom"
SITEMAP_INDEX = "/sitemap-index.xml"
SITEMAP_GZ = "/sitemaps/songs.xml.gz"
SITEMAP_PLAIN = "/sitemaps/pages.xml"


@dataclass(frozen=True)
class NamedSong:
    url: str          # site-relative audio URL
    page: str         # the song page
    title: str
    artist: str
    album: str
    kind: str
    extensionless: bool
    sitemap_only: bool


@dataclass(frozen=True)
class Episode:
    url: str
    title: str
    show: str
    published: str    # ISO 8601 as the catalogue should record it
    duration: int
    description: str


@dataclass
class NamedManifest:
    songs: list[NamedSong] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    sitemap_lastmod: dict[str, str] = field(default_factory=dict)   # page -> lastmod


def _default_writer(path: Path, kind: str, title: str, artist: str, album: str) -> None:
    ext = {"mp3": ".mp3", "ogg": ".ogg", "flac": ".flac", "m4a": ".m4a"}[kind]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(sitegen._AUDIO_BUILDERS[ext](random.Random(title), 30_000, title, artist, album))


def generate_named(out_dir: Path, *, songs: int = 150, seed: int = 11,
                   write_audio: Callable[[Path, str, str, str, str], None] | None = None) -> NamedManifest:
    rng = random.Random(seed)
    write = write_audio or _default_writer
    out_dir.mkdir(parents=True, exist_ok=True)
    e = html.escape
    manifest = NamedManifest()
    listed: list[NamedSong] = []
    for i in range(1, songs + 1):
        title = f"{sitegen._title(rng, i)} {i}"
        artist = sitegen._artist_name(rng, i % 37)
        album = sitegen._album_name(rng, i % 23)
        kind = KINDS[i % len(KINDS)]
        extensionless = i % 3 == 0
        url = f"/get/{i}" if extensionless else f"/audio/{i}.{kind}"
        song = NamedSong(url=url, page=f"/song/{i}.html", title=title, artist=artist, album=album, kind=kind,
                         extensionless=extensionless, sitemap_only=i % 3 == 1)
        write(out_dir / url.lstrip("/"), kind, title, artist, album)
        # Two layouts: the link inside the song's box, or in a player box beside it.
        if i % 2:
            main = (f'<div class="song-info"><h1 class="title">{e(title)}</h1>\n'
                    f'<p>by <span class="artist">{e(artist)}</span></p>\n'
                    f'<a href="{url}">Download</a></div>')
        else:
            main = (f'<div class="song-info"><h1 class="title">{e(title)}</h1>\n'
                    f'<div class="meta">Artist: <span class="artist">{e(artist)}</span></div></div>\n'
                    f'<div class="player"><a href="{url}">Listen</a></div>')
        page = ("<!doctype html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>Song {i} | Named Music</title></head>\n<body>\n"
                '<header><div class="logo">Named Music</div><a href="/">Home</a></header>\n'
                f"{main}\n<footer>Named Music</footer></body></html>\n")
        (out_dir / "song").mkdir(exist_ok=True)
        (out_dir / "song" / f"{i}.html").write_text(page, "utf-8")
        manifest.songs.append(song)
        if not song.sitemap_only:
            listed.append(song)
        else:
            manifest.sitemap_lastmod[song.page] = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}"

    # The list page links only the songs the sitemap does not carry alone.
    rows = "".join(f'<li><a href="{s.page}">{e(s.title)}</a></li>\n' for s in listed)
    (out_dir / "index.html").write_text(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Named Music</title>\n"
        f'<link rel="alternate" type="application/rss+xml" title="Podcast" href="{PODCAST}">\n'
        f'<link rel="alternate" type="application/atom+xml" title="News" href="{ATOM}">\n'
        f"</head><body><h1>Songs</h1><ul>\n{rows}</ul></body></html>\n", "utf-8")

    # The podcast: RSS 2.0 with iTunes tags; enclosures are the audio.
    show = "The Named Show"
    items = []
    for n in range(1, 7):
        kind = KINDS[n % len(KINDS)]
        url = f"/episodes/{n}.{kind}"
        write(out_dir / url.lstrip("/"), kind, f"Episode {n} file", show, show)
        ep = Episode(url=url, title=f"Episode {n}: talk {n}", show=show, published=f"2024-03-{n:02d}T10:00:00+00:00",
                     duration=600 + n * 60, description=f"We talk about thing {n}.")
        manifest.episodes.append(ep)
        items.append(
            f"<item><title>{e(ep.title)}</title>"
            f"<description><![CDATA[<p>{e(ep.description)}</p>]]></description>"
            f"<pubDate>{['Fri', 'Sat', 'Sun', 'Mon', 'Tue', 'Wed'][n - 1]}, {n:02d} Mar 2024 10:00:00 +0000</pubDate>"
            f'<enclosure url="{url}" length="30000" type="audio/{"mpeg" if kind == "mp3" else kind}"/>'
            f"<itunes:duration>{ep.duration // 60}:{ep.duration % 60:02d}</itunes:duration></item>\n")
    (out_dir / PODCAST.lstrip("/")).write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd"><channel>'
        f"<title>{show}</title><link>/</link><description>A show about names.</description>\n"
        + "".join(items) + "</channel></rss>\n", "utf-8")
    # An Atom feed whose entries link audio with rel="enclosure".
    entries = []
    for n in range(7, 10):
        url = f"/episodes/{n}.mp3"
        write(out_dir / url.lstrip("/"), "mp3", f"Episode {n} file", "News desk", "News desk")
        ep = Episode(url=url, title=f"Bulletin {n}", show="Named News", published=f"2024-04-{n:02d}T08:30:00+00:00",
                     duration=0, description=f"Bulletin number {n}.")
        manifest.episodes.append(ep)
        entries.append(f"<entry><title>{e(ep.title)}</title><id>urn:bulletin:{n}</id>"
                       f"<published>{ep.published}</published><summary>{e(ep.description)}</summary>"
                       f'<link rel="enclosure" type="audio/mpeg" href="{url}"/></entry>\n')
    (out_dir / ATOM.lstrip("/")).write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<feed xmlns="http://www.w3.org/2005/Atom">'
        "<title>Named News</title><id>urn:named-news</id>\n" + "".join(entries) + "</feed>\n", "utf-8")

    # Sitemaps hold absolute URLs: write_sitemaps() writes them, and robots.txt, once the origin is known.
    return manifest


def write_sitemaps(out_dir: Path, origin: str, manifest: NamedManifest) -> None:
    """robots.txt names the sitemap index; the index names a gzip sitemap (the songs only it leads to) and a
    plain one. Sitemaps hold absolute URLs, so they are written once the server's origin is known."""
    ns = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
    urls = "".join(f"<url><loc>{origin}{page}</loc><lastmod>{lastmod}</lastmod></url>\n"
                   for page, lastmod in manifest.sitemap_lastmod.items())
    songs = f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {ns}>\n{urls}</urlset>\n'
    (out_dir / "sitemaps").mkdir(exist_ok=True)
    (out_dir / SITEMAP_GZ.lstrip("/")).write_bytes(gzip.compress(songs.encode(), mtime=0))
    (out_dir / SITEMAP_PLAIN.lstrip("/")).write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {ns}><url><loc>{origin}/</loc></url></urlset>\n', "utf-8")
    (out_dir / SITEMAP_INDEX.lstrip("/")).write_text(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {ns}>'
        f"<sitemap><loc>{origin}{SITEMAP_GZ}</loc></sitemap>"
        f"<sitemap><loc>{origin}{SITEMAP_PLAIN}</loc><lastmod>2024-01-01</lastmod></sitemap></sitemapindex>\n",
        "utf-8")
    (out_dir / "robots.txt").write_text(f"User-agent: *\nDisallow: /private/\nSitemap: {origin}{SITEMAP_INDEX}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate the named-metadata music site (names as text only, feeds, "
                                             "sitemaps; see the module's docstring).")
    ap.add_argument("out_dir", type=Path, help="where to write the site (created if missing)")
    ap.add_argument("--songs", type=int, default=150, help="song pages to generate (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=11, help="random seed: the same seed makes the same site "
                                                        "(default: %(default)s)")
    ap.add_argument("--origin", default=None, metavar="URL",
                    help="the origin the site will be served from (http://127.0.0.1:8080): writes the sitemaps "
                         "and robots.txt, which hold absolute URLs")
    a = ap.parse_args(argv)
    if a.songs < 1:
        ap.error("--songs must be at least 1")
    m = generate_named(a.out_dir, songs=a.songs, seed=a.seed)
    if a.origin:
        write_sitemaps(a.out_dir, a.origin.rstrip("/"), m)
    print(f"{a.out_dir}: {len(m.songs)} songs ({sum(s.sitemap_only for s in m.songs)} only in the sitemap), "
          f"{len(m.episodes)} feed episodes{'' if a.origin else '; no sitemaps (give --origin)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
