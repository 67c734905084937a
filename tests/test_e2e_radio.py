"""End to end: internet radio recorded and identified. Real master and workers as processes, on loopback, crawl a
site whose page links one station directly, lists another in a ``.pls`` playlist and plays a third in an
``<audio src>``; each station (testkit/radio.py: SHOUTcast's ``ICY 200 OK``, and Icecast's HTTP/1.0 for one) plays
two synthesised reference works in a loop, paced at its bitrate, with a StreamTitle at each track change.

Each station address gets one catalogue row: a recording of ``live_record_seconds``, its sha256 and size, the
station's name as its title, and the titles it played with their offsets; with the works added as references the
station's address is matched to the works it played. The window is long for a test (28 s) because a match needs
about a dozen seconds of a work; the stations are recorded side by side, so the crawl takes one window."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime
from pathlib import Path

import pytest

from testkit import cluster, music, radio, siteserver
from testkit.cluster import jsonl, master_command, store_count

pytestmark = pytest.mark.timeout(240)

WINDOW = 28.0                     # seconds recorded per visit (the worker's live_record_seconds)
TRACK = 14.0                      # each work's length: the window holds both
WORKS = {"W-A": 401, "W-B": 402}  # work id: seed
BITRATE = 64                      # kbit/s: 8000 bytes a second
METAINT = 8000


@pytest.fixture(scope="module")
def works(tmp_path_factory) -> tuple[Path, Path, list[radio.Track]]:
    """The reference works (WAV, and the CSV naming them) and the station's tracks: the works as MP3."""
    base = tmp_path_factory.mktemp("radio")
    refs = base / "refs"
    refs.mkdir()
    for work, seed in WORKS.items():
        music.write_wav(refs / f"{work.lower()}.wav", music.work(seed, TRACK))
    meta = base / "works.csv"
    meta.write_text("path,work,title,artist\n" + "".join(
        f"refs/{w.lower()}.wav,{w},Title of {w},Artist {w[-1]}\n" for w in WORKS))
    tracks = radio.mp3_tracks(base / "tracks", {f"Artist {w[-1]} - Title of {w}": s for w, s in WORKS.items()},
                              seconds=TRACK, bitrate=BITRATE)
    return refs, meta, tracks


async def test_stations_found_three_ways_are_recorded_catalogued_and_identified(works, tmp_path):
    refs, meta, tracks = works
    root = tmp_path / "site"
    root.mkdir()
    stations = {"direct": radio.Station(tracks, name="Direct FM", genre="Synth", bitrate=BITRATE, metaint=METAINT),
                "pls": radio.Station(tracks, name="Playlist FM", genre="Synth", bitrate=BITRATE, metaint=METAINT,
                                     icecast=True, mount="/live"),
                "audio": radio.Station(tracks, name="Element FM", genre="Synth", bitrate=BITRATE,
                                       metaint=METAINT)}
    master = worker = None
    try:
        for station in stations.values():
            await station.start()
        (root / "radio.pls").write_text(f"[playlist]\nNumberOfEntries=1\nFile1={stations['pls'].url}\n"
                                        "Length1=-1\nVersion=2\n")
        (root / "index.html").write_text(
            f'<html><body><p><a href="{stations["direct"].url}"></a></p><p><a href="/radio.pls"></a></p>'
            f'<audio controls src="{stations["audio"].url}"></audio></body></html>')
        async with await siteserver.start(root) as server:
            hosts = [f"127.0.0.1:{server.port}"] + [f"127.0.0.1:{s.url.split(':')[2].split('/')[0]}"
                                                      for s in stations.values()]
            config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                           crawl={"allowed_hosts": hosts, "allowed_networks": ["127.0.0.0/8"]})
            db = Path(cluster.store_of(config))
            master = await cluster.start_master(config, tmp_path)
            said = await asyncio.to_thread(master_command, "references", "add", "--config", str(config),
                                           "--meta", str(meta), *(str(refs / f"{w.lower()}.wav") for w in WORKS))
            assert said.startswith("added 2 reference works"), said
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text(f"live_record_seconds: {WINDOW}\n")
            worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)

            def done() -> bool:
                return (store_count(db, "SELECT count(*) FROM audio WHERE sha256 IS NOT NULL") >= 3
                        and store_count(db, "SELECT count(*) FROM live_recordings") >= 3
                        and store_count(db, "SELECT count(*) FROM matches") >= 2 * 3)

            try:
                await cluster.until(done, 180, "three recordings, fingerprinted and matched")
            except AssertionError:
                raise AssertionError(f"{master.log()[-3000:]}\n---\n{worker.log()[-5000:]}") from None
            await asyncio.sleep(1.0)          # nothing more comes: one row per station
            catalogue = jsonl(await asyncio.to_thread(cluster.operator, "export", config))
            matches = jsonl(await asyncio.to_thread(cluster.operator, "export", config, "--matches"))
            await worker.stop()
            await master.stop()
            listeners = {name: list(s.listeners) for name, s in stations.items()}
    finally:
        if worker is not None:
            await worker.stop()
        if master is not None:
            await master.stop()
        for station in stations.values():
            await station.stop()

    urls = {name: s.url for name, s in stations.items()}
    rows = [r for r in catalogue if r["url"] in urls.values()]
    assert sorted(r["url"] for r in rows) == sorted(urls.values()), catalogue      # one row per station
    names = {"direct": "Direct FM", "pls": "Playlist FM", "audio": "Element FM"}
    titles = [t.title for t in tracks]
    data = tmp_path / "worker-w1"
    for name, url in urls.items():
        row = next(r for r in rows if r["url"] == url)
        extra = row["extra"]
        assert extra["live"] is True and extra["format"] == "icy" and row["status"] == "ok", row
        assert row["title"] == names[name] and extra["icy_name"] == names[name] and extra["icy_br"] == BITRATE
        assert WINDOW - 0.5 <= row["duration"] <= WINDOW + 1.0, row
        # The stored file is the audio the station sent this recording's listener, metadata taken out.
        recorded = (data / row["path"]).read_bytes()
        assert hashlib.sha256(recorded).hexdigest() == row["sha256"] and len(recorded) == row["size"]
        sent = [bytes(li.audio) for li in listeners[name] if li.metadata]
        assert len(sent) == 1 and sent[0].startswith(recorded), name   # one listener recorded, once
        # The titles it played, where they came in the recording: the first at 0, the change where it was told.
        told = [(off, t) for li in listeners[name] if li.metadata for off, t in li.titles if off <= len(recorded)]
        assert extra["played"] == [{"offset": 0.0, "title": told[0][1]}] + [
            {"offset": round(off / (BITRATE * 125), 3), "title": t} for off, t in told[1:]], extra["played"]
        assert [p["title"] for p in extra["played"]][:2] == titles
        assert abs(extra["played"][1]["offset"] - len(tracks[0].audio) / (BITRATE * 125)) <= METAINT / 8000 + 0.01
    # Each station's address is matched to the works it played, and says when: each listener heard W-A from the
    # recording's start and W-B from the second track on, each for a track's length (a match's span is known to
    # about a second or two either way: the pairs that verify it are about a second apart).
    matched: dict[str, set[str]] = {}
    for m in matches:
        matched.setdefault(m["url"], set()).add(m["work"])
    assert matched == {url: set(WORKS) for url in urls.values()}, matches
    for m in matches:
        row = next(r for r in rows if r["url"] == m["url"])
        begun = row["extra"]["recorded_at"]
        expected = begun + (0.0 if m["work"] == "W-A" else len(tracks[0].audio) / (BITRATE * 125))
        played = datetime.fromisoformat(m["played_at"]).timestamp()
        assert m["live"] is True and m["station"] == row["title"] and m["window"] is not None, m
        assert abs(played - expected) <= 3.0, (m, begun)
        assert TRACK / 2 <= m["played_seconds"] <= TRACK + 1.0, m
