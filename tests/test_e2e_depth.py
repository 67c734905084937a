"""End to end: exact breadth-first depth with several workers, audio at the depth limit, and leases renewed
while long downloads run. Real master and worker processes on loopback against the generated site."""

import re
from collections import Counter

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, sitegen, siteserver
from tests.store_reads import url_info

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    manifest = sitegen.generate(out, songs=400, seed=11)
    return out, manifest


async def test_four_workers_with_max_depth_at_the_sites_depth_find_every_audio_item_at_its_shortest_depth(
        site, tmp_path):
    site_dir, manifest = site
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        base = server.url
        nodes = ["w1", "w2", "w3", "w4"]
        config = cluster.master_config(tmp_path, [base + "/"], nodes, crawl={"max_depth": manifest.max_depth})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path, extra=["--concurrency", "8"]) for n in nodes]
        assert await master.wait(240) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0, w.log()[-2000:]
    # Every audio item of the site is in the catalogue, those behind a stream or a playlist on the deepest
    # pages included, downloaded intact.
    rows = cluster.catalogue(tmp_path)
    found = {(r["url"].removeprefix(base), r["page"].removeprefix(base)): r for r in rows}
    missing = [a for a in manifest.audio if (a.url, a.page) not in found]
    assert not missing, f"{len(missing)} of {len(manifest.audio)} audio items missing, e.g. {missing[:3]}"
    deepest = [a for a in manifest.audio if manifest.depth.get(a.page) == manifest.max_depth
               and a.style in ("stream", "playlist")]
    assert deepest, "the site has no stream or playlist on its deepest pages: the test would prove nothing"
    assert all(found[(a.url, a.page)]["sha256"] == a.sha256 for a in manifest.audio)
    # Every page's recorded depth is its shortest link distance from the home page.
    store = MasterStore.open_readonly(tmp_path / "master" / "master.db")
    try:
        wrong = {}
        for path, depth in manifest.depth.items():
            info = url_info(store, base + path)
            if info is None or info["depth"] != depth:
                wrong[path] = (depth, info and info["depth"])
    finally:
        store.close()
    assert not wrong, f"{len(wrong)} pages recorded at another depth (shortest, recorded): {list(wrong.items())[:5]}"
    assert "level 1 begins" in master.log() and f"level {manifest.max_depth} begins" in master.log()


async def test_downloads_longer_than_the_lease_complete_with_one_attempt_each(site, tmp_path):
    """Leases of 2 s, every tenth audio file answered after 3 s (all of them would only make the test long): the
    workers' heartbeats keep the leases, nothing is handed out twice."""
    site_dir, _ = site
    slow = r"^/media/\d*0\."
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={slow: 3.0})
    async with await siteserver.start(site_dir, behaviour=behaviour) as server:
        base = server.url
        config = cluster.master_config(tmp_path, [base + "/"], ["w1", "w2"], crawl={"max_depth": 2},
                                       scheduling={"lease_timeout": 2.0, "heartbeat_interval": 0.3,
                                                   "heartbeat_timeout": 3.0})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        workers = [await cluster.start_worker(addr, n, tmp_path, extra=["--concurrency", "8"])
                   for n in ("w1", "w2")]
        assert await master.wait(240) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(30) == 0
        log = list(server.log)
    media = Counter(e.path for e in log if e.method == "GET" and e.path.startswith("/media/"))
    pages = Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".html"))
    assert sum(1 for m in media if re.match(slow, m)) >= 5, "too few long downloads to show anything"
    assert set(media.values()) == {1}, [p for p, n in media.items() if n > 1]
    assert set(pages.values()) == {1}, [p for p, n in pages.items() if n > 1]
    assert "expired" not in master.log()
    rows = cluster.catalogue(tmp_path)
    assert rows and all(r["status"] == "ok" and r["sha256"] for r in rows if r["url"].startswith(base + "/media/"))
