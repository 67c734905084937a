"""End to end: a page's report carries the outcomes of its downloads that end soon; a page whose downloads take
longer reports without waiting for them, and no pending download is lost. Real master and workers as processes, on
loopback, against sites whose audio is slow to answer. The tests of the pending downloads set `report_wait: 0`, so
that every download is reported apart from its page, however fast it ends."""

import random
import re
import time
from collections import Counter

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)


def _status(config) -> dict:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return store.status()


def _pending_of(config, node: str) -> int:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return len(store.pending_of([node]))


def _apart(tmp_path):
    """A worker config whose pages never wait for their downloads."""
    path = tmp_path / "worker-apart.yaml"
    path.write_text("report_wait: 0\n")
    return path


async def _crawl_with_one_worker(tmp_path, site, behaviour, worker_cfg):
    """A crawl of the site by one worker, w1, to its end: the master's process, its config, the site's log."""
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"])
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=worker_cfg)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-2000:]
        return master, config, list(server.log)


def _song_site(tmp_path, seed: int, songs: int, size: int, *, heading: bool = False):
    """A home page linking `songs` song pages, each with one audio element: the sites of the tests below."""
    rng = random.Random(seed)
    site = tmp_path / "site"
    (site / "media").mkdir(parents=True)
    for i in range(songs):
        (site / "media" / f"{i}.mp3").write_bytes(sitegen._mp3(rng, size, f"Song {i}", "Artist", "Album"))
        title = f"<h1>Song {i}</h1>" if heading else ""
        (site / f"s{i}.html").write_text(f'<html><body>{title}<audio src="/media/{i}.mp3"></audio></body></html>')
    (site / "index.html").write_text("<html><body>" + "".join(f'<a href="/s{i}.html">{i}</a>' for i in range(songs))
                                     + "</body></html>")
    return site


async def test_a_page_reports_its_links_while_its_download_is_still_running(tmp_path):
    rng = random.Random(3)
    site = tmp_path / "site"
    (site / "media").mkdir(parents=True)
    (site / "media" / "slow.mp3").write_bytes(sitegen._mp3(rng, 30_000, "Slow", "Band", "Album"))
    children = [f"/c{i}.html" for i in range(5)]
    (site / "index.html").write_text('<html><body><audio src="/media/slow.mp3"></audio>'
                                     + "".join(f'<a href="{c}">{c}</a>' for c in children) + "</body></html>")
    for c in children:
        (site / c.lstrip("/")).write_text(f"<html><body><h1>{c}</h1></body></html>")
    # The audio answers only after 8 s: every child page must be fetched long before.
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 8.0})
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"])
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=_apart(tmp_path))

        def children_fetched() -> bool:
            return {e.path for e in server.log} >= set(children)

        await cluster.until(children_fetched, 60, "the child pages to be fetched")
        # The parent's download has not answered yet (the site logs a request once answered) ...
        assert not [e for e in server.log if e.path.startswith("/media/")], "the download ended before the links"
        # ... and the master says so: the item is pending, the pages are done, the crawl is not over.
        await cluster.until(lambda: _status(config)["states"]["done"] == 1 + len(children), 30,
                            "the child pages to be recorded")
        st = _status(config)
        assert st["audio"] == {"pending": 1} and st["downloads_pending"] == 1, st
        assert master.proc.returncode is None
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-2000:]
        log = list(server.log)
    media = [e for e in log if e.path == "/media/slow.mp3"]
    assert len(media) == 1
    assert max(e.time for e in log if e.path in children) < media[0].ended
    # The outcome reached the catalogue: the row is no longer pending, with the file's hash and place.
    (row,) = cluster.catalogue(tmp_path)
    assert row["status"] == "ok" and row["sha256"] and row["node"] == "w1" and row["title"] == "Slow"
    assert (tmp_path / "worker-w1" / row["path"]).exists()
    final = _status(config)
    assert final["audio"] == {"ok": 1} and final["downloads_pending"] == 0


async def test_a_page_report_carries_the_downloads_that_ended_within_report_wait(tmp_path):
    """Fast downloads ride in their page's report: the master writes their rows once, as they stand, with no
    pending row to write and settle. A download slower than report_wait is reported apart, as before."""
    songs = 6
    site = _song_site(tmp_path, 17, songs, 20_000, heading=True)
    (site / "media" / "slow.mp3").write_bytes(sitegen._mp3(random.Random(2), 20_000, "Slow", "Band", "Album"))
    (site / "slow.html").write_text('<html><body><h1>Slow</h1><audio src="/media/slow.mp3"></audio></body></html>')
    index = site / "index.html"
    index.write_text(index.read_text().replace("</body>", '<a href="/slow.html">slow</a></body>'))
    # The fast files have 3 s to end (plenty, on a loaded machine); the slow one answers after 8.
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/slow": 8.0})
    worker_cfg = tmp_path / "worker.yaml"
    worker_cfg.write_text("report_wait: 3.0\n")
    master, config, log = await _crawl_with_one_worker(tmp_path, site, behaviour, worker_cfg)
    summary = master.stdout.decode()
    assert f"downloads       {songs} files with their pages, 1 reported apart" in summary, summary
    rows = cluster.catalogue(tmp_path)
    assert sorted(r["url"].rsplit("/", 1)[1] for r in rows) == sorted([f"{i}.mp3" for i in range(songs)]
                                                                       + ["slow.mp3"])
    assert all(r["status"] == "ok" and r["sha256"] and r["title"] for r in rows), rows
    for r in rows:
        assert (tmp_path / "worker-w1" / r["path"]).exists()
    # The slow page's report did not wait for its download: the page was answered long before the file.
    slow_page = next(e for e in log if e.path == "/slow.html")
    slow_file = next(e for e in log if e.path == "/media/slow.mp3")
    assert slow_file.ended - slow_page.ended > 5.0
    st = _status(config)
    assert st["downloads_pending"] == 0 and st["audio"] == {"ok": songs + 1}


SONGS = 12


async def test_the_pending_downloads_of_a_killed_worker_are_finished_by_another(tmp_path, master_store):
    site = _song_site(tmp_path, 11, SONGS, 20_000, heading=True)
    # Two downloads at a time per worker, 2 s each: the pages are all reported long before their downloads end.
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 2.0})
    worker_cfg = tmp_path / "worker.yaml"
    worker_cfg.write_text("downloads: 2\nreport_wait: 0\n")
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], **master_store)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        w1 = await cluster.start_worker(addr, "w1", tmp_path, config=worker_cfg)
        # w1 alone has found every song, and is downloading them: the first ended, the next are under way.
        await cluster.until(lambda: _pending_of(config, "w1") >= SONGS - 4
                            and any(e.path.startswith("/media/") for e in server.log), 60,
                            "w1 to hold pending downloads")
        # w2 finishes what w1 held four at a time (its host's bound): what is checked is which downloads it is
        # handed, not how slowly it gets through them.
        w2_cfg = tmp_path / "worker-w2.yaml"
        w2_cfg.write_text("downloads: 4\nreport_wait: 0\n")
        w2 = await cluster.start_worker(addr, "w2", tmp_path, config=w2_cfg)
        await cluster.until(lambda: "worker w2 joined" in master.log(), 30, "w2 to join")
        held = _pending_of(config, "w1")
        killed_at = time.monotonic()   # the site's log times are this process's monotonic clock
        w1.kill()
        await w1.wait(10)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await w2.wait(30) == 0, w2.log()[-2000:]
        log = list(server.log)
    assert held >= SONGS - 4
    handed = [int(n) for n in re.findall(r"node w1 left: .* (\d+) pending downloads handed on", master.log())]
    assert handed and handed[0] > 0, master.log()[-3000:]
    rows = cluster.catalogue(tmp_path)
    # Every item downloaded, once per address: one row each, ok, with its file on the node that holds it.
    assert sorted(r["url"].rsplit("/", 1)[1] for r in rows) == sorted(f"{i}.mp3" for i in range(SONGS))
    assert all(r["status"] == "ok" and r["sha256"] for r in rows), [r for r in rows if r["status"] != "ok"]
    assert {r["node"] for r in rows} == {"w1", "w2"}
    for r in rows:
        assert (tmp_path / f"worker-{r['node']}" / r["path"]).exists()
    # Each address was fetched at most once after the kill, and at most once before it.
    gets = Counter(e.path for e in log if e.path.startswith("/media/"))
    after = Counter(e.path for e in log if e.path.startswith("/media/") and e.time > killed_at)
    assert all(n <= 1 for n in after.values()), after
    assert all(n <= 2 for n in gets.values()), gets
    st = _status(config)
    assert st["downloads_pending"] == 0 and st["audio"] == {"ok": SONGS}


async def test_a_worker_with_its_downloads_pending_takes_no_new_pages(tmp_path):
    """pending_downloads bounds what a worker holds: at the bound it grants no credit, so the pages it fetched
    never run ahead of the downloads it finished by more than the bound and its credit."""
    songs = 8
    site = _song_site(tmp_path, 5, songs, 10_000)
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 1.0})
    worker_cfg = tmp_path / "worker.yaml"
    worker_cfg.write_text("downloads: 1\npending_downloads: 2\nmax_tasks: 2\nreport_wait: 0\n")
    _, _, log = await _crawl_with_one_worker(tmp_path, site, behaviour, worker_cfg)
    events = sorted([(e.time, 1) for e in log if e.path.startswith("/s")]
                    + [(e.ended, -1) for e in log if e.path.startswith("/media/")])
    ahead = most = 0
    for _, step in events:
        ahead += step
        most = max(most, ahead)
    assert most <= 2 + 2, most          # the bound plus the credit already granted when it was reached
    rows = cluster.catalogue(tmp_path)
    assert len(rows) == songs and all(r["status"] == "ok" for r in rows)


async def test_pending_downloads_outlive_a_master_restart_and_go_on_when_their_node_is_gone(tmp_path):
    """Master and worker killed together while the worker holds pending downloads; the master starts again and
    only another worker comes: after the grace period the dead node's downloads are that worker's."""
    songs = 8
    site = _song_site(tmp_path, 13, songs, 10_000)
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 2.0})
    worker_cfg = tmp_path / "worker.yaml"
    worker_cfg.write_text("downloads: 1\nreconnect_max_delay: 1.0\nreport_wait: 0\n")
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"],
                                       listen=f"127.0.0.1:{cluster.free_port()}")
        master = await cluster.start_master(config, tmp_path)
        w1 = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=worker_cfg)
        await cluster.until(lambda: _pending_of(config, "w1") >= songs - 2, 60, "w1 to hold pending downloads")
        for proc in (w1, master):
            proc.kill()
            await proc.wait(10)
        held = _pending_of(config, "w1")
        master = await cluster.start_master(config, tmp_path, log_name="master2.log")
        # w2 takes the dead node's downloads four at a time (its host's bound), not one by one as w1 held them.
        w2_cfg = tmp_path / "worker-w2.yaml"
        w2_cfg.write_text("downloads: 4\nreconnect_max_delay: 1.0\nreport_wait: 0\n")
        w2 = await cluster.start_worker(cluster.master_addr(config), "w2", tmp_path, config=w2_cfg)
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await w2.wait(30) == 0, w2.log()[-2000:]
    text = master.log()
    assert f"{held} downloads were pending when the master stopped" in text, text[-3000:]
    assert "node w1 did not come back" in text
    rows = cluster.catalogue(tmp_path)
    assert sorted(r["url"].rsplit("/", 1)[1] for r in rows) == sorted(f"{i}.mp3" for i in range(songs))
    assert all(r["status"] == "ok" and r["sha256"] for r in rows)
    assert sum(1 for r in rows if r["node"] == "w2") >= held
    st = _status(config)
    assert st["downloads_pending"] == 0 and st["audio"] == {"ok": songs}
