"""End to end: DASH. A real master and worker, as processes on loopback, crawl a site whose page plays a static
DASH presentation of a synthesised work (made by ffmpeg's dash muxer) and a live one (a dynamic MPD whose edge
moves with the clock). The static one is catalogued as one joined file (format dash, its sha256 the join of the
segment files, its size and duration) and matched to its work once the work is a reference; the live one is
recorded for the worker's window (live: true, the seconds recorded)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testkit import cluster, music, siteserver
from testkit.cluster import jsonl, master_command, store_count
from testkit import dash as tdash

pytestmark = pytest.mark.timeout(240)

SECONDS = 40.0             # the work's length
WINDOW = 4.0               # live_record_seconds: a short window, in real time
LIVE_SEGMENT = 1.0


@dataclass(frozen=True)
class Site:
    root: Path
    ref: Path
    meta: Path
    static: tdash.Presentation
    live: tdash.Presentation          # served by a LiveServer, not by the site


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    base = tmp_path_factory.mktemp("dash-e2e")
    root, refs = base / "site", base / "refs"
    refs.mkdir()
    ref = music.write_wav(refs / "w-d.wav", music.work(301, SECONDS))
    static = tdash.make(ref, root / "dash" / "song", kind="number", seconds=4.0)
    other = music.write_wav(base / "other.wav", music.work(302, 30.0))
    live = tdash.make(other, base / "live", kind="number", seconds=LIVE_SEGMENT)
    meta = base / "works.csv"
    meta.write_text("path,work,title,artist\nrefs/w-d.wav,W-D,Title of W-D,Artist D\n")
    return Site(root, ref, meta, static, live)


async def test_static_and_live_dash_are_catalogued_and_the_static_one_identified(site, tmp_path):
    master = worker = None
    async with tdash.LiveServer(site.live, history=3.0) as live:
        (site.root / "index.html").write_text(
            "<html><head><title>Streams</title></head><body>"
            '<h1>Song</h1><audio controls src="/dash/song/manifest.mpd" title="Song of W-D"></audio>'
            f'<h1>On air</h1><audio controls><source src="{live.url}" type="application/dash+xml"></audio>'
            "</body></html>")
        try:
            async with await siteserver.start(site.root) as server:
                base = server.url
                # The live stream is another loopback server than the site: the crawl names loopback for it.
                config = cluster.master_config(tmp_path, [base + "/"], ["d1"], exit_when_done=False,
                                               crawl={"allowed_networks": ["127.0.0.1/32"]})
                db = Path(cluster.store_of(config))
                master = await cluster.start_master(config, tmp_path)
                said = await asyncio.to_thread(master_command, "references", "add", "--config", str(config), "--meta",
                                               str(site.meta), str(site.ref))
                assert said.startswith("added 1 reference works"), said
                wcfg = tmp_path / "worker.yaml"
                wcfg.write_text(yaml.safe_dump({"live_record_seconds": WINDOW}))
                worker = await cluster.start_worker(cluster.master_addr(config), "d1", tmp_path, config=wcfg)
                await cluster.until(lambda: store_count(db, "SELECT count(*) FROM audio WHERE sha256 IS NOT NULL") >= 2
                                    and store_count(db, "SELECT count(*) FROM matches") >= 1, 90,
                                    "both presentations stored and the static one matched", master, worker)
                await worker.stop()
                await master.stop()
            catalogue = jsonl(await asyncio.to_thread(cluster.operator, "export", config))
            matches = jsonl(await asyncio.to_thread(cluster.operator, "export", config, "--matches"))
        finally:
            if worker is not None:
                await worker.stop()
            if master is not None:
                await master.stop()

    rows = {r["url"]: r for r in catalogue}
    static_url = f"{base}/dash/song/manifest.mpd"
    assert set(rows) == {static_url, live.url}, sorted(rows)

    # The static presentation: one file, the init segment and the media segments joined, as the test joins them.
    joined = b"".join(f.read_bytes() for f in site.static.files)
    song = rows[static_url]
    assert song["status"] == "ok", song
    assert song["sha256"] == hashlib.sha256(joined).hexdigest() and song["size"] == len(joined)
    assert song["extra"]["format"] == "dash" and song["extra"]["segments"] == len(site.static.files) - 1
    assert song["duration"] == SECONDS and not song["extra"].get("live")
    assert song["content_type"] == "audio/mp4"
    assert song.get("match", {}).get("work") == "W-D", song
    assert [(m["url"], m["work"]) for m in matches] == [(static_url, "W-D")]
    assert abs(matches[0]["offset"]) <= 0.5

    # The live presentation: recorded for the window, each segment a second of it.
    on_air = rows[live.url]
    assert on_air["status"] == "ok", on_air
    assert on_air["extra"]["live"] is True and on_air["extra"]["format"] == "dash"
    assert on_air["sha256"] and on_air["size"] > 0 and on_air["extra"]["recorded_at"] > 0
    assert on_air["duration"] == on_air["extra"]["segments"] * LIVE_SEGMENT
    assert WINDOW - LIVE_SEGMENT <= on_air["duration"] <= WINDOW + LIVE_SEGMENT, on_air
    segments = [p for p, status in live.log if status == 200 and "/seg-" in p]
    assert len(segments) == on_air["extra"]["segments"]
