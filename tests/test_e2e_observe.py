"""End to end, real processes: what an operator sees of a crawl. /metrics against the catalogue and the site's own
request log, /api/status against `status --json`, the token, the progress lines on schedule."""

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

from scripts import cluster, sitegen, siteserver

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
    assert st["http_status"]["200"] >= st["urls"]["done"] - len(manifest.not_found) - len(manifest.redirects)
    assert st["http_status"].get("404", 0) == len(manifest.not_found)
    assert set(st["rates"]) >= {"pages_per_min_1m", "pages_per_min_10m"} and st["rates"]["pages_per_min_10m"] > 0
    assert "None" not in status_json.stdout.replace('"None"', "")
    # The catalogue search finds the song by its title.
    assert any(i["title"] == manifest.audio[0].title for i in search["items"])

    # Stopped: the command says so, and prints tables.
    text = cli("status", "--config", str(config))
    assert text.returncode == 0
    assert "master not running" in text.stdout and "not connected" in text.stdout
    assert "{" not in text.stdout and "'" not in text.stdout
    assert re.search(r"w1\s+not connected\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text.stdout), text.stdout


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
