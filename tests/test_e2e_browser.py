"""End to end with real Chromium: a real master and worker crawl a site whose audio appears only through scripts.

The three songs of testkit/playersite.py (an address assembled in JavaScript, a signed address an API hands
the player after a click, an AES-128 encrypted HLS stream) must all be catalogued and downloaded, with the right
bytes; nothing else may become an item, and the browser must not visit pages without a player nor fetch
images and fonts.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crawler.archive import evidence
from testkit import cluster
from testkit.browser import TEST_BROWSER_ARGS, TEST_BROWSER_USER
from testkit import playersite
from tests.store_reads import url_info

pytestmark = pytest.mark.timeout(240)
BIN = Path(sys.executable).parent



def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_scripted_signed_and_hls_audio_are_catalogued_and_downloaded(tmp_path):
    site = playersite.PlayerSite()
    async with playersite.serve(site) as base:
        config = cluster.master_config(tmp_path, [base + "/"], ["b1"], crawl={"max_depth": 2})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 4, "user_agent": "SiteTestBrowser/1.0", "resolvers": {
            "browser": {"max_pages": 2, "page_timeout": 60, "args": TEST_BROWSER_ARGS, "user": TEST_BROWSER_USER},
            "generic": {}}}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "b1", tmp_path, config=wcfg)
        assert await master.wait(180) == 0, master.log()[-3000:] + worker.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]

    rows = cluster.catalogue(tmp_path)
    expected = {
        "Assembled Song": ("Script Artist", sha(site.assembled), f"{base}/m/a7f3.mp3"),
        "Signed Song": ("API Artist", sha(site.signed), f"{base}/stream/"),
        "Streamed Song": ("HLS Artist", sha(site.stream.plain), f"{base}/hls/s3/index.m3u8"),
    }
    assert sorted(r["title"] for r in rows) == sorted(expected), rows     # nothing false, nothing missing
    data_dir = tmp_path / "worker-b1"
    for row in rows:
        artist, digest, url = expected[row["title"]]
        assert (row["artist"], row["status"], row["resolver"]) == (artist, "ok", "browser"), row
        assert row["sha256"] == digest, row
        assert row["url"].startswith(url) and row["page"].startswith(f"{base}/song/"), row
        stored = data_dir / row["path"]
        assert stored.is_file() and sha(stored.read_bytes()) == digest
    hls_row = next(r for r in rows if r["title"] == "Streamed Song")
    assert hls_row["extra"]["format"] == "hls" and hls_row["size"] == len(site.stream.plain)
    assert hls_row["path"].endswith(".aac")
    # The player's signature was accepted, and the signed stream served the worker with the browser's identity.
    assert site.api_calls and site.bad_signatures == 0 and site.stream_denied == 0
    # The browser ran only where a player shows, and fetched no images or fonts.
    paths = site.paths()
    assert "/static/song1.js" in paths and "/static/about.js" not in paths
    assert "/more" in paths          # linked only from what a script added to the page
    assert not any(p.startswith("/img/") or p.endswith(".woff2") for p in paths)
    assert not list(Path(data_dir / "audio" / "partial").glob("*.part"))
    # Evidence: each row's chain is in the worker's archive (the page, the browser's view of it with the API call
    # that signed the address, the rendered DOM and a screenshot, the audio or the HLS segments, the stored file),
    # every archive file passes warcio's check, and a bundle of all rows passes wacz's.
    for f in sorted((data_dir / "archive").glob("*.warc.gz")):
        check = subprocess.run([str(BIN / "warcio"), "check", str(f)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
    for row in rows:
        [chain] = evidence.find_chains(evidence.open_index(data_dir), [row["sha256"]])
        kinds = {(r.role, r.kind) for r in chain.records}
        targets = {r.target for r in chain.records}
        assert {("page", "response"), ("browser", "response"), ("browser", "resource"),
                ("audio", "metadata")} <= kinds, (row["title"], kinds)
        assert f"urn:view:{row['page']}" in targets and f"urn:dom:{row['page']}" in targets, targets
        if row["title"] == "Signed Song":
            assert any(r.role == "browser" and "/api/" in r.target for r in chain.records), targets
        if row["title"] == "Streamed Song":
            assert ("segment", "revisit") in kinds or ("segment", "response") in kinds, kinds
    out = tmp_path / "player.wacz"
    made = subprocess.run([sys.executable, "-m", "crawler.worker", "evidence", "--data-dir", str(data_dir),
                           "--out", str(out), *sorted(r["sha256"] for r in rows)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr
    valid = subprocess.run([str(BIN / "wacz"), "validate", "-f", str(out)], capture_output=True, text=True,
                           timeout=120, check=False)
    assert valid.returncode == 0, valid.stdout + valid.stderr


async def test_a_browser_that_cannot_run_gives_pages_back_to_be_retried(tmp_path):
    """The browser is this node's part: when it cannot start, the pages that need it are retried, not lost and
    not recorded as done; the other pages are crawled as usual."""
    from crawler.master.store import MasterStore

    site = playersite.PlayerSite()
    async with playersite.serve(site) as base:
        config = cluster.master_config(tmp_path, [base + "/"], ["b1"], crawl={"max_depth": 2, "max_attempts": 2})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 4, "resolvers": {
            "browser": {"executable": "/bin/false", "start_timeout": 10, "args": TEST_BROWSER_ARGS,
                        "user": TEST_BROWSER_USER}}}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "b1", tmp_path, config=wcfg)
        assert await master.wait(180) == 0, master.log()[-3000:] + worker.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]

    store = MasterStore.open_readonly(tmp_path / "master" / "master.db")
    try:
        for song in ("/song/1", "/song/2", "/song/3"):
            info = url_info(store, base + song)
            assert info is not None and info["state"] == "error" and info["attempts"] == 2, info
            assert "resolver unavailable" in (info["error"] or ""), info
        about = url_info(store, base + "/about")
        assert about is not None and about["state"] == "done", about
    finally:
        store.close()
    assert cluster.catalogue(tmp_path) == []


async def test_the_workers_browser_is_confined_to_the_crawls_addresses(tmp_path):
    """A crawled page's script opens a WebSocket and POSTs to internal.test (a name that resolves to loopback)
    and to another port of 127.0.0.1: the worker's browser, sandboxed as its own user, reaches neither; the
    page's own address (the seed's) it reaches."""
    site = playersite.PlayerSite()
    async with playersite.serve(site) as base, playersite.serve_internal() as (port, hits):
        config = cluster.master_config(tmp_path, [f"{base}/reach?port={port}"], ["b1"], crawl={"max_depth": 1})
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"concurrency": 2, "resolvers": {"browser": {
            "page_timeout": 30, "settle": 1.0, "args": playersite.REACH_ARGS, "user": TEST_BROWSER_USER}}}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "b1", tmp_path, config=wcfg)
        assert await master.wait(120) == 0, master.log()[-3000:] + worker.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]
    assert "/static/reached" in site.paths(), worker.log()[-3000:]     # the script ran to its end
    assert hits == []
    log = worker.log()
    assert f"user {TEST_BROWSER_USER})" in log and f"refused CONNECT internal.test:{port}" in log, log[-3000:]
