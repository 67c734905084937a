"""End to end with real processes: a worker's disk fills and stays full for the rest of the crawl.

Its pages go back to the master at once; its pending downloads stay its own for `scheduling.fault_timeout`
(a disk freed soon keeps their partial files), then go to the live node. The crawl ends with every item
downloaded, each file on the disk of the node the catalogue names. A fault that only a download meets (no page
left to fetch, a little room left for small files) is told to the master all the same.
"""

import asyncio
from pathlib import Path

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, sitegen, siteserver
from tests.disks import fill, small_tmpfs

pytestmark = pytest.mark.timeout(180)


def pending_at(config: Path, node: str) -> set[str]:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return {r[1] for r in store.pending_of([node])}


def states(config: Path) -> dict[str, int]:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return store.status()["states"]


async def test_a_full_disk_for_good_moves_the_nodes_pending_downloads_and_the_crawl_ends(tmp_path):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=24, audio_size=8192, large_files=0)
    # Slow files: downloads stay pending (report_wait 0: every one is reported apart from its page) while the
    # pages are still being fetched.
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.2, r"^/(media|stream)/": 2.0})
    with small_tmpfs(tmp_path / "worker-small", "16m") as disk:
        async with await siteserver.start(site_dir, behaviour=slow) as server:
            config = cluster.master_config(tmp_path, [server.url + "/"], ["big", "small"],
                                           crawl={"max_depth": manifest.max_depth + 3},
                                           scheduling={"fault_timeout": 1.0})
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text("min_free_bytes: 0\nreport_wait: 0\nconcurrency: 4\ndownloads: 16\n")
            master = await cluster.start_master(config, tmp_path)
            addr = cluster.master_addr(config)
            # The small node first: on a site this small the first node to join could take all of it.
            small = await cluster.start_worker(addr, "small", tmp_path, config=wcfg)
            await cluster.until(lambda: "worker small joined" in master.log(), 30, "the small worker to join")
            big = await cluster.start_worker(addr, "big", tmp_path, config=wcfg)
            try:
                await cluster.until(lambda: len(pending_at(config, "small")) >= 3, 60,
                                    "the small worker to hold pending downloads")
                await asyncio.to_thread(fill, disk)
                held = pending_at(config, "small")
                await cluster.until(lambda: "cannot store what it fetches" in master.log(), 30,
                                    "the master to hear of the fault")
                await cluster.until(lambda: "pending downloads go to the live nodes" in master.log(), 30,
                                    "the master to hand the small worker's downloads on")
                assert await master.wait(120) == 0, master.log()[-3000:]
                assert await big.wait(30) == 0, big.log()[-3000:]
                assert await small.wait(30) == 0, small.log()[-3000:]
            finally:
                for proc in (master, big, small):
                    proc.kill()
            assert "can store again" not in small.log()   # the disk stayed full to the end
            # Every item is downloaded, its file on the disk of the node its row names.
            latest = {row["url"].rsplit("/", 1)[-1]: row for row in cluster.catalogue(tmp_path)}
            missing = [a.url for a in manifest.audio
                       if (row := latest.get(a.url.rsplit("/", 1)[-1])) is None or row["status"] != "ok"]
            assert not missing, f"{len(missing)} of {len(manifest.audio)} items not downloaded, e.g. {missing[:3]}"
            for row in latest.values():
                assert (tmp_path / f"worker-{row['node']}" / row["path"]).exists(), row
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        assert store.pending_count() == 0
    # Downloads the small node held when its disk filled were done by the big one.
    moved = {u for u in held if latest[u.rsplit("/", 1)[-1]]["node"] == "big"}
    assert moved, (held, {u: latest[u.rsplit("/", 1)[-1]]["node"] for u in held})
    assert "Traceback" not in master.log() and "Traceback" not in big.log() and "Traceback" not in small.log()


async def test_a_fault_only_a_download_meets_is_told_to_the_master_and_its_downloads_move(tmp_path):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=12, audio_size=256 * 1024, large_files=0)
    # Every page is fetched and reported long before a file's first byte comes.
    slow = siteserver.Behaviour(slow_paths={r"^/media/": 2.0})
    with small_tmpfs(tmp_path / "worker-small", "32m") as disk:
        async with await siteserver.start(site_dir, behaviour=slow) as server:
            config = cluster.master_config(tmp_path, [server.url + "/"], ["big", "small"],
                                           crawl={"max_depth": manifest.max_depth + 3},
                                           scheduling={"fault_timeout": 1.0})
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text("min_free_bytes: 0\nreport_wait: 0\nconcurrency: 4\ndownloads: 16\n")
            master = await cluster.start_master(config, tmp_path)
            addr = cluster.master_addr(config)
            # The small node first: on a site this small the first node to join could take all of it.
            small = await cluster.start_worker(addr, "small", tmp_path, config=wcfg)
            await cluster.until(lambda: "worker small joined" in master.log(), 30, "the small worker to join")
            big = await cluster.start_worker(addr, "big", tmp_path, config=wcfg)
            try:
                # Nothing queued or leased: every page is done (the level barrier keeps the next level queued).
                await cluster.until(lambda: (st := states(config)).get("queued", 0) == 0
                                    and st.get("leased", 0) == 0 and pending_at(config, "small"), 60,
                                    "every page done, downloads pending")
                # Room for the data dir's probe and small files, not for a song: the fault is the downloads' own.
                await asyncio.to_thread(fill, disk, 64 * 1024)
                held = pending_at(config, "small")
                await cluster.until(lambda: "cannot store what it fetches" in master.log(), 30,
                                    "the master to hear of the fault")
                assert await master.wait(120) == 0, master.log()[-3000:]
                assert await big.wait(30) == 0, big.log()[-3000:]
                assert await small.wait(30) == 0, small.log()[-3000:]
            finally:
                for proc in (master, big, small):
                    proc.kill()
            assert "hands them back" in small.log() and "can store again" not in small.log()
            latest = {row["url"].rsplit("/", 1)[-1]: row for row in cluster.catalogue(tmp_path)}
            missing = [a.url for a in manifest.audio
                       if (row := latest.get(a.url.rsplit("/", 1)[-1])) is None or row["status"] != "ok"]
            assert not missing, f"{len(missing)} of {len(manifest.audio)} items not downloaded, e.g. {missing[:3]}"
            for row in latest.values():
                assert (tmp_path / f"worker-{row['node']}" / row["path"]).exists(), row
    # What the small node held went to the big one (but a download that ended just as the disk filled).
    assert "pending downloads go to the live nodes" in master.log()
    assert held and [latest[u.rsplit("/", 1)[-1]]["node"] for u in held].count("big") >= len(held) // 2, held
    assert "Traceback" not in master.log() and "Traceback" not in big.log() and "Traceback" not in small.log()
