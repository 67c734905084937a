"""End to end against a hostile site: real master and worker processes, one class of attack per crawl.

Each crawl shows the same four things: the worker kept serving (no heartbeat missed: the master never declared
it dead), the legitimate pages and audio of the same crawl all came through, both daemons' memory stayed
bounded (VmRSS sampled from /proc all along), and the hostile URLs were recorded for what they are, as
permanent errors where retrying cannot help, with nothing left queued or leased.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import yaml

from crawler.master.store import DONE, ERROR, ROBOTS
from testkit import cluster
from tests.fakes.hostile import LEGIT, HostileSite, mp3

pytestmark = pytest.mark.timeout(300)

MiB = 1024 * 1024
# Far above what a worker or the master needs for these crawls (about 60-100 MiB), far below what any of the
# attacks costs unbounded (256 MiB per decoded layer, 10 MiB of trickled audio held, gigabytes of parse state).
MAX_RSS = 250 * MiB
WORKER = {"concurrency": 8, "fetch_timeout": 3.0, "download_timeout": 2.0, "download_min_rate": 10_000_000}


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


async def crawl(tmp_path: Path, site: HostileSite, scenario: str, *, obey_robots: bool = False) -> dict:
    """One crawl of the scenario to its end; returns the peak RSS of each daemon and their logs."""
    config = cluster.master_config(tmp_path, [f"{site.url}/s/{scenario}/"], ["w1"],
                                   politeness={"obey_robots": obey_robots, "robots_timeout": 3.0})
    wcfg = tmp_path / "worker.yaml"
    wcfg.write_text(yaml.safe_dump(WORKER))
    master = await cluster.start_master(config, tmp_path)
    worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
    peak = {"master": 0, "worker": 0}

    async def watch() -> None:
        while True:
            peak["master"] = max(peak["master"], rss(master.proc.pid))
            peak["worker"] = max(peak["worker"], rss(worker.proc.pid))
            await asyncio.sleep(0.05)     # the sampling period of the peak memory measured, not a wait for anything

    watcher = asyncio.ensure_future(watch())
    try:
        assert await master.wait(180) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]
    finally:
        watcher.cancel()
        await master.stop()
        await worker.stop()
    return {"peak": peak, "master_log": master.log(), "worker_log": worker.log()}


def urls(tmp_path: Path) -> dict[str, tuple[int, str | None, int]]:
    """url -> (state, error, attempts), from the master's database after it stopped."""
    with sqlite3.connect(tmp_path / "master" / "master.db") as db:
        return {u: (s, e, a) for u, s, e, a in db.execute("SELECT url, state, error, attempts FROM urls")}


def assert_kept_serving(run: dict, tmp_path: Path, site: HostileSite, scenario: str) -> None:
    assert "declaring it dead" not in run["master_log"], run["master_log"][-3000:]
    assert "connection to the master lost" not in run["worker_log"], run["worker_log"][-3000:]
    assert run["peak"]["worker"] < MAX_RSS and run["peak"]["master"] < MAX_RSS, run["peak"]
    assert run["peak"]["worker"] > 0 and run["peak"]["master"] > 0     # the watcher saw the processes
    table = urls(tmp_path)
    for page in site.legit_pages(scenario):
        assert table[site.url + page][0] == DONE, (page, table.get(site.url + page))
    rows = {r["url"]: r for r in cluster.catalogue(tmp_path)}
    for path, data in site.legit_audio(scenario).items():
        row = rows[site.url + path]
        assert row["status"] == "ok" and row["size"] == len(data), row
    assert not [u for u, (state, _, _) in table.items() if state not in (DONE, ERROR)], "work left behind"


def hostile_url(site: HostileSite, scenario: str, page: str) -> str:
    return f"{site.url}/s/{scenario}/{page}"


async def test_stacked_encodings_are_refused_and_one_layer_is_cut(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "encoding")
    assert_kept_serving(run, tmp_path, site, "encoding")
    table = urls(tmp_path)
    for page in ("stacked.html", "stacked-lines.html"):
        state, error, _ = table[hostile_url(site, "encoding", page)]
        assert state == ERROR and "stacked content encodings" in error, (page, error)
        assert site.hits[f"/s/encoding/{page}"] == 1             # permanent: not handed out again
    assert "pages refused: body refused 2" in run["worker_log"]
    # One honest layer: the page is kept, cut at the page cap, not refused.
    assert table[hostile_url(site, "encoding", "one-layer.html")][0] == DONE


async def test_pathological_markup_is_a_permanent_error_counted_by_reason(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "markup")
    assert_kept_serving(run, tmp_path, site, "markup")
    table = urls(tmp_path)
    for page, reason in (("deep.html", "nested deeper than"), ("deep-stray.html", "nested deeper than"),
                         ("links.html", "more than 100000 tags")):
        state, error, _ = table[hostile_url(site, "markup", page)]
        assert state == ERROR and "page too complex" in error and reason in error, (page, error)
        assert site.hits[f"/s/markup/{page}"] == 1              # permanent: not handed to a worker again
    assert "pages refused: page too complex 3" in run["worker_log"]


async def test_a_trickling_page_and_download_are_cut_off_by_their_deadlines(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "trickle")
    assert_kept_serving(run, tmp_path, site, "trickle")
    state, error, _ = urls(tmp_path)[hostile_url(site, "trickle", "trickle.html")]
    assert state == ERROR and "Timeout" in error, error
    row = next(r for r in cluster.catalogue(tmp_path) if r["url"].endswith("/trickle.mp3"))
    assert row["status"] == "failed" and row["reason"].startswith("download too slow"), row


async def test_private_addresses_are_never_requested(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "ssrf")
        private_hits = dict(site.private_hits)
    assert_kept_serving(run, tmp_path, site, "ssrf")
    assert private_hits == {}, private_hits
    rows = [r for r in cluster.catalogue(tmp_path) if r["page"].endswith("/ssrf.html")]
    assert len(rows) == 4, rows
    for r in rows:
        assert r["status"] == "failed" and "outside the public internet" in r["reason"], r
    assert not [u for u in urls(tmp_path) if "admin.html" in u]     # another port of the seed's host: out of scope


async def test_bodies_that_are_not_audio_are_not_catalogued_ok(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "not_audio")
    assert_kept_serving(run, tmp_path, site, "not_audio")
    rows = [r for r in cluster.catalogue(tmp_path) if r["page"].endswith("/fake.html")]
    assert {r["url"].rsplit("/", 1)[1] for r in rows} == {"error.mp3", "tool.mp3"}
    assert all(r["status"] == "failed" and r["reason"] == "not audio" and not r.get("sha256") for r in rows), rows
    stored = list((tmp_path / "worker-w1" / "audio").rglob("*.mp3"))
    assert len(stored) == LEGIT and all(p.read_bytes() != mp3(99) for p in stored)


@pytest.mark.parametrize("robots", ["stacked", "huge", "trickle", "private"])
async def test_the_masters_robots_fetch_is_bounded(tmp_path, robots):
    async with HostileSite(robots=robots) as site:
        run = await crawl(tmp_path, site, "not_audio", obey_robots=True)
        private_hits = dict(site.private_hits)
    assert private_hits == {}, private_hits
    assert "declaring it dead" not in run["master_log"]
    assert run["peak"]["master"] < MAX_RSS and run["peak"]["worker"] < MAX_RSS, run["peak"]
    table = urls(tmp_path)
    assert not [u for u, (state, _, _) in table.items() if state not in (DONE, ERROR, ROBOTS)]
    if robots == "huge":
        # 500 KiB of rules, cut to the rule cap: the one real rule holds, the site is crawled.
        assert_kept_serving(run, tmp_path, site, "not_audio")
    else:
        # Refused or cut off: robots.txt is unreachable, which RFC 9309 reads as "disallow all" for a while.
        # The crawl ends instead of waiting for ever, every page recorded.
        assert "robots.txt of" in run["master_log"] and "not fetched" in run["master_log"]
        seed = f"{site.url}/s/not_audio/"
        assert table[seed] == (ROBOTS, "disallowed by robots.txt", table[seed][2])


async def test_hostile_gzip_sitemaps_keep_what_came_before_their_cap_with_bounded_memory(tmp_path):
    async with HostileSite() as site:
        run = await crawl(tmp_path, site, "xml")
    assert_kept_serving(run, tmp_path, site, "xml")
    table = urls(tmp_path)
    for name in ("deep", "attrs"):
        assert table[hostile_url(site, "xml", f"{name}.xml.gz")][0] == DONE
        # The entries before the cap were read and crawled; the rest of the document was not built.
        for page in site.sitemap_pages(name):
            assert table[site.url + page][0] == DONE, (page, table.get(site.url + page))
    log = run["worker_log"]
    assert "nested deeper than" in log and "attributes" in log and "Traceback" not in log
    assert log.count("sitemap read in part") == 2
