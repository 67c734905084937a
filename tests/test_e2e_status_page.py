"""The status page in a real headless Chromium during a real crawl: it draws the node table and the rates, they
move between two loads, and a screenshot is kept as the test's artifact. A paused crawl and a worker with a
full disk are shown as such, and the refresh cycle's tile stays on one line (and away with refresh off)."""

import asyncio
import os
import re
import shutil

import pytest
from playwright.async_api import async_playwright

from testkit import cluster, sitegen, siteserver
from testkit.browser import chromium
from tests.disks import small_tmpfs
from tests.test_e2e_faulted_node import fill

pytestmark = pytest.mark.timeout(300)


async def figures(page) -> dict:
    """What the operator reads off the page: the tiles and the node table, as text."""
    await page.wait_for_selector("#nodes td", timeout=30_000)
    tiles = await page.eval_on_selector_all(
        "#tiles .tile", "ts => Object.fromEntries(ts.map(t => [t.querySelector('.l').textContent, "
                        "t.querySelector('.v').textContent]))")
    nodes = await page.eval_on_selector_all(
        "#nodes tr", "rs => rs.slice(1).map(r => Array.from(r.cells).map(c => c.textContent))")
    head = await page.eval_on_selector_all("#nodes tr:first-child > *", "cs => cs.map(c => c.textContent)")
    return {"tiles": tiles, "nodes": nodes, "head": head}


async def test_status_page_in_headless_chromium_shows_the_crawl_moving(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=150)
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.2})   # a crawl of about 20 s: still going at the 2nd load
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], exit_when_done=False,
                                       crawl={"max_depth": 8})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "3"])
        url = cluster.web_url(config) + "/?refresh=1"
        try:
            async with async_playwright() as pw, chromium(pw) as browser:
                page = await browser.new_page(viewport={"width": 1400, "height": 1100})
                errors: list[str] = []       # the page runs under the server's CSP: nothing of it may be refused
                page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                response = await page.goto(url)
                assert "script-src 'self'" in (await response.all_headers())["content-security-policy"]
                await page.wait_for_function(
                    "() => /[1-9]/.test(document.querySelector('#tiles .tile .v')?.textContent || '')",
                    timeout=60_000)
                first = await figures(page)
                await page.wait_for_timeout(3000)    # the crawl moves on; a fresh load must show it
                await page.reload()
                await page.wait_for_function(
                    "(before) => { const v = document.querySelector('#tiles .tile .v'); "
                    "return v && v.textContent !== '–' && v.textContent !== before; }",
                    arg=first["tiles"]["pages fetched"], timeout=60_000)
                await page.wait_for_timeout(1500)    # one more refresh: the chart and the audio list filled in
                second = await figures(page)
                shot = tmp_path / "status-page.png"
                await page.screenshot(path=str(shot), full_page=True)
        finally:
            await master.stop()
            await worker.stop()

    assert not errors, errors
    print(f"\nstatus page screenshot: {shot}")
    if os.environ.get("CRAWLER_TEST_ARTIFACTS"):
        shutil.copy(shot, os.environ["CRAWLER_TEST_ARTIFACTS"])
    assert shot.stat().st_size > 20_000
    # The node table: the worker that runs is connected, the configured one that never came is not.
    rows = {r[0]: r for r in second["nodes"]}
    assert rows["w1"][1] == "connected" and rows["w2"][1] == "disconnected", second["nodes"]
    # Refresh is off: no tile for its cycles.
    assert not any("refresh cycle" in k or "new / changed" in k for k in second["tiles"]), second["tiles"]
    # Between the two loads the crawl moved: pages fetched grew, and w1's row with it.
    as_int = lambda s: int(s.replace(",", ""))
    assert as_int(second["tiles"]["pages fetched"]) > as_int(first["tiles"]["pages fetched"]), (first, second)
    assert as_int(rows["w1"][5]) > as_int({r[0]: r for r in first["nodes"]}["w1"][5])
    # Each worker's fingerprint backlog, as its last heartbeat said.
    assert as_int(rows["w1"][second["head"].index("to fingerprint")]) >= 0, second
    assert second["tiles"]["pages / min"] != first["tiles"]["pages / min"], (first, second)


async def test_status_page_shows_a_paused_crawl_and_a_worker_with_a_full_disk(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=40)
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.3})
    with small_tmpfs(tmp_path / "worker-small", "8m") as disk:
        async with await siteserver.start(site_dir, behaviour=slow) as server:
            # Refresh on: the tile of its cycle shows (this cycle's changes so far).
            config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "small"],
                                           exit_when_done=False,
                                           crawl={"max_depth": 8, "refresh_interval": 3600})
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text("min_free_bytes: 0\nconcurrency: 2\n")
            master = await cluster.start_master(config, tmp_path)
            addr = cluster.master_addr(config)
            w1 = await cluster.start_worker(addr, "w1", tmp_path, config=wcfg)
            small = await cluster.start_worker(addr, "small", tmp_path, config=wcfg)
            try:
                await cluster.until(lambda: "worker small joined" in master.log(), 30,
                                    "the small worker to join")
                await asyncio.to_thread(fill, disk)
                await cluster.until(lambda: "cannot store what it fetches" in master.log(), 30,
                                    "the master to hear of the fault")
                await asyncio.to_thread(cluster.operator, "pause", config)
                async with async_playwright() as pw, chromium(pw) as browser:
                    page = await browser.new_page(viewport={"width": 1400, "height": 1100})
                    await page.goto(cluster.web_url(config) + "/?refresh=1")
                    await page.wait_for_selector("#state .paused", timeout=30_000)
                    state = await page.text_content("#state")
                    shown = await figures(page)
                    # The refresh tile's value is one line: no taller than a plain figure's.
                    heights = await page.eval_on_selector_all(
                        "#tiles .tile",
                        "ts => Object.fromEntries(ts.map(t => [t.querySelector('.l').textContent, "
                        "t.querySelector('.v').getBoundingClientRect().height]))")
                    cycle_sub = await page.eval_on_selector_all(
                        "#tiles .tile",
                        "ts => ts.filter(t => t.querySelector('.l').textContent === "
                        "'new / changed / removed').map(t => t.querySelector('.s').textContent)[0]")
                    await page.screenshot(path=str(tmp_path / "status-page-paused.png"), full_page=True)
            finally:
                await master.stop()
                await w1.stop()
                await small.stop()

    assert "paused" in state and "1 faulted" in state, state
    rows = {r[0]: r for r in shown["nodes"]}
    assert rows["w1"][1] == "connected", shown["nodes"]
    assert rows["small"][1].startswith("fault: No space left on device"), shown["nodes"]
    label = "new / changed / removed"
    assert cycle_sub == "this refresh cycle", cycle_sub
    assert re.fullmatch(r"[\d,]+ / [\d,]+ / [\d,]+", shown["tiles"][label]), shown["tiles"]
    assert heights[label] <= heights["pages fetched"], heights
