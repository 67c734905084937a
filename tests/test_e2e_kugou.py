"""End to end against a fake Kugou on loopback: real master, real worker, the Kugou resolver and downloads."""

import hashlib
from pathlib import Path

import pytest
import yaml

from crawler.resolvers.kugou import song_fragment_rule
from testkit import cluster
from tests.fakes import kugou as fake

pytestmark = pytest.mark.timeout(180)


async def test_kugou_playlists_resolve_download_and_record_unavailable(tmp_path):
    app, ctl = fake.make_kugou_app()
    songs = [ctl.add_song("周杰伦", "晴天", album="叶惠美"), ctl.add_song("Adele", "Hello", album="25"),
             ctl.add_song("王菲", "红豆", album="唱游"), ctl.add_song("Queen", "Bohemian Rhapsody"),
             ctl.add_song("Paid Artist", "Paid Song", paid=True)]
    verify = songs[1]
    ctl.verify_failures[verify.hash] = 1            # one 20010 "verification" answer, then success
    special = ctl.add_special("1001", [s.hash for s in songs[:3]])
    share = ctl.add_share("abcDEF", [songs[3].hash, songs[4].hash])
    rank = ctl.add_rank("1-8888", [songs[0].hash, songs[3].hash])

    async with fake.serve(app) as base:
        host = base.removeprefix("http://")
        song_url = f"{base}/song/#hash={songs[2].hash}&album_id={songs[2].album_id}"
        config = cluster.master_config(
            tmp_path, [base + special, base + share, base + rank, song_url], ["k1"],
            crawl={"max_depth": 1, "keep_fragment": [rf"^http://{host}/song/"]})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 4, "resolvers": {
            "kugou": {"api_base": base, "mobile_api_base": base, "www_hosts": [host], "mobile_hosts": [host],
                      "referer": base + "/", "retry_delay": 0.0},
            "generic": {}}}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "k1", tmp_path, config=wcfg)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]

    rows = cluster.catalogue(tmp_path)
    by_title: dict[str, list[dict]] = {}
    for r in rows:
        by_title.setdefault(r["title"], []).append(r)
    for s in songs[:4]:
        got = by_title.get(s.song_name)
        assert got, f"{s.song_name} missing from the catalogue: {rows}"
        for r in got:
            assert r["artist"] == s.author_name and r["status"] == "ok", r
            assert r["resolver"] == "kugou" and r["source_id"].upper() == s.hash
            assert r["sha256"] == hashlib.sha256(s.audio).hexdigest(), r
            assert "/G076/" in r["url"]       # the real (signed) address, not the page
    # The song page named only in the fragment was resolved from the URL itself.
    assert any(r["page"].startswith(f"{base}/song/#hash=") for r in by_title["红豆"])
    paid = by_title["Paid Song"]
    assert paid and all(r["status"] == "unavailable" and r["reason"] and not r["sha256"] for r in paid)
    # The download addresses were requested with the same client identity that obtained them.
    assert ctl.downloads and all(d.get("status") in (200, 206) for d in ctl.downloads), ctl.downloads
    # The 20010 answer was retried, not recorded as the song's fate.
    assert sum(1 for q in ctl.play_requests if q.get("hash", "").upper() == verify.hash) >= 2
    files = list(Path(tmp_path / "worker-k1" / "audio").rglob("*.mp3"))
    assert len({f.name for f in files}) == 4


async def test_kugou_album_singer_pages_keyword_seeds_and_fallbacks(tmp_path):
    app, ctl = fake.make_kugou_app()
    on_album = [ctl.add_song("陈奕迅", "十年", album="黑白灰"), ctl.add_song("陈奕迅", "浮夸", album="U87")]
    on_singer = ctl.add_song("王菲", "传奇", album="传奇")
    searched = [ctl.add_song("Searchable Band", "First Hit"), ctl.add_song("Searchable Band", "Second Hit")]
    ctl.add_song("Someone Else", "Not Searched")
    ctl.play_down.add(on_album[1].hash)          # the web play-data API fails: getSongInfo answers
    ctl.dead_primary.add(on_singer.hash)         # the play_url host is down: the backup address serves
    album = ctl.add_album("1645030", [s.hash for s in on_album])
    singer = ctl.add_singer("3520", [on_singer.hash])

    async with fake.serve(app) as base:
        host = base.removeprefix("http://")
        config = cluster.master_config(
            tmp_path, [base + album, base + singer, {"kugou-search": "searchable band"}], ["k1"],
            # No fragment rule in force in the master's config: the worker's Kugou resolver brings its own (its
            # Auth), the operator approved that rule, and the song pages found by the search keep the fragment
            # that names each song.
            crawl={"max_depth": 2, "keep_fragment": [], "approved_fragment_rules": list(song_fragment_rule((host,))),
                   "allowed_hosts": [host, "songsearch.kugou.com"]})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 4, "resolvers": {
            "kugou": {"api_base": base, "mobile_api_base": base, "www_hosts": [host], "mobile_hosts": [host],
                      "referer": base + "/", "retry_delay": 0.0, "search_api_base": base},
            "generic": {}}}, allow_unicode=True))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "k1", tmp_path, config=wcfg)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]
    assert "worker k1 brought fragment rules the crawl lacked" in master.log()

    rows = {r["source_id"]: r for r in cluster.catalogue(tmp_path)}
    for s in [*on_album, on_singer, *searched]:
        r = rows.get(s.hash)
        assert r, f"{s.song_name} missing: {list(rows.values())}"
        assert (r["title"], r["artist"], r["status"]) == (s.song_name, s.author_name, "ok"), r
        assert r["sha256"] == hashlib.sha256(s.audio).hexdigest(), r
        if s is not on_album[1]:   # getSongInfo carries no lyrics
            assert r["lyrics"] == "[00:00.78]" + s.song_name
    assert rows[on_album[0].hash]["page"] == base + album and rows[on_album[0].hash]["album"] == "黑白灰"
    assert rows[on_album[1].hash]["extra"]["via"] == "getSongInfo"
    assert on_album[1].hash in ctl.song_info_requests
    assert rows[on_singer.hash]["page"] == base + singer
    assert "/G077/" in rows[on_singer.hash]["url"] and "/G076/" in rows[on_singer.hash]["extra"]["primary_url"]
    for s in searched:   # found by keyword, recorded on their own song pages
        assert rows[s.hash]["page"].startswith(f"{base}/song/#hash={s.hash}")
    assert len(rows) == 5 and ctl.search_requests[0]["keyword"] == "searchable band"
