"""End to end: audio downloads as the cluster's own work. Real master and workers as processes, on loopback, against
a site whose pages all name the same audio address besides their own."""

import asyncio
import random
from collections import Counter

import pytest

from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)

PAGES = 30


def _site(root):
    """A home page, PAGES song pages, each with its own mp3 and the one mp3 every page names."""
    rng = random.Random(5)
    (root / "media").mkdir(parents=True)
    (root / "song").mkdir()
    links = "".join(f'<li><a href="/song/{i}.html">Song {i}</a></li>' for i in range(PAGES))
    (root / "index.html").write_text(f"<html><head><title>Songs</title></head><body><ul>{links}</ul></body></html>")
    (root / "media" / "shared.mp3").write_bytes(sitegen._mp3(rng, 40_000, "Theme", "The Band", "Best"))
    for i in range(PAGES):
        (root / "media" / f"{i}.mp3").write_bytes(sitegen._mp3(rng, 20_000, f"Song {i}", "Artist", "Album"))
        (root / "song" / f"{i}.html").write_text(
            f"<html><head><title>Song {i}</title></head><body><h1>Song {i}</h1>"
            f'<audio src="/media/{i}.mp3"></audio><a href="/media/shared.mp3">Theme</a></body></html>')
    return root


def _most_in_flight(entries):
    events = sorted([(e.time, 1) for e in entries] + [(e.ended, -1) for e in entries], key=lambda x: (x[0], x[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def test_three_workers_download_each_address_once_within_the_audio_hosts_limits(tmp_path):
    site_dir = _site(tmp_path / "site")
    # Answers take a while, so that requests overlap whenever the crawl lets them.
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 0.4, r"\.html$": 0.1})
    async with await siteserver.start(site_dir, behaviour=behaviour) as server:
        base = server.url
        nodes = ["w1", "w2", "w3"]
        config = cluster.master_config(tmp_path, [base + "/"], nodes,
                                       politeness={"obey_robots": False, "max_per_host": 2, "audio_max_per_host": 2})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path, extra=["--concurrency", "8"]) for n in nodes]
        assert await master.wait(240) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0, w.log()[-2000:]
        log = list(server.log)
    gets = Counter(e.path for e in log if e.method == "GET")
    # The address every page names was requested once, by one node, for the whole cluster.
    assert gets["/media/shared.mp3"] == 1, gets["/media/shared.mp3"]
    assert all(gets[f"/media/{i}.mp3"] == 1 for i in range(PAGES))
    # Never more than 2 page requests, nor more than 2 downloads, in flight at once over all workers.
    pages = [e for e in log if e.path.endswith(".html") or e.path == "/"]
    media = [e for e in log if e.path.startswith("/media/")]
    assert _most_in_flight(pages) <= 2 and _most_in_flight(media) <= 2
    assert _most_in_flight(media) == 2, "the downloads never overlapped: the limit was not exercised"
    # Every page's row for the shared file says where its one copy is, with its hash.
    rows = [r for r in cluster.catalogue(tmp_path) if r["url"] == base + "/media/shared.mp3"]
    assert len(rows) == PAGES and len({r["page"] for r in rows}) == PAGES
    assert len({(r["node"], r["sha256"], r["path"]) for r in rows}) == 1 and rows[0]["sha256"]
    holder = rows[0]["node"]
    assert (tmp_path / f"worker-{holder}" / rows[0]["path"]).exists()
    # The pages were spread over the nodes: the copies were recorded by nodes that did not download the file.
    assert sum(1 for n in nodes if cluster.pages_of(tmp_path, n)) >= 2
    # (the holder's own pages check its own file: its store answers without a request)
    assert 0 < sum(1 for r in rows if r["extra"].get("stored_on")) < PAGES


async def _timed_crawl(tmp, base, nodes, worker_cfg, cdns):
    """How long the crawl's downloads took, first request to last answer at the audio hosts (not the processes'
    start, which a loaded machine stretches, three of them more than one)."""
    marks = [len(cdn.log) for cdn in cdns]
    tmp.mkdir()
    config = cluster.master_config(tmp, [base + "/"], nodes, crawl={"allowed_networks": ["127.0.0.0/8"]},
                                   politeness={"obey_robots": False, "max_per_host": 2, "audio_max_per_host": 2})
    # The crawl starts once every worker has joined: a page reports before its downloads end, so a worker that
    # joined first would otherwise find (and hold the downloads of) every page before a slower-starting one
    # joined, and the comparison would measure the machine's process start-up, not the cluster.
    master = await cluster.start_master(config, tmp)
    await asyncio.to_thread(cluster.operator, "pause", config)    # before any worker joined: nothing fetched yet
    addr = cluster.master_addr(config)
    workers = [await cluster.start_worker(addr, n, tmp, config=worker_cfg) for n in nodes]
    await cluster.until(lambda: all(f"worker {n} joined" in master.log() for n in nodes), 60, "the workers")
    await asyncio.to_thread(cluster.operator, "resume", config)
    assert await master.wait(240) == 0, master.log()[-3000:]
    for w in workers:
        assert await w.wait(30) == 0, w.log()[-2000:]
    rows = cluster.catalogue(tmp)
    assert len(rows) == SPREAD and all(r["sha256"] for r in rows)
    media = [e for cdn, mark in zip(cdns, marks) for e in cdn.log[mark:] if e.path.startswith("/media/")]
    assert len(media) == SPREAD
    return max(e.ended for e in media) - min(e.time for e in media)


SPREAD = 36


async def test_more_workers_finish_a_politeness_bound_crawl_sooner_when_downloads_dominate(tmp_path):
    """Audio on three hosts, 2 downloads at once each over the cluster; each worker downloads 2 at once: one
    worker uses 2 of the 6 slots the politeness rules allow, three workers all 6."""
    rng = random.Random(9)
    site_dir = tmp_path / "site"
    (site_dir / "media").mkdir(parents=True)
    slow = siteserver.Behaviour(record_log=True, slow_paths={r"^/media/": 0.4})
    cdns = [await siteserver.start(site_dir, host=f"127.0.0.{i}", behaviour=slow) for i in (2, 3, 4)]
    try:
        async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
            links = []
            for i in range(SPREAD):
                (site_dir / "media" / f"{i}.mp3").write_bytes(sitegen._mp3(rng, 20_000, f"S{i}", "A", "B"))
                (site_dir / f"s{i}.html").write_text(
                    f'<html><body><h1>S{i}</h1><audio src="{cdns[i % 3].url}/media/{i}.mp3"></audio></body></html>')
                links.append(f'<a href="/s{i}.html">S{i}</a>')
            (site_dir / "index.html").write_text(f"<html><body>{''.join(links)}</body></html>")
            worker_cfg = tmp_path / "worker.yaml"
            worker_cfg.write_text("downloads: 2\nconcurrency: 4\n")
            one = await _timed_crawl(tmp_path / "one", server.url, ["w1"], worker_cfg, cdns)
            three = await _timed_crawl(tmp_path / "three", server.url, ["w1", "w2", "w3"], worker_cfg, cdns)
            # Each CDN never had more than 2 downloads in flight, with three workers as with one.
            for cdn in cdns:
                assert 0 < _most_in_flight([e for e in cdn.log if e.path.startswith("/media/")]) <= 2
    finally:
        for cdn in cdns:
            await cdn.close()
    # 36 x 0.4 s over 2 slots is 7.2 s for one worker; over 6 slots 2.4 s for three, more as the double hash
    # shares the pages out unevenly.
    assert three < 0.75 * one, (one, three)
