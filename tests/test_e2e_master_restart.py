"""The master is killed, corrupted and restarted; operators look at its state. Real processes throughout."""

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)



def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.master", *args], check=False, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=200)


async def test_master_sigkill_mid_crawl_then_restart_completes_with_bounded_duplicates(site, tmp_path, master_store,
                                                                                        until):
    site_dir, manifest = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.1}, record_log=True)
    concurrency, downloads = 4, 4
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"],
                                       listen=f"127.0.0.1:{cluster.free_port()}",
                                       crawl={"max_depth": manifest.max_depth + 3}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        opts = ["--concurrency", str(concurrency)]
        # The workers come back within a second of the restarted master listening: on a loaded machine its
        # whole remaining crawl can take less than a 30 s backoff, and a worker that missed it never hears the end.
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("reconnect_max_delay: 1.0\n")
        workers = [await cluster.start_worker(addr, n, tmp_path, config=wcfg, extra=opts) for n in ("w1", "w2")]
        html = sum(1 for p in manifest.pages if p.endswith(".html"))
        await cluster.until(lambda: sum(e.path.endswith(".html") for e in server.log) >= html // 3, 120, "a third")
        # While it runs, the operator commands read the live database.
        # The running master writes its live view every 2 s: wait for one taken after both workers joined.
        live: dict = {}

        def both_joined() -> bool:
            status = cli("status", "--config", str(config), "--json")
            assert status.returncode == 0, status.stderr
            live.update(json.loads(status.stdout))
            return live["nodes_connected"] == 2

        await until(both_joined, 60, "a live view with both workers", interval=0.5)
        assert live["urls"]["done"] > 0 and [n["node"] for n in live["nodes"]] == ["w1", "w2"]
        assert live["master"]["running"] and live["nodes_connected"] == 2
        assert sum(n["links"] for n in live["nodes"]) > 0
        assert sum(n["bytes"] for n in live["nodes"]) > 0
        done_before_kill = live["urls"]["done"]
        master.kill()                                      # SIGKILL: no commit, no snapshot, no goodbye
        await master.wait(10)
        dead = json.loads(cli("status", "--config", str(config), "--json").stdout)
        assert not dead["master"]["running"] and dead["nodes_connected"] == 0   # its last view is not trusted
        before = sum(e.path.endswith(".html") for e in server.log)
        master = await cluster.start_master(config, tmp_path, log_name="master2.log")
        assert await master.wait(240) == 0, master.log()[-3000:]
        for w in workers:
            assert await w.wait(60) == 0, w.log()[-2000:]
        log = list(server.log)

    assert before < html, "the crawl finished before the kill"
    # The restarted run's throughput divides the pages of this run by this run's time.
    lines = {line[:16].strip(): line[16:].strip() for line in master.stdout.decode().splitlines()[1:]}
    total, run = int(lines["pages fetched"]), int(lines["this run"].split()[0])
    elapsed, rate = float(lines["elapsed"].split()[0]), float(lines["throughput"].split()[0])
    assert done_before_kill <= total - run < total, (done_before_kill, total, run)
    assert abs(rate - run / elapsed) <= 0.1 + 0.05 * rate, (rate, run, elapsed)
    assert "rebuilt from the URL table" in master.log() or "Bloom filter loaded" in master.log()
    gets = Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".html"))
    lost = [p for p in manifest.pages if p.endswith(".html") and gets[p] == 0]
    assert not lost, f"{len(lost)} pages lost, e.g. {lost[:5]}"
    twice = sum(c - 1 for c in gets.values() if c > 1)
    in_flight_bound = 2 * (2 * concurrency + 2 * downloads)   # every worker's credit
    assert twice <= in_flight_bound, twice
    rows = cluster.catalogue(tmp_path)
    keys = Counter((r["url"], r["page"]) for r in rows)
    assert len(keys) == len(manifest.audio) and max(keys.values()) == 1, "catalogue rows lost or repeated"

    # After the master stopped: status and both export formats.
    status = cli("status", "--config", str(config))
    assert status.returncode == 0 and "master not running" in status.stdout, status.stdout
    assert "{" not in status.stdout and "None" not in status.stdout    # tables, not dicts
    jl = cli("export", "--config", str(config), "--format", "jsonl")
    assert jl.returncode == 0 and len(jl.stdout.splitlines()) == len(manifest.audio)
    csv_path = tmp_path / "cat.csv"
    c = cli("export", "--config", str(config), "--format", "csv", "-o", str(csv_path))
    assert c.returncode == 0 and len(csv_path.read_text().splitlines()) == len(manifest.audio) + 1


async def test_corrupt_bloom_snapshot_is_refused_and_rebuilt_without_refetching(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=20)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], crawl={"max_depth": 10})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        assert await master.wait(120) == 0
        assert await worker.wait(30) == 0
        first = len(server.log)
        bloom = tmp_path / "master" / "urls.bloom"
        data = bytearray(bloom.read_bytes())
        data[len(data) // 2] ^= 0xFF
        bloom.write_bytes(bytes(data))
        # A new seed makes the restarted master do something; the old pages must stay known.
        raw = yaml.safe_load(Path(config).read_text())
        raw["seeds"].append(server.url + "/about.html?again=1")
        Path(config).write_text(yaml.safe_dump(raw))
        master = await cluster.start_master(config, tmp_path, log_name="master2.log")
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        assert await master.wait(120) == 0
        assert await worker.wait(30) == 0
        again = [e.path for e in server.log[first:]]
    assert "snapshot refused" in master.log() and "rebuilt from the URL table" in master.log()
    assert again == ["/about.html?again=1"], again


async def test_refresh_crawls_old_pages_again_and_skips_unchanged_audio(tmp_path, master_store):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=10)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                       crawl={"max_depth": 10, "refresh_interval": 1.0}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        await cluster.until(lambda: Counter(e.path for e in server.log)["/"] >= 2, 60, "the home page to be refreshed")
        await cluster.until(lambda: Counter(e.path for e in server.log)["/list/1.html"] >= 2, 60, "a list page refreshed")
        await master.stop()
        await worker.stop()
        log = list(server.log)
    media = Counter(e.path for e in log if e.path.startswith("/media/") and e.status in (200, 206))
    assert media and max(media.values()) == 1, "unchanged audio was downloaded again"
