"""End to end, real processes: a crawl ten times bigger than the master's Bloom filter was sized for loses nothing,
and the master says the filter grew (log, `status --json`, /metrics, the status page); a restart reloads every layer."""

import asyncio
import json
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)

FIRST_CAPACITY = 45   # URLs; the site below puts about eleven times as many (491) through the filter


def status_json(config) -> dict:
    done = subprocess.run([sys.executable, "-m", "crawler.master", "status", "--config", str(config), "--json"],
                          check=True, capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


def gauges(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("crawler_bloom_")}


async def settled(client: httpx.AsyncClient, want_audio: int, timeout: float) -> dict:
    """The status once every audio item is in the catalogue and nothing is queued, held, at a worker or pending."""
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        st = (await client.get("/api/status")).json()
        u = st["urls"]
        if (sum(st["audio"].values()) >= want_audio and u["waiting_at_master"] == 0 and u["at_workers"] == 0
                and st["downloads_pending"] == 0):
            return st
        await asyncio.sleep(0.3)
    raise AssertionError(f"the crawl did not find every audio item: {sum(st['audio'].values())} of {want_audio}; "
                         f"last status {st}")


async def test_a_crawl_ten_times_over_the_first_capacity_finds_every_item_and_says_the_filter_grew(tmp_path):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=300)
    async with await siteserver.start(site_dir) as server:
        base = server.url
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], exit_when_done=False,
                                       crawl={"max_depth": manifest.max_depth + 3},
                                       dedup={"expected_urls": FIRST_CAPACITY, "fp_rate": 1e-6,
                                              "snapshot_interval": 3600})
        master = await cluster.start_master(config, tmp_path)
        workers = [await cluster.start_worker(cluster.master_addr(config), n, tmp_path,
                                              extra=["--concurrency", "8"]) for n in ("w1", "w2")]
        try:
            async with httpx.AsyncClient(base_url=cluster.web_url(config), timeout=30) as client:
                st = await settled(client, len(manifest.audio), 200)
                metrics = gauges((await client.get("/metrics")).text)
                page = (await client.get("/")).text
            # `status --json` reads the view the running master writes every 2 s: wait for one taken now.
            now = time.time()
            live = tmp_path / "master" / "live.json"
            await cluster.until(lambda: json.loads(live.read_text())["written_at"] > now, 30, "a fresh live view")
            cli = status_json(config)
        finally:
            await master.stop()
            for w in workers:
                await w.stop()

    # Every audio item of the site is catalogued, once.
    rows = cluster.catalogue(tmp_path)
    found = {(r["url"].removeprefix(base), r["page"].removeprefix(base)) for r in rows}
    missing = [a for a in manifest.audio if (a.url, a.page) not in found]
    assert not missing, f"{len(missing)} audio items missing, e.g. {missing[:3]}"
    assert len(rows) == len(manifest.audio)
    # The filter grew well past its first capacity and kept its rate.
    d = cli["dedup"]
    assert d == st["dedup"] or d["urls"] >= st["dedup"]["urls"]
    assert d["first_capacity"] == FIRST_CAPACITY and d["urls"] >= 10 * FIRST_CAPACITY, d
    assert d["layers"] > 1 and d["capacity"] >= d["urls"] and 0 < d["fp_estimate"] <= d["fp_rate"] == 1e-6, d
    assert metrics["crawler_bloom_urls"] == st["dedup"]["urls"]
    assert metrics["crawler_bloom_capacity_urls"] == st["dedup"]["capacity"] > FIRST_CAPACITY
    assert 0 < metrics["crawler_bloom_fp_estimate"] <= 1e-6
    assert "Seen-set (Bloom filter)" in page
    # One WARNING when it first outgrew expected_urls; the later layers are INFO.
    log = master.log()
    warnings = [line for line in log.splitlines() if "grew past its first capacity" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0] and f"of {FIRST_CAPACITY} URLs" in warnings[0], warnings
    # (one line per batch that grew it: a report's links can fill more than one small layer)
    assert 1 <= log.count("INFO crawler.master: Bloom filter grew: ") <= d["layers"] - 2

    # The stop saved every layer: a restart loads them instead of rebuilding from the URL table, and the
    # offline status still shows them.
    stopped = status_json(config)
    assert not stopped["master"]["running"] and stopped["dedup"]["layers"] == d["layers"]
    master = await cluster.start_master(config, tmp_path, log_name="master2.log")
    await master.stop()
    again = master.log()
    assert "Bloom filter loaded" in again and f"{d['layers']} layers" in again, again[-2000:]
    assert "rebuilt" not in again
