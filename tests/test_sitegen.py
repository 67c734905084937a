"""The demo site generator: determinism, the embedding styles, metadata, file formats, and a manifest that agrees
with an independent walk over the generated HTML."""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import sys
from collections import deque
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from protego import Protego
from selectolax.lexbor import LexborHTMLParser as HTMLParser

from testkit import sitegen
from testkit.sitegen import MANIFEST_STYLES, Manifest

REPO = Path(__file__).resolve().parent.parent
SMALL = {"songs": 120, "seed": 11, "page_size": 7, "audio_size": 1500, "large_files": 2, "large_size": 120_000}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, **SMALL)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _file(root: Path, path: str) -> Path:
    return root / (path.lstrip("/") + ("index.html" if path.endswith("/") else ""))


def _html(root: Path, path: str) -> HTMLParser:
    return HTMLParser(_file(root, path).read_text("utf-8"))


def test_same_seed_gives_byte_identical_sites(tmp_path: Path) -> None:
    a = sitegen.generate(tmp_path / "a", **SMALL)
    b = sitegen.generate(tmp_path / "b", **SMALL)
    ta, tb = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert len(ta) > 300
    assert ta == tb
    assert a == b
    # The validators the servers derive from mtime and size are reproducible too.
    assert (tmp_path / "a/index.html").stat().st_mtime == (tmp_path / "b/index.html").stat().st_mtime
    other = sitegen.generate(tmp_path / "c", **{**SMALL, "seed": 12})
    assert _tree(tmp_path / "c") != ta
    assert other.audio != a.audio


def test_manifest_file_round_trips(site: tuple[Path, Manifest]) -> None:
    root, m = site
    assert Manifest.load(root) == m
    raw = json.loads((root / "manifest.json").read_text("utf-8"))
    assert raw["max_depth"] == m.max_depth
    assert set(raw["audio"][0]) >= {"url", "page", "title", "artist", "album", "style", "size", "sha256"}


def test_every_style_is_used_many_times(site: tuple[Path, Manifest]) -> None:
    _, m = site
    counts = {s: sum(1 for a in m.audio if a.style == s) for s in MANIFEST_STYLES}
    assert all(n >= 6 for n in counts.values()), counts
    assert any(a.playlist and a.playlist.endswith(".pls") for a in m.audio)
    assert any(a.playlist and a.playlist.endswith(".m3u") for a in m.audio)


def test_default_site_rotates_styles_evenly_and_generates_quickly(tmp_path: Path) -> None:
    t0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    m = sitegen.generate(tmp_path / "big")
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - t0
    # User CPU time: a busy disk or a loaded machine must not fail the test. Wall time is about 0.6 s on the
    # idle 2-core build machine, of which user time about 0.3 s.
    assert cpu < 1.5, cpu
    assert len(m.audio) == 1000 and len(m.large) == 3
    assert all(sum(1 for a in m.audio if a.style == s) >= 50 for s in MANIFEST_STYLES)
    assert m.max_depth <= 5   # within the crawler's default depth limit


def test_each_style_is_embedded_as_specified(site: tuple[Path, Manifest]) -> None:
    root, m = site
    for item in m.audio:
        tree = _html(root, item.page)
        if item.style == "link":
            node = tree.css_first(f'a[href="{item.url}"]')
            assert node is not None and node.text() == "Download"
        elif item.style == "audio-src":
            node = tree.css_first(f'audio[src="{item.url}"]')
        elif item.style == "audio-source":
            node = tree.css_first(f'audio source[src="{item.url}"]')
            assert node is not None and node.attributes["type"] == "audio/mp4"
            node = node.parent
        elif item.style == "data-attr":
            node = tree.css_first(f'div.player[data-audio="{item.url}"]')
        elif item.style == "embed":
            node = tree.css_first(f'embed[src="{item.url}"]')
        elif item.style == "object":
            node = tree.css_first(f'object[data="{item.url}"]')
        elif item.style == "script-object":
            script = next(s.text() for s in tree.css("script") if "var player" in s.text())
            literal = script.split("var player = ", 1)[1].split(";\n", 1)[0]
            obj = json.loads(literal)
            assert obj == {"file": item.url, "title": item.title, "artist": item.artist}
            continue
        elif item.style == "json-block":
            blob = json.loads(tree.css_first('script#song-data[type="application/json"]').text())
            assert blob["song"]["url"] == item.url
            assert (blob["song"]["title"], blob["song"]["artist"]) == (item.title, item.artist)
            continue
        elif item.style == "stream":
            assert item.url.startswith("/stream/") and "." not in item.url.rsplit("/", 1)[1]
            node = tree.css_first(f'a[href="{item.url}"]')
        else:
            assert item.style == "playlist"
            assert tree.css_first(f'a[href="{item.playlist}"]') is not None
            text = _file(root, item.playlist).read_text("utf-8")
            if item.playlist.endswith(".m3u"):
                assert text.splitlines() == ["#EXTM3U", f"#EXTINF:{item.duration},{item.artist} - {item.title}",
                                             item.url]
            else:
                assert f"File1={item.url}\n" in text and f"Title1={item.artist} - {item.title}\n" in text
            continue
        assert node is not None, (item.style, item.page)
        assert node.attributes.get("data-title") == item.title
        assert node.attributes.get("data-artist") == item.artist


def test_song_pages_carry_the_metadata_convention(site: tuple[Path, Manifest]) -> None:
    root, m = site
    for item in m.audio:
        tree = _html(root, item.page)
        ld = json.loads(tree.css_first('script[type="application/ld+json"]').text())
        assert ld["@context"] == "https://schema.org" and ld["@type"] == "MusicRecording"
        assert (ld["name"], ld["byArtist"]["name"], ld["inAlbum"]["name"]) == (item.title, item.artist, item.album)
        assert ld["byArtist"]["@type"] == "MusicGroup"
        assert tree.css_first('meta[property="og:title"]').attributes["content"] == item.title
        assert tree.css_first('meta[property="music:musician"]').attributes["content"] == item.artist
    assert any(any(ord(c) > 0x2E80 for c in a.title) for a in m.audio), "no CJK title"
    assert any(any(0xC0 <= ord(c) <= 0x17F for c in a.title + a.artist) for a in m.audio), "no accented name"


MAGIC = {
    ".mp3": lambda b: b.startswith(b"ID3\x03"),
    ".ogg": lambda b: b.startswith(b"OggS"),
    ".flac": lambda b: b.startswith(b"fLaC"),
    ".wav": lambda b: b[:4] == b"RIFF" and b[8:12] == b"WAVE",
    ".m4a": lambda b: b[4:12] == b"ftypM4A ",
    ".wma": lambda b: b.startswith(bytes.fromhex("3026B2758E66CF11A6D900AA0062CE6C")),
    ".aac": lambda b: b[0] == 0xFF and b[1] & 0xF6 == 0xF0,
}


def _id3_text(data: bytes, frame_id: bytes) -> str:
    pos = 10
    end = 10 + ((data[6] << 21) | (data[7] << 14) | (data[8] << 7) | data[9])
    while pos < end:
        fid, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "big")
        payload = data[pos + 10:pos + 10 + size]
        if fid == frame_id:
            return payload[1:].decode("latin-1" if payload[0] == 0 else "utf-16")
        pos += 10 + size
    raise KeyError(frame_id)


def test_audio_files_are_real_looking_and_match_the_manifest(site: tuple[Path, Manifest]) -> None:
    root, m = site
    for item in m.audio:
        data = _file(root, item.url).read_bytes()
        assert len(data) == item.size and hashlib.sha256(data).hexdigest() == item.sha256
        ext = ".mp3" if item.url.startswith("/stream/") else Path(item.url).suffix
        assert MAGIC[ext](data), item.url
        if ext == ".mp3":
            # The ID3 tag is how an extensionless stream is identified and named.
            assert _id3_text(data, b"TIT2") == item.title
            assert _id3_text(data, b"TPE1") == item.artist
            assert _id3_text(data, b"TALB") == item.album
    sizes = sorted(a.size for a in m.audio)
    assert sizes[-1] >= 120_000 and sizes[-3] < 5_000   # two large files, the rest a few KB
    assert {a.url for a in m.audio if a.size >= 120_000} == set(m.large)


def _ogg_crc_bitwise(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def test_ogg_pages_carry_valid_checksums(site: tuple[Path, Manifest]) -> None:
    root, m = site
    item = next(a for a in m.audio if a.url.endswith(".ogg"))
    data = _file(root, item.url).read_bytes()
    pos = pages = 0
    while pos < len(data):
        assert data[pos:pos + 4] == b"OggS"
        nsegs = data[pos + 26]
        length = 27 + nsegs + sum(data[pos + 27:pos + 27 + nsegs])
        page = data[pos:pos + length]
        stored = int.from_bytes(page[22:26], "little")
        assert stored == _ogg_crc_bitwise(page[:22] + b"\0\0\0\0" + page[26:])
        pos += length
        pages += 1
    assert pos == len(data) and pages >= 3
    assert b"TITLE=" + item.title.encode() in data


def test_only_song_pages_carry_audio(site: tuple[Path, Manifest]) -> None:
    root, m = site
    audio_refs = {a.url for a in m.audio} | {a.playlist for a in m.audio if a.playlist}
    song_pages = {a.page for a in m.audio}
    assert len(song_pages) == len(m.audio) == len({a.url for a in m.audio})
    for page in m.pages:
        if page in song_pages:
            continue
        text = _file(root, page).read_text("utf-8")
        assert not any(ref in text for ref in audio_refs), page
        tree = HTMLParser(text)
        assert not tree.css("audio, embed, object, [data-audio], script#song-data"), page
    about = _file(root, "/about.html").read_text("utf-8")
    assert ".mp3" in about and "<video" in about   # prose and video that a sniffer must not take for audio


def _links(tree: HTMLParser) -> list[str]:
    out = [n.attributes.get("href") for n in tree.css("a[href], area[href]")]
    out += [n.attributes.get("src") for n in tree.css("iframe[src], frame[src]")]
    out += [n.attributes.get("href") for n in tree.css("link[href]")
            if "next" in (n.attributes.get("rel") or "").split()]
    return [h for h in out if h]


def test_manifest_agrees_with_a_walk_over_the_generated_html(site: tuple[Path, Manifest]) -> None:
    root, m = site
    redirects = json.loads((root / "_redirects.json").read_text("utf-8"))
    robots = Protego.parse((root / "robots.txt").read_text())
    origin = "http://site.test"
    depth = {"/": 0}
    missing, offsite, disallowed, redirect_sources = set(), set(), set(), set()
    queue = deque(["/"])
    while queue:
        page = queue.popleft()
        for href in _links(_html(root, page)):
            url = urljoin(origin + page, href)
            parts = urlsplit(url)
            if f"{parts.scheme}://{parts.netloc}" != origin:
                offsite.add(url)
                continue
            path = parts.path
            while path in redirects:
                redirect_sources.add(path)
                path = redirects[path]["location"]
            if not path.endswith((".html", "/")):
                assert _file(root, path).is_file(), path   # assets and audio all exist
                continue
            if not _file(root, path).is_file():
                missing.add(path)
            elif not robots.can_fetch(origin + path, "democrawler"):
                disallowed.add(path)
            elif path not in depth:
                depth[path] = depth[page] + 1
                queue.append(path)
    assert set(m.pages) == set(depth)
    assert dict(m.depth) == depth
    assert set(m.not_found) == missing and len(missing) >= 3
    assert set(m.offsite) == offsite and all(u.startswith("http://example.invalid/") for u in offsite)
    assert set(m.redirects) == redirect_sources and {r.status for r in m.redirects.values()} == {301, 302}
    # Some pages are reachable only through a redirect, one of them through a chain of two.
    only_redirected = set(depth) - {urlsplit(urljoin(origin + p, h)).path
                                    for p in depth for h in _links(_html(root, p))}
    assert {"/charts.html", "/news/"} <= only_redirected
    assert set(m.robots_disallowed) >= disallowed == {"/private/index.html"}
    assert "/private/unreleased.html" in m.robots_disallowed
    assert not set(m.robots_disallowed) & set(m.pages)
    assert {a.page for a in m.audio} <= set(depth)
    # Robots aside, the disallowed pages exist: a crawler that ignores robots.txt would fetch them.
    assert all(_file(root, p).is_file() for p in m.robots_disallowed)


def test_paginated_lists_link_next_and_prev(site: tuple[Path, Manifest]) -> None:
    root, m = site
    lists = sorted((p for p in m.pages if p.startswith("/list/")), key=lambda p: int(p[6:-5]))
    assert len(lists) == -(-SMALL["songs"] // SMALL["page_size"])
    for i, page in enumerate(lists):
        tree = _html(root, page)
        nxt = tree.css_first('link[rel="next"]')
        if i + 1 < len(lists):
            assert nxt is not None and nxt.attributes["href"] == lists[i + 1]
            assert tree.css_first('a[rel="next"]').attributes["href"] == lists[i + 1]
        else:
            assert nxt is None
        if i:
            assert tree.css_first('a[rel="prev"]').attributes["href"] == lists[i - 1]
        assert len(tree.css("ol li")) == (SMALL["page_size"] if i + 1 < len(lists) else
                                          SMALL["songs"] - i * SMALL["page_size"])


def test_long_artist_pages_are_paginated(tmp_path: Path) -> None:
    m = sitegen.generate(tmp_path / "s", songs=40, artists=2, page_size=5, large_files=0)
    second_pages = [p for p in m.pages if p.startswith("/artist/") and "-" in p]
    assert second_pages
    tree = _html(tmp_path / "s", "/artist/1.html")
    assert tree.css_first('a[rel="next"]').attributes["href"] == "/artist/1-2.html"


def test_refuses_to_overwrite_unless_told(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        sitegen.generate(tmp_path, songs=10)
    with pytest.raises(FileExistsError):
        sitegen.generate(tmp_path, songs=10, replace=True)   # not a generated site: never deleted
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    out = tmp_path / "site"
    sitegen.generate(out, songs=30, large_files=0)
    m = sitegen.generate(out, songs=10, large_files=0, replace=True)
    assert not (out / "song/30.html").exists() and len(m.audio) == 10


def test_nginx_rules_cover_redirects_streams_and_bookkeeping(site: tuple[Path, Manifest]) -> None:
    root, m = site
    rules = (root / "nginx.conf.fragment").read_text()
    for src, r in m.redirects.items():
        assert f"location = {src} {{ return {r.status} {r.location}; }}" in rules
    assert "location /stream/ { types { } default_type audio/mpeg; }" in rules
    assert "audio/flac flac;" in rules and "audio/x-mpegurl m3u;" in rules
    conf = sitegen.nginx_config(root, 8123, root.parent / "run")
    assert "listen 127.0.0.1:8123;" in conf and f"include {root.resolve()}/nginx.conf.fragment;" in conf


def test_cli_prints_a_one_line_summary(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts/sitegen.py"), str(tmp_path / "s"), "--songs", "30",
                          "--seed", "3", "--large-files", "0"], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "30 audio items" in lines[0]
    assert Manifest.load(tmp_path / "s").seed == 3
