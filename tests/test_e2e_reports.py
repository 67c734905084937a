"""End to end: a real master and worker crawl a small site with a 404, a path its robots.txt refuses, two MIME types
of pages and a song; `crawler-master report hosts|types|codes` (CSV and JSON lines) and `export --pages` (the crawl
log) say what the site served, each URL once, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from pathlib import Path

import pytest

from click.testing import CliRunner

from crawler.master.cli import main
from testkit import cluster, siteserver
from tests.fakes import audiofiles

pytestmark = pytest.mark.timeout(120)

PAGES = {
    "index.html": '<html><body><a href="/a.html">a</a> <a href="/notes.txt">notes</a> '
                  '<a href="/missing.html">gone</a> <a href="/private/secret.html">secret</a> '
                  '<a href="/media/song.mp3">song</a></body></html>',
    "a.html": '<html><body><a href="/">home</a> <a href="/private/other.html">x</a></body></html>',
    "notes.txt": "plain words, no links\n",
    "private/secret.html": "<html><body>never fetched</body></html>",
    "robots.txt": "User-agent: *\nDisallow: /private/\n",
}


def make_site(root: Path) -> int:
    for name, text in PAGES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "media").mkdir()
    song = audiofiles.write(root / "media" / "song.mp3", "mp3", "Song", "Singer", "Album", size=20_000)
    return song.stat().st_size


def run(config: Path, *args: str) -> str:
    """The command in this process (each costs a second or more as a process of its own on a busy machine)."""
    result = CliRunner().invoke(main, [args[0], "--config", str(config), *args[1:]], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def jsonl_rows(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_reports_and_the_crawl_log_say_what_the_site_served(tmp_path, master_store):
    site = tmp_path / "site"
    song_size = make_site(site)
    async with await siteserver.start(site, behaviour=siteserver.Behaviour(record_log=True)) as server:
        base = server.url
        config = cluster.master_config(tmp_path, [base + "/"], ["w1"], politeness={"obey_robots": True},
                                       **master_store)
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        assert await master.wait(60) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0, worker.log()[-3000:]
        served = [e for e in server.log if e.method == "GET"]

    # What the site served, from its own log: the pages (the master's robots.txt fetch and the song apart).
    pages = {e.path: e for e in served if e.path not in ("/robots.txt", "/media/song.mp3")}
    assert set(pages) == {"/", "/a.html", "/notes.txt", "/missing.html"}
    assert not any(e.path.startswith("/private/") for e in served)
    assert [e.status for e in served if e.path == "/media/song.mp3"] == [200]
    page_bytes = sum(e.bytes_sent for e in pages.values())
    host = base.rstrip("/")

    hosts_csv = csv_rows(await asyncio.to_thread(cluster.operator, "report", config, "hosts"))   # a process
    hosts_jsonl = jsonl_rows(run(config, "report", "hosts", "--format", "jsonl"))
    assert hosts_jsonl == [{"host": host, "urls": 6, "pages": 4, "audio": 1, "bytes": page_bytes + song_size,
                            "errors": 1, "robots_blocked": 2}]
    assert hosts_csv == [{k: str(v) for k, v in hosts_jsonl[0].items()}]

    types = {r["type"]: r for r in jsonl_rows(run(config, "report", "types", "--format", "jsonl"))}
    html = sum(e.bytes_sent for p, e in pages.items() if p != "/notes.txt")   # the 404 page is HTML too
    assert types == {
        "text/html": {"type": "text/html", "pages": 3, "audio": 0, "bytes": html},
        "text/plain": {"type": "text/plain", "pages": 1, "audio": 0, "bytes": pages["/notes.txt"].bytes_sent},
        "audio/mpeg": {"type": "audio/mpeg", "pages": 0, "audio": 1, "bytes": song_size},
    }
    assert {r["type"]: r["pages"] for r in csv_rows(run(config, "report", "types"))} == {
        "audio/mpeg": "0", "text/html": "3", "text/plain": "1"}

    codes = jsonl_rows(run(config, "report", "codes", "--format", "jsonl"))
    assert codes == [{"code": 200, "pages": 3, "bytes": page_bytes - pages["/missing.html"].bytes_sent},
                     {"code": 404, "pages": 1, "bytes": pages["/missing.html"].bytes_sent}]
    assert [(r["code"], r["pages"]) for r in csv_rows(run(config, "report", "codes"))] == [("200", "3"),
                                                                                         ("404", "1")]

    # The crawl log: every URL once, the 404 and the refused ones included, in both formats.
    log = jsonl_rows(await asyncio.to_thread(cluster.operator, "export", config, "--pages"))
    by_url = {r["url"].removeprefix(host): r for r in log}
    assert len(by_url) == len(log) == 6
    assert (by_url["/missing.html"]["state"], by_url["/missing.html"]["http_status"]) == ("done", 404)
    assert by_url["/missing.html"]["depth"] == 1 and by_url["/missing.html"]["last_crawl"]
    secret = by_url["/private/secret.html"]
    assert (secret["state"], secret["http_status"], secret["reason"]) == ("robots", None, "disallowed by robots.txt")
    assert by_url["/private/other.html"]["depth"] == 2 and by_url["/"]["http_status"] == 200
    log_csv = csv_rows(run(config, "export", "--pages", "--format", "csv"))
    assert sorted(r["url"] for r in log_csv) == sorted(r["url"] for r in log)
    assert {r["url"].removeprefix(host): r["state"] for r in log_csv}["/private/secret.html"] == "robots"

    # Refused URLs are discarded once, never failed.
    status = json.loads(run(config, "status", "--json"))
    assert status["urls"]["error"] == 0 and status["discards"]["robots"] == 2, status
    assert jsonl_rows(run(config, "export", "--failed")) == []
