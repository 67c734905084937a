"""End to end: a site whose song pages link their audio as extension-less streams (/stream/N) and through
.m3u/.pls playlists, behind terse download labels in many languages. Real master and workers crawl it; the site
counts the requests per path. No page and no stream is requested twice in the visit (a download's Range request
that resumes after the bytes the page fetch read aside), and every song is catalogued under its page's heading,
never its label, with the file's right bytes."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest

from crawler.worker.fetcher import SNIFF_BYTES
from testkit import cluster, siteserver
from tests.fakes import streamsite

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("max_depth", [5, 1], ids=["below-the-depth-limit", "songs-at-the-depth-limit"])
async def test_no_page_or_stream_is_fetched_twice_and_labels_never_become_titles(tmp_path: Path,
                                                                                 max_depth: int) -> None:
    site_dir = tmp_path / "site"
    songs = streamsite.generate(site_dir, songs=24)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        base = server.url
        config = cluster.master_config(tmp_path, [base + "/"], ["w1", "w2"], crawl={"max_depth": max_depth})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path, extra=["--concurrency", "4"])
                   for n in ("w1", "w2")]
        assert await master.wait(90) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0, w.log()[-3000:]
        log = list(server.log)

    # Every path at most once as a plain GET; the only other requests are Range requests of streams, each
    # resuming where the page fetch of the same stream stopped reading.
    plain = Counter(e.path for e in log if e.range is None)
    twice = {path: n for path, n in plain.items() if n > 1}
    assert not twice, twice
    ranged = [e for e in log if e.range is not None]
    assert all(e.path.startswith("/stream/") and e.status == 206 for e in ranged), ranged
    assert len({e.path for e in ranged}) == len(ranged), ranged
    assert all(e.range == f"bytes={SNIFF_BYTES}-" for e in ranged), ranged
    big_streams = {s.audio for s in songs if s.audio.startswith("/stream/") and s.size > SNIFF_BYTES}
    assert {e.path for e in ranged} == big_streams
    assert {s.page for s in songs} <= set(plain)

    rows = {row["url"].removeprefix(base): row for row in cluster.catalogue(tmp_path)}
    missing = [s.audio for s in songs if s.audio not in rows]
    assert not missing, missing
    for s in songs:
        row = rows[s.audio]
        # The page's heading (a page about one song), and the artist it names; never the link's label.
        assert (row["title"], row["artist"]) == (s.title, s.artist), (s, row)
        assert row["meta_source"]["title"] == "heading", (s, row)
        assert row["status"] == "ok" and row["size"] == s.size, (s, row)
        assert row["sha256"] == hashlib.sha256((site_dir / s.audio.lstrip("/")).read_bytes()).hexdigest()
        if s.playlist is None or s.kind == "m3u-named":
            assert row["page"] == base + s.page, (s, row)
