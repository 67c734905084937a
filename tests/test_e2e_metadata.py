"""End to end: real master and workers crawl a site whose songs are named only in plain text, whose files carry
real tags (written by mutagen), some reached through extension-less links, plus a podcast feed, an Atom feed and
a sitemap index with a gzip sitemap announced in robots.txt."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, siteserver
from testkit.sitegen_named import generate_named, write_sitemaps
from tests.fakes import audiofiles
from tests.store_reads import url_info

pytestmark = pytest.mark.timeout(300)


def _tagged_writer(path: Path, kind: str, title: str, artist: str, album: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    audiofiles.write(path, kind, title, artist, album)


async def test_names_from_plain_text_tags_from_files_feeds_and_sitemaps(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    manifest = generate_named(site_dir, songs=150, write_audio=_tagged_writer)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        base = server.url
        write_sitemaps(site_dir, base, manifest)
        config = cluster.master_config(tmp_path, [base + "/"], ["w1", "w2"], crawl={"max_depth": 6},
                                       politeness={"obey_robots": True})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path, extra=["--concurrency", "8"]) for n in ("w1", "w2")]
        rc = await master.wait(240)
        assert rc == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0, w.log()[-3000:]
        fetched = {e.path for e in server.log if e.method == "GET"}

    rows = {row["url"].removeprefix(base): row for row in cluster.catalogue(tmp_path)}

    # Songs: every one found (a third only through the gzip sitemap), >= 99% with the right title and artist
    # from the plain text of the page, the album, duration and bitrate from the file's tags.
    assert {"/sitemap-index.xml", "/sitemaps/songs.xml.gz", "/sitemaps/pages.xml"} <= fetched
    missing = [s.url for s in manifest.songs if s.url not in rows]
    assert not missing, f"songs not catalogued: {missing[:10]}"
    right = [s for s in manifest.songs
             if (rows[s.url]["title"], rows[s.url]["artist"]) == (s.title, s.artist)]
    assert len(right) >= 0.99 * len(manifest.songs), [
        (s.url, rows[s.url]["title"], rows[s.url]["artist"], s.title, s.artist)
        for s in manifest.songs if s not in right][:5]
    for s in manifest.songs:
        row = rows[s.url]
        assert row["page"] == base + s.page, (s.url, row["page"])
        # An extensionless file whose head names it (ID3, FLAC) needs no second look at its page.
        named_by_head = s.extensionless and s.kind in ("mp3", "flac")
        assert row["meta_source"]["title"] == row["meta_source"]["artist"] == (
            "file" if named_by_head else "class"), row
        assert row["album"] == s.album and row["meta_source"]["album"] == "file", row
        assert row["duration"] and row["bitrate"] and row["codec"], row
        assert row["meta_source"]["duration"] == row["meta_source"]["bitrate"] == "file"
        assert row["sha256"] and row["path"]
    extensionless = [s for s in manifest.songs if s.extensionless]
    assert extensionless and all(rows[s.url]["extra"]["found_in"] == "response" for s in extensionless)
    assert any(s.kind in ("ogg", "m4a") for s in extensionless)   # these took their names from the song page
    m4a = next(s for s in manifest.songs if s.kind == "m4a" and not s.extensionless)
    assert (rows[m4a.url]["duration"], rows[m4a.url]["bitrate"], rows[m4a.url]["codec"]) == (95.0, 96, "aac")

    # Feeds: each enclosure an item with the episode's title, the show, description, date and duration; the
    # file's own title disagrees and is kept beside.
    for ep in manifest.episodes:
        row = rows[ep.url]
        assert (row["title"], row["album"], row["published"]) == (ep.title, ep.show, ep.published), row
        assert row["description"] == ep.description and row["meta_source"]["title"] == "feed"
        if ep.duration:
            assert row["duration"] == ep.duration and row["meta_source"]["duration"] == "feed"
        number = ep.url.rsplit("/", 1)[-1].split(".")[0]
        assert row["file_tags"]["title"] == f"Episode {number} file"

    # The sitemap's lastmod is kept with the URL.
    store = MasterStore.open_readonly(tmp_path / "master" / "master.db")
    try:
        page, lastmod = next(iter(manifest.sitemap_lastmod.items()))
        info = url_info(store, base + page)
    finally:
        store.close()
    assert info is not None and info["lastmod"] is not None
    assert info["lastmod"] == datetime.fromisoformat(lastmod + "T00:00:00+00:00").timestamp()
