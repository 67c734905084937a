"""End to end: a real master and worker crawl a site of 40 pages until a limit stops them: crawl.max_pages,
crawl.max_bytes, crawl.max_duration (on a slow site, counted from the crawl's first start over a restart). Each ends
the crawl (or, with exit_when_done off, pauses it), and the log and `status --json` name the limit's key."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, siteserver

pytestmark = pytest.mark.timeout(120)

N = 40
PAGE_SIZE = 2000


def make_site(root: Path) -> None:
    root.mkdir()
    links = " ".join(f'<a href="/p{i}.html">{i}</a>' for i in range(N))
    (root / "index.html").write_text(f"<html><body>{links}</body></html>")
    for i in range(N):
        page = f"<html><body><p>page {i}</p>"
        (root / f"p{i}.html").write_text(page + " " * (PAGE_SIZE - len(page) - 15) + "</body></html>")


def status(config: Path) -> dict:
    return json.loads(cluster.operator("status", config, "--json"))


def limit_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "limit crawl." in line]


async def crawl(tmp_path: Path, master_store: dict, *, slow: float = 0.05, **crawl_keys) -> tuple:
    """Crawl until the master exits; (its rc, its log, the pages the site served, the config)."""
    site = tmp_path / "site"
    if not site.exists():
        make_site(site)
    behaviour = siteserver.Behaviour(record_log=True, slow_paths={r"^/p\d+\.html$": slow})
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], crawl=crawl_keys, **master_store)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "2"])
        rc = await master.wait(60)
        await worker.stop()
        served = [e.path for e in server.log if e.method == "GET" and e.path.startswith("/p")]
    return rc, master.log(), served, config


async def test_max_pages_ends_the_crawl_and_says_so(tmp_path, master_store):
    rc, log, served, config = await crawl(tmp_path, master_store, max_pages=5)
    assert rc == 0, log[-3000:]
    assert len(served) == 4      # the index and 4 of its pages: 5 handed out
    [line] = limit_lines(log)
    assert "crawl.max_pages reached" in line
    assert status(config)["limit"] == "crawl.max_pages"


async def test_max_bytes_ends_the_crawl_and_says_so(tmp_path, master_store):
    rc, log, served, config = await crawl(tmp_path, master_store, max_bytes=5 * PAGE_SIZE)
    assert rc == 0, log[-3000:]
    # The bytes are counted as reports come in: what was in flight still lands, then nothing more goes out.
    assert 4 <= len(served) < N, served
    [line] = limit_lines(log)
    assert "crawl.max_bytes reached" in line
    st = status(config)
    assert st["limit"] == "crawl.max_bytes"
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        assert store.fetched_bytes() >= 5 * PAGE_SIZE


async def test_max_duration_counts_from_the_first_start_over_a_restart(tmp_path, master_store):
    # A slow site: 1 s a page, two at a time: the whole site would take 20 s. The crawl ends at the limit, what is
    # in flight left for the next start.
    t0 = time.time()
    rc, log, served, config = await crawl(tmp_path, master_store, slow=1.0, max_duration=2.0)
    took = time.time() - t0
    assert rc == 0, log[-3000:]
    assert len(served) < N / 2 and took < 8, (served, took)
    [line] = limit_lines(log)
    assert "crawl.max_duration reached" in line
    assert status(config)["limit"] == "crawl.max_duration"
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        started = store.get_meta("crawl_started")
    assert t0 - 1 < started < t0 + took

    # Started again: the crawl's start is the first one, so the limit is reached at once and nothing is fetched.
    rc, log, served, config = await crawl(tmp_path, master_store, slow=1.0, max_duration=2.0)
    assert rc == 0, log[-3000:]
    assert served == [] and "crawl.max_duration reached" in limit_lines(log)[0]
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        assert store.get_meta("crawl_started") == started


async def test_a_limit_pauses_a_crawl_that_does_not_exit_when_done(tmp_path, master_store):
    site = tmp_path / "site"
    make_site(site)
    behaviour = siteserver.Behaviour(slow_paths={r"^/p\d+\.html$": 0.3})
    async with await siteserver.start(site, behaviour=behaviour) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                       crawl={"max_bytes": 3 * PAGE_SIZE}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "2"])
        try:
            await cluster.until(lambda: limit_lines(master.log()), 30, "the limit to be reached")
            [line] = limit_lines(master.log())
            assert "crawl.max_bytes reached" in line and "paused" in line
            st = await asyncio.to_thread(status, config)
            assert st["limit"] == "crawl.max_bytes" and st["paused"] is True, st
            assert st["urls"]["done"] < N + 1          # the site is not crawled through
            # The reports read the store beside the running master.
            [row] = [json.loads(line) for line in (await asyncio.to_thread(
                cluster.operator, "report", config, "hosts", "--format", "jsonl")).splitlines()]
            assert row["host"] == server.url.rstrip("/") and row["pages"] >= 3 and row["bytes"] >= 3 * PAGE_SIZE
        finally:
            await worker.stop()
            await master.stop()
