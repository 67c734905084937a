"""End to end with real processes: what an operator meets over days of crawling.

A worker's disk fills up; a second machine claims a connected id; a worker has the wrong secret or an id the master
does not know; the operator pauses, resumes, seeds and retries a running crawl; a worker runs on `--master` alone.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.disks import fill, small_tmpfs, unfill
from crawler.master.store import MasterStore
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=200)




def failed_urls(config: Path) -> list[dict]:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return list(store.failed())


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line]


def master_cmd(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.master", *args, "--config", str(config)],
                          capture_output=True, text=True, timeout=120, check=False)


async def master_cmd_async(config: Path, *args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(master_cmd, config, *args)


# ------------------------------------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path):
    """The small worker's data dir on a tmpfs of its own, which the test fills and frees."""
    with small_tmpfs(tmp_path / "worker-small", "64m") as mnt:
        yield mnt


def node_row(config: Path, node: str) -> dict:
    status = json.loads(master_cmd(config, "status", "--json").stdout)
    return next(n for n in status["nodes"] if n["node"] == node)


async def test_full_disk_stops_the_worker_not_the_urls_and_it_resumes_when_space_returns(site, tmp_path,
                                                                                          small_disk):
    site_dir, manifest = site
    # The song pages past the home page's ten (the crawl's second level) stall until the test lets them go:
    # each worker then holds tasks it has not started, and the disk fills under them.
    songs = asyncio.Event()
    stall = siteserver.Behaviour(gates={r"^/song/(?!([1-9]|10)\.html$)": songs}, record_log=True)
    async with await siteserver.start(site_dir, behaviour=stall) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["big", "small"],
                                       crawl={"max_depth": manifest.max_depth + 3})
        wcfg = tmp_path / "worker.yaml"
        # Long timeouts: a stalled page is waited for, not retried.
        wcfg.write_text("min_free_bytes: 0\nconcurrency: 4\nread_timeout: 240\nfetch_timeout: 240\n")
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        big = await cluster.start_worker(addr, "big", tmp_path, config=wcfg)
        small = await cluster.start_worker(addr, "small", tmp_path, config=wcfg)
        # Eight stalled: each worker's four page slots (concurrency 4) are taken, and the rest of the small
        # worker's share of the level (some sixty tasks) waits for a slot, not started.
        await cluster.until(lambda: len(server.stalled) >= 8, 90, "both workers to stall on song pages",
                            master, small)
        await asyncio.to_thread(fill, small_disk)
        await cluster.until(lambda: "stops taking tasks" in small.log(), 30, "the small worker to see its disk full")
        await cluster.until(lambda: "cannot store what it fetches" in master.log(), 30, "the master to hear of it")
        # The rest of the crawl waits for the small worker to come back: on a loaded machine the big one could
        # otherwise finish it first, and the small one would find nothing left to fetch.
        r = await master_cmd_async(config, "pause")
        assert r.returncode == 0 and "applied by the running master" in r.stdout, r
        songs.set()
        # The pages it was fetching end (stored or handed back); the tasks it had not started go back.
        await cluster.until(lambda: node_row(config, "small")["handed_back"] >= 8, 60,
                            "the small worker to hand back what it had not started", master, small)
        # Space comes back: the worker finds out by itself and takes work again.
        await asyncio.to_thread(unfill, small_disk)
        await cluster.until(lambda: "can store again" in small.log(), 30, "the small worker to resume")
        await cluster.until(lambda: "worker small can store again" in master.log(), 30, "the master to hear of it")
        assert states(config)["queued"] > 0, "nothing left for the small worker: the test proves nothing"
        fetched_at_fault = len(cluster.pages_of(tmp_path, "small"))   # paused: it fetches nothing new until resumed
        r = await master_cmd_async(config, "resume")
        assert r.returncode == 0 and "applied by the running master" in r.stdout, r
        await cluster.until(lambda: len(cluster.pages_of(tmp_path, "small")) > fetched_at_fault, 60,
                            "the small worker to fetch pages again")
        assert await master.wait(240) == 0, master.log()[-3000:]
        assert await big.wait(30) == 0
        assert await small.wait(30) == 0
        log = list(server.log)

    assert failed_urls(config) == []
    assert len(error_lines(small.log())) == 1, small.log()[-3000:]
    assert "No space left on device" in error_lines(small.log())[0]
    assert "Traceback" not in small.log() and "Traceback" not in master.log()
    gets = Counter(e.path for e in log if e.method == "GET" and e.path.endswith(".html"))
    lost = [p for p in manifest.pages if p.endswith(".html") and gets[p] == 0]
    assert not lost, f"{len(lost)} pages never fetched, e.g. {lost[:5]}"
    found = {row["url"].rsplit("/", 1)[-1] for row in cluster.catalogue(tmp_path) if row["status"] == "ok"}
    missing = [a.url for a in manifest.audio if a.url.rsplit("/", 1)[-1] not in found]
    assert not missing, f"{len(missing)} audio items lost, e.g. {missing[:3]}"
    small_stats = node_row(config, "small")
    # The eight or more it had not started, at the least.
    assert small_stats["faults"] >= 1 and small_stats["handed_back"] >= 8, small_stats


# ------------------------------------------------------------------------------------------- refusals
async def test_duplicate_id_wrong_secret_and_unknown_id_exit_2_while_the_first_worker_crawls(site, tmp_path):
    site_dir, manifest = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.05})
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"],
                                       crawl={"max_depth": manifest.max_depth + 3})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        first = await cluster.start_worker(addr, "w1", tmp_path, extra=["--concurrency", "4"])
        await cluster.until(lambda: len(cluster.pages_of(tmp_path, "w1")) >= 5, 60, "w1 to crawl")

        clone_dir = tmp_path / "clone"
        clone_dir.mkdir()
        clone = await cluster.start_worker(addr, "w1", clone_dir, secret=tmp_path / "secret")
        wrong = cluster.write_secret(tmp_path / "wrong-secret", "Q7mZk2Rx9Lw4Tp8Vn3Hs6Jd1Fb5Gc0Ye")
        intruder = await cluster.start_worker(addr, "w2", tmp_path, secret=wrong)
        stranger = await cluster.start_worker(addr, "w9", tmp_path)
        for proc, words in ((clone, "already connected"), (intruder, "authentication failed"),
                            (stranger, "not in the master's nodes list")):
            assert await proc.wait(60) == 2, proc.log()
            errors = error_lines(proc.log())
            assert len(errors) == 1 and words in errors[0], proc.log()
            assert "Traceback" not in proc.log() and "WARNING" not in proc.log()
        assert await master.wait(240) == 0, master.log()[-3000:]
        assert await first.wait(30) == 0

    assert failed_urls(config) == []
    assert "w1 connected again" not in master.log()
    assert len(set(cluster.pages_of(tmp_path, "w1"))) >= sum(1 for p in manifest.pages if p.endswith(".html")) - 2


# ------------------------------------------------------------------------------------------- steering
def states(config: Path) -> dict[str, int]:
    with MasterStore.open_readonly(cluster.store_of(config)) as store:
        return store.status()["states"]


def html_gets(server) -> int:
    return sum(1 for e in server.log if e.path.endswith(".html"))


async def test_pause_resume_seed_and_retry_on_a_running_master(tmp_path, master_store):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=60)
    # Every song page fails (HTTP 500: given up at once with max_attempts 1) until the site is fixed.
    broken = siteserver.Behaviour(status_overrides={r"^/song/": 500}, record_log=True,
                                  slow_paths={r"\.html$": 0.3})
    server = await siteserver.start(site_dir, behaviour=broken)
    try:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                       crawl={"max_depth": manifest.max_depth + 3, "max_attempts": 1}, **master_store)
        master = await cluster.start_master(config, tmp_path)
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text("concurrency: 4\nmax_tasks: 24\n")
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
        await cluster.until(lambda: html_gets(server) >= 8, 90, "the crawl to get going")

        r = await master_cmd_async(config, "pause")
        assert r.returncode == 0 and "paused (applied by the running master)" in r.stdout, r
        at_pause = html_gets(server)
        # What the worker held when the pause came (at most its credit, max_tasks) still finishes.
        settled = at_pause
        while True:
            await asyncio.sleep(1.0)     # settled is a second without a fetch: an absence only time can show
            if html_gets(server) == settled:
                break
            settled = html_gets(server)
        assert settled - at_pause <= 24, (at_pause, settled)
        assert settled < len(manifest.pages) - 10, "nothing left to hold back: the test proves nothing"
        await asyncio.sleep(1.0)         # the behaviour under test: nothing more for a while (two heartbeats)
        assert html_gets(server) == settled, "work was handed out while paused"

        r = await master_cmd_async(config, "resume")
        assert r.returncode == 0 and "resumed (applied by the running master)" in r.stdout, r
        await cluster.until(lambda: html_gets(server) > settled, 30, "work to flow again after resume")

        await cluster.until(lambda: (st := states(config))["queued"] == 0 and st["leased"] == 0, 120,
                            "the first pass to end")
        failed = failed_urls(config)
        assert len(failed) == 60 and all(f["error"] == "HTTP 500" for f in failed), failed[:3]
        out = tmp_path / "failed.csv"
        r = await master_cmd_async(config, "export", "--failed", "--format", "csv", "-o", str(out))
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        assert len(text.splitlines()) == 61 and "/song/1.html" in text and "HTTP 500" in text

        # The site is fixed; the operator retries the failures it caused.
        await server.close()
        server = await siteserver.start(site_dir, port=server.port,
                                        behaviour=siteserver.Behaviour(record_log=True))
        r = await master_cmd_async(config, "retry", "--reason", "HTTP 500")
        assert r.returncode == 0 and "60 failed URLs back in the queue" in r.stdout, r
        # Settled: none failed, none waiting or in flight (redirect sources count as done too, so the done count
        # alone can be reached while a retried page is still out).
        await cluster.until(lambda: not failed_urls(config) and (st := states(config))["done"] >= len(manifest.pages)
                            and st["queued"] == 0 and st["leased"] == 0, 120, "the retried URLs to be fetched")
        assert sum(1 for e in server.log if e.path.startswith("/song/")) >= 60

        # New seeds on the running crawl: the one in scope is fetched, the other discarded by the URL policy.
        (site_dir / "extra.html").write_text("<html><body>late addition</body></html>")
        r = await master_cmd_async(config, "seed", server.url + "/extra.html", "http://elsewhere.example/")
        assert r.returncode == 0 and "seeded 1 of 2 URLs" in r.stdout and "out_of_scope 1" in r.stdout, r
        await cluster.until(lambda: any(e.path == "/extra.html" for e in server.log), 60, "the seed to be fetched")
        await master.stop()
        await worker.stop()
    finally:
        await server.close()
    assert master.proc.returncode == 0, master.log()[-3000:]


async def test_commands_on_a_stopped_crawl_apply_at_once_and_pause_survives_a_restart(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=5)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], crawl={"max_depth": 0})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        assert await master.wait(60) == 0
        assert await worker.wait(30) == 0
        r = await master_cmd_async(config, "seed", server.url + "/artists/")
        assert r.returncode == 0 and "applied to the stopped crawl" in r.stdout and "seeded 1 of 1" in r.stdout, r
        r = await master_cmd_async(config, "pause")
        assert r.returncode == 0 and "applied to the stopped crawl" in r.stdout, r
        master = await cluster.start_master(config, tmp_path, log_name="master2.log")
        await cluster.until(lambda: "the crawl is paused" in master.log(), 30, "the master to start paused")
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        await cluster.until(lambda: "worker w1 joined" in master.log(), 30, "the worker to join")
        await asyncio.sleep(1.0)   # two heartbeats: nothing may be handed out (an absence: only time shows it)
        assert not any(e.path.startswith("/artists/") for e in server.log)
        r = await master_cmd_async(config, "resume")
        assert r.returncode == 0 and "applied by the running master" in r.stdout, r
        assert await master.wait(60) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0
        assert any(e.path.startswith("/artists/") for e in server.log)


# ------------------------------------------------------------------------------------------- --master alone
async def test_worker_runs_with_only_master_given_and_waits_for_a_master_not_up_yet(tmp_path):
    site_dir = tmp_path / "site"
    sitegen.generate(site_dir, songs=5)
    async with await siteserver.start(site_dir) as server:
        port = cluster.free_port()
        config = cluster.master_config(tmp_path, [server.url + "/"], [socket.gethostname()],
                                       listen=f"127.0.0.1:{port}")
        # Its id (the host name), data dir ($STATE_DIRECTORY, as systemd sets it) and secret come from defaults
        # and the environment.
        env = dict(os.environ, PYTHONUNBUFFERED="1", STATE_DIRECTORY=str(tmp_path / "state"),
                   CRAWLER_SECRET_FILE=str(tmp_path / "secret"))
        for k in ("CRAWLER_ID", "CRAWLER_DATA_DIR", "CRAWLER_CONFIG", "CRAWLER_MASTER"):
            env.pop(k, None)
        log = tmp_path / "worker.log"
        with open(log, "wb") as fh:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "crawler.worker", "--master", f"127.0.0.1:{port}", env=env,
                stdout=asyncio.subprocess.DEVNULL, stderr=fh, cwd=tmp_path)
        await cluster.until(lambda: "not reachable" in log.read_text(), 60, "the worker to try the master")
        master = await cluster.start_master(config, tmp_path)
        assert await asyncio.wait_for(proc.wait(), 120) == 0, log.read_text()
        assert await master.wait(60) == 0, master.log()[-3000:]
    assert (tmp_path / "state" / "pages" / "index.tsv").stat().st_size > 0
    assert f"worker {socket.gethostname()} connected" in log.read_text()


# ------------------------------------------------------------------------------------------- store passwords
async def test_a_postgresql_password_is_never_printed_however_the_address_carries_it(tmp_path, pg_dsn):
    """The real master against a real PostgreSQL server, whose database is missing: the error names the store
    without its password, given as ?password= or percent-encoded; an address whose raw '@' or '/' would make
    libpq read part of the password as the host is refused at load, without echoing it."""
    missing = pg_dsn.replace(":///", ":///missing_", 1)
    encoded = missing.replace("postgresql://", "postgresql://postgres:Enc%40oded-Pw1@", 1)
    for store, secret in ((f"{missing}&password=Query-Pw-7", "Query-Pw-7"), (encoded, "Enc@oded-Pw1")):
        config = cluster.master_config(tmp_path, ["http://127.0.0.1:9/"], ["a"], store=store)
        for args in ((), ("status",)):
            done = await master_cmd_async(config, *args)
            assert done.returncode == 1, done.stderr
            assert "missing_" in done.stderr and "password=***" in done.stderr, done.stderr
            assert secret not in done.stderr + done.stdout and "Enc%40oded" not in done.stderr, done.stderr
    for raw in ("postgresql://postgres:Pa@ss/Xyzzy9@127.0.0.1:1/crawl",
                "postgresql://postgres:Pass/Xyzzy9@127.0.0.1:1/c"):
        config = cluster.master_config(tmp_path, ["http://127.0.0.1:9/"], ["a"], store=raw)
        done = await master_cmd_async(config)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "store:" in done.stderr and "%40" in done.stderr and "Xyzzy9" not in done.stderr, done.stderr
