"""End to end, real processes: what an operator sees of a crawl. /metrics against the catalogue and the site's own
request log, /api/status against `status --json`, the token, the progress lines on schedule; a paused crawl
and a worker with a full disk, plainly so everywhere; the recent errors after a restart."""

import asyncio
import itertools
import json
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testkit import cluster, sitegen, siteserver
from tests.disks import small_tmpfs
from tests.test_e2e_faulted_node import fill

pytestmark = pytest.mark.timeout(300)

TOKEN = "a token only the operator knows 0123"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crawler.master", *args], check=False, capture_output=True,
                          text=True, timeout=60)


def samples(text: str) -> dict[str, list]:
    """Metric families by name -> their samples; the official parser, so a malformed exposition fails here."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
    return out


def total(fams: dict, sample: str, **labels: str) -> float:
    return sum(s.value for f in fams.values() for s in f
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, sitegen.generate(out, songs=120)


async def wait_until_idle(client: httpx.AsyncClient, timeout: float) -> dict:
    """The crawl is over when nothing is queued, held or at a worker and no download is pending, three looks in a
    row."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    st: dict = {}
    while time.monotonic() < deadline:
        st = (await client.get("/api/status")).json()
        u = st["urls"]
        if u["done"] > 0 and u["queued"] == 0 and u["held_at_master"] == 0 and u["at_workers"] == 0 \
                and st["downloads_pending"] == 0:
            seen.append(u["done"])
            if len(seen) >= 3 and seen[-1] == seen[-3]:
                return st
        else:
            seen.clear()
        await asyncio.sleep(0.3)
    raise AssertionError(f"the crawl did not settle; last status {st}")


async def test_metrics_and_status_agree_with_the_catalogue_and_the_sites_log(site, tmp_path):
    site_dir, manifest = site
    token_file = tmp_path / "web-token"
    cluster.write_secret(token_file, TOKEN)      # a token file is held to the secret file's rules (mode 0600)
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1", "w2"], exit_when_done=False,
                                       crawl={"max_depth": manifest.max_depth + 2},
                                       web={"listen": "127.0.0.1:0", "token_file": str(token_file)})
        master = await cluster.start_master(config, tmp_path)
        url = cluster.web_url(config)
        try:
            # Without the token nothing is served; with it (header or the login cookie), everything.
            async with httpx.AsyncClient(base_url=url, timeout=30) as anon:
                for path in ("/", "/api/status", "/api/recent", "/api/audio", "/metrics"):
                    assert (await anon.get(path)).status_code == 401, path
                wrong = await anon.get("/metrics", headers={"Authorization": "Bearer not-the-token"})
                assert wrong.status_code == 401
                assert (await anon.post("/login", data={"token": "nope"})).status_code == 401
                login = await anon.post("/login", data={"token": TOKEN})
                assert login.status_code == 303 and "crawler_token" in login.cookies
                page = await anon.get("/")
                assert page.status_code == 200 and "Pages per minute" in page.text

            worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                                extra=["--concurrency", "8", "--metrics-listen", "127.0.0.1:0"])
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
                st = await wait_until_idle(client, 180)
                # The status command reads the view the master writes every few seconds: wait for a fresh one.
                settled = time.time()
                live = tmp_path / "master" / "live.json"
                await cluster.until(lambda: json.loads(live.read_text())["written_at"] > settled, 30, "a snapshot")
                metrics_text = (await client.get("/metrics")).text
                status_json = cli("status", "--config", str(config), "--json")
                st = (await client.get("/api/status")).json()
                search = (await client.get("/api/audio", params={"q": manifest.audio[0].title})).json()
                waddr = (tmp_path / "worker-w1" / "metrics.addr").read_text().strip()
                worker_metrics = (await client.get(f"http://{waddr}/metrics")).text
        finally:
            await master.stop()
        await worker.stop()
        log = list(server.log)

    rows = cluster.catalogue(tmp_path)
    assert len(rows) == len(manifest.audio)
    m = samples(metrics_text)
    # Every page the site served is one result in crawler_pages_total; no more, no less. (Extensionless
    # /stream/ URLs are fetched as pages, then downloaded again as audio: each counts once here.)
    page_gets = {e.path for e in log if not e.path.startswith("/media/") and e.path != "/robots.txt"}
    assert len(page_gets) > 150
    assert total(m, "crawler_pages_total", node="w1") == len(page_gets)
    assert total(m, "crawler_pages_total", node="w1", outcome="done") == st["urls"]["done"]
    assert total(m, "crawler_pages_total") == len(page_gets)
    # Audio: the catalogue's rows, by status, and the bytes of the files downloaded.
    for status, n in Counter(r["status"] for r in rows).items():
        assert total(m, "crawler_audio_items_total", node="w1", status=status) == n
    assert total(m, "crawler_download_bytes_total", kind="audio") == sum(r["size"] or 0 for r in rows if r["sha256"])
    page_bytes = total(m, "crawler_download_bytes_total", kind="page")
    assert page_bytes == sum(n["bytes"] for n in st["nodes"]) > 0
    for reason, n in st["discards"].items():
        assert total(m, "crawler_discarded_urls_total", reason=reason) == n
    assert st["discards"].get("depth", 0) > 0 or manifest.max_depth + 2 >= max(manifest.depth.values())
    # Every page fetched was a new URL to the Bloom filter once; a site's navigation is offered again and again.
    dedup = {r: total(m, "crawler_dedup_urls_total", result=r) for r in ("offered", "batch_repeats", "new", "seen")}
    assert dedup["offered"] == dedup["batch_repeats"] + dedup["new"] + dedup["seen"]
    assert dedup["new"] >= len(page_gets) and dedup["seen"] > 0
    assert total(m, "crawler_frontier_urls") == 0
    assert total(m, "crawler_in_flight_urls", where="workers") == 0
    assert total(m, "crawler_nodes_connected") == 1
    assert total(m, "crawler_event_loop_lag_seconds_count") > 0

    # The worker's own /metrics: the same pages, and one fetch-time observation per page fetched.
    w = samples(worker_metrics)
    assert total(w, "crawler_pages_total", node="w1") == len(page_gets)
    assert total(w, "crawler_fetch_seconds_count", node="w1") == len(page_gets)
    assert total(w, "crawler_event_loop_lag_seconds_count") > 0

    # /api/status and `status --json` are one object; at rest, only the moments differ.
    assert status_json.returncode == 0, status_json.stderr
    cmd = json.loads(status_json.stdout)
    for key in ("urls", "audio", "discards", "http_status", "errors", "nodes_connected"):
        assert cmd[key] == st[key], key
    strip = ("last_heartbeat",)
    assert [{k: v for k, v in n.items() if k not in strip} for n in cmd["nodes"]] == \
           [{k: v for k, v in n.items() if k not in strip} for n in st["nodes"]]
    assert cmd["master"]["running"] and cmd["master"]["web"] == url.removeprefix("http://")
    assert [n["connected"] for n in st["nodes"]] == [True, False]
    assert [n["state"] for n in st["nodes"]] == ["connected", "disconnected"] and st["paused"] is False
    assert st["http_status"]["200"] >= st["urls"]["done"] - len(manifest.not_found) - len(manifest.redirects)
    assert st["http_status"].get("404", 0) == len(manifest.not_found)
    assert set(st["rates"]) >= {"pages_per_min_1m", "pages_per_min_10m"} and st["rates"]["pages_per_min_10m"] > 0
    assert "None" not in status_json.stdout.replace('"None"', "")
    # The catalogue search finds the song by its title.
    assert any(i["title"] == manifest.audio[0].title for i in search["items"])

    # Stopped: the command says so, and prints tables.
    text = cli("status", "--config", str(config))
    assert text.returncode == 0
    assert "master not running" in text.stdout and "disconnected" in text.stdout
    assert "{" not in text.stdout and "'" not in text.stdout
    assert re.search(r"w1\s+disconnected\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text.stdout), text.stdout


async def test_progress_lines_appear_on_schedule_in_a_slow_crawl(site, tmp_path):
    site_dir, _ = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.3})
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], log_interval=1.0)
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(yaml.safe_dump({"log_interval": 1.0, "concurrency": 2}))
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg,
                                            extra=["--log-level", "debug"])
        try:
            await cluster.until(lambda: master.log().count("progress: ") >= 6, 120, "six progress lines")
            await cluster.until(lambda: worker.log().count("progress: ") >= 3, 60, "three worker progress lines")
        finally:
            await master.stop()
            await worker.stop()
    lines = [line for line in master.log().splitlines() if "progress: " in line]
    stamps = [datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ") for line in lines]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    # Once a second, give or take the load on a shared machine; never bunched up, never skipped.
    assert all(0.7 <= g <= 2.5 for g in gaps), gaps
    assert sum(gaps) / len(gaps) == pytest.approx(1.0, abs=0.3), gaps
    assert any(re.search(r"progress: [1-9]\d* pages/min", line) for line in lines), lines
    assert all("held at the master" in line for line in lines) and "workers 1/1" in lines[-1]
    # At debug level a worker logs one line a page.
    assert re.search(r"Z DEBUG crawler\.worker: done 200 http://127\.0\.0\.1:\d+/", worker.log())
    wlines = [line for line in worker.log().splitlines() if "progress: " in line]
    assert any(re.search(r"progress: [1-9]\d* pages/min", line) for line in wlines), wlines


def test_a_web_server_beyond_loopback_without_a_token_is_refused(tmp_path):
    config = cluster.master_config(tmp_path, ["http://127.0.0.1:9/"], ["w1"], web={"listen": "0.0.0.0:0"})
    run = cli("--config", str(config))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "web.listen" in run.stderr and "token" in run.stderr, run.stderr
    assert not (tmp_path / "master" / "master.db").exists()


def status_json(config) -> dict:
    done = cli("status", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def status_table(config) -> str:
    done = cli("status", "--config", str(config))
    assert done.returncode == 0, done.stderr
    return done.stdout


def html_gets(server) -> int:
    return sum(1 for e in server.log if e.path.endswith(".html"))


async def test_a_paused_crawl_says_paused_in_status_the_table_metrics_and_the_progress_line(site, tmp_path, until):
    site_dir, manifest = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.3}, record_log=True)
    async with await siteserver.start(site_dir, behaviour=slow) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                       log_interval=1.0, crawl={"max_depth": manifest.max_depth + 2})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "2"])
        try:
            async with httpx.AsyncClient(base_url=cluster.web_url(config), timeout=30) as client:
                await cluster.until(lambda: html_gets(server) >= 4, 60, "the crawl to get going")
                assert "paused" in await asyncio.to_thread(cluster.operator, "pause", config)
                # At once, before the master's next snapshot: the command line reads the store's flag.
                st = await asyncio.to_thread(status_json, config)
                assert st["paused"] is True and st["master"]["running"], st
                table = await asyncio.to_thread(status_table, config)
                assert "crawl PAUSED: no work is handed out until `crawler-master resume`" in table, table
                mark = len(master.log())
                await cluster.until(lambda: "progress (paused): " in master.log()[mark:], 30,
                                    "a paused progress line")
                # What the worker held at the pause finishes; then nothing moves, the figures hold still.
                api: dict = {}

                async def nothing_at_workers() -> bool:
                    api.update((await client.get("/api/status")).json())
                    return not api["urls"]["at_workers"]

                await until(nothing_at_workers, 60, "the work held at the pause to finish", interval=0.2)
                metrics_text = (await client.get("/metrics")).text
                assert (await client.get("/api/status")).json()["urls"] == api["urls"]
                assert api["paused"] is True and api["urls"]["queued"] > 0
                assert "resumed" in (await asyncio.to_thread(cluster.operator, "resume", config))
                st_resumed = await asyncio.to_thread(status_json, config)
                m_resumed = samples((await client.get("/metrics")).text)
                mark_resumed = len(master.log())
                await cluster.until(lambda: "progress: " in master.log()[mark_resumed:], 30,
                                    "a progress line")
        finally:
            await master.stop()
            await worker.stop()

    line = next(ln for ln in master.log()[mark:].splitlines() if "progress (paused): " in ln)
    assert "paused: no work is handed out until `crawler-master resume`" in line
    assert "not shrinking" not in line
    m = samples(metrics_text)
    assert total(m, "crawler_paused") == 1 and total(m, "crawler_nodes_faulted") == 0
    # The URL-state gauges are the status's figures.
    u = api["urls"]
    assert total(m, "crawler_urls", state="queued") == u["queued"] > 0
    assert total(m, "crawler_urls", state="done") == u["done"] > 0
    assert total(m, "crawler_urls", state="failed") == u["error"]
    assert total(m, "crawler_urls", state="leased") == u["total"] - u["queued"] - u["done"] - u["error"]
    assert total(m, "crawler_urls", state="discarded") == sum(api["discards"].values())
    assert "_created" not in metrics_text
    # Resumed: none of it says paused any more.
    assert st_resumed["paused"] is False and total(m_resumed, "crawler_paused") == 0
    assert "(paused)" not in master.log()[mark_resumed:]


async def test_a_worker_with_a_full_disk_shows_as_fault_in_status_the_table_and_metrics(site, tmp_path):
    site_dir, manifest = site
    slow = siteserver.Behaviour(slow_paths={r"\.html$": 0.3})
    # Room for the worker's resume headroom once the filler goes: the fault ends as it would on a real disk.
    with small_tmpfs(tmp_path / "worker-small", "48m") as disk:
        async with await siteserver.start(site_dir, behaviour=slow) as server:
            config = cluster.master_config(tmp_path, [server.url + "/"], ["small", "w2"],
                                           exit_when_done=False, crawl={"max_depth": manifest.max_depth + 2})
            wcfg = tmp_path / "worker.yaml"
            wcfg.write_text("min_free_bytes: 0\nconcurrency: 2\n")
            master = await cluster.start_master(config, tmp_path)
            small = await cluster.start_worker(cluster.master_addr(config), "small", tmp_path, config=wcfg)
            live = tmp_path / "master" / "live.json"
            try:
                async with httpx.AsyncClient(base_url=cluster.web_url(config), timeout=30) as client:
                    await cluster.until(lambda: "worker small joined" in master.log(), 30,
                                        "the worker to join")
                    await asyncio.to_thread(fill, disk)
                    await cluster.until(lambda: "cannot store what it fetches" in master.log(), 30,
                                        "the master to hear of the fault")
                    # The command line reads the view the master writes every few seconds: wait for one with it.
                    await cluster.until(lambda: json.loads(live.read_text())["nodes"].get("small", {})
                                        .get("fault"), 30, "a snapshot with the fault")
                    st = await asyncio.to_thread(status_json, config)
                    table = await asyncio.to_thread(status_table, config)
                    api = (await client.get("/api/status")).json()
                    faulted = samples((await client.get("/metrics")).text)
                    # Space comes back: the node is connected again, everywhere.
                    for name in ("filler", "filler2"):
                        (disk / name).unlink()
                    await cluster.until(lambda: "worker small can store again" in master.log(), 30,
                                        "the master to hear the fault is over")
                    healed = (await client.get("/api/status")).json()
                    healed_metrics = samples((await client.get("/metrics")).text)
            finally:
                await master.stop()
                await small.stop()

    for view in (st, api):
        nodes = {n["node"]: n for n in view["nodes"]}
        assert nodes["small"]["state"] == "fault" and nodes["small"]["connected"], nodes
        assert "No space left on device" in nodes["small"]["fault"], nodes
        assert nodes["w2"]["state"] == "disconnected" and nodes["w2"]["fault"] is None
        assert view["nodes_faulted"] == 1 and view["nodes_connected"] == 1
    row = next(line for line in table.splitlines() if line.strip().startswith("small "))
    assert re.search(r"small\s+fault: No space left on device", row), table
    assert "1 of 2 workers connected, 1 faulted" in table
    assert total(faulted, "crawler_nodes_faulted") == 1 and total(faulted, "crawler_nodes_connected") == 1
    small_now = next(n for n in healed["nodes"] if n["node"] == "small")
    assert small_now["state"] == "connected" and small_now["fault"] is None and healed["nodes_faulted"] == 0
    assert total(healed_metrics, "crawler_nodes_faulted") == 0


async def test_recent_errors_survive_a_master_restart_and_the_chart_ends_on_a_whole_minute(tmp_path):
    site_dir = tmp_path / "site"
    manifest = sitegen.generate(site_dir, songs=8)
    broken = siteserver.Behaviour(status_overrides={r"^/song/": 500})
    async with await siteserver.start(site_dir, behaviour=broken) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"],
                                       crawl={"max_depth": manifest.max_depth + 2, "max_attempts": 1})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        assert await master.wait(60) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0
    async with httpx.AsyncClient(timeout=30) as client:
        # The crawl is over; a master started again on it (and kept up) shows the errors it had before.
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], exit_when_done=False,
                                       crawl={"max_depth": manifest.max_depth + 2, "max_attempts": 1})
        master = await cluster.start_master(config, tmp_path, log_name="master2.log")
        try:
            recent = (await client.get(cluster.web_url(config) + "/api/recent")).json()
        finally:
            await master.stop()
    songs = [e for e in recent["errors"] if "/song/" in e["url"]]
    assert len(songs) >= 8, recent["errors"]
    assert all(e["error"] == "HTTP 500" and e["node"] == "w1" for e in songs), recent["errors"]
    # The chart's last bar is the last whole minute: it ends on a minute, not now.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", recent["end"]), recent["end"]
    assert len(recent["pages"]) == 60
