"""End to end: the real master and real workers, as processes, crawl a generated site served on loopback."""

import asyncio
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selectolax.lexbor import LexborHTMLParser

from crawler import protocol as p
from crawler.archive.writer import iter_index
from crawler.worker.pagestore import read_page
from testkit import cluster, sitegen, siteserver

pytestmark = pytest.mark.timeout(240)


async def hostile_clients(addr: str) -> None:
    """A wrong HMAC, an oversized frame and garbage: each is refused on its own connection."""
    host, port = addr.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(p.encode(p.Hello("w1", p.PROTOCOL_VERSION, 8, p.new_nonce())))
    challenge = p.FrameDecoder()
    challenge.feed(await reader.read(4096))
    assert isinstance(challenge.next_message(), p.Challenge)   # a nonce, and no proof of the master's yet
    writer.write(p.encode(p.Auth(b"\0" * 32)))
    answer = p.FrameDecoder()
    answer.feed(await reader.read(4096))
    refused = answer.next_message()
    assert isinstance(refused, p.Refused) and "authentication" in refused.reason
    assert await reader.read() == b""          # and the master hung up
    writer.close()
    for junk in (struct.pack(">I", 1 << 30), struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1"):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(junk)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    manifest = sitegen.generate(out, songs=300)
    return out, manifest


async def test_two_workers_crawl_the_site_completely_and_a_wrong_secret_is_refused(site, tmp_path):
    site_dir, manifest = site
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        base = server.url
        config = cluster.master_config(tmp_path, [base + "/"], ["w1", "w2", "w3"],
                                       crawl={"max_depth": manifest.max_depth + 3},
                                       politeness={"obey_robots": True})
        master = await cluster.start_master(config, tmp_path)
        addr = cluster.master_addr(config)
        await hostile_clients(addr)
        intruder_secret = cluster.write_secret(tmp_path / "wrong-secret")   # strong, but not the master's
        intruder = await cluster.start_worker(addr, "w3", tmp_path, secret=intruder_secret)
        w1 = await cluster.start_worker(addr, "w1", tmp_path, extra=["--concurrency", "16"])
        w2 = await cluster.start_worker(addr, "w2", tmp_path, extra=["--concurrency", "16"])
        rc = await master.wait(180)
        assert rc == 0, master.log()[-3000:]
        assert await w1.wait(30) == 0
        assert await w2.wait(30) == 0
        await intruder.stop()
        log = list(server.log)

    summary = master.stdout.decode()
    assert "crawl summary" in summary and "pages/s" in summary

    # The intruders never got in, the master said so in its log, and carried on.
    mlog = master.log()
    assert "failed authentication" in mlog and "exceeds the limit" in mlog and "undecodable" in mlog
    assert "worker w3 joined" not in mlog
    assert not (tmp_path / "worker-w3").exists(), "a refused worker leaves no data dir behind"

    # Every reachable page fetched exactly once, by one of the two real workers; nothing else of the site.
    gets = Counter(e.path for e in log if e.method == "GET" and not e.path.startswith(("/media/", "/stream/")))
    for path in manifest.pages:
        assert gets[path] == 1, f"{path} fetched {gets[path]} times"
    for path in manifest.robots_disallowed:
        assert gets[path] == 0, f"{path} is disallowed by robots.txt but was fetched"
    for path in manifest.not_found:
        assert gets[path] == 1
    assert {e.user_agent for e in log} and all("audio-crawler" in (e.user_agent or "") for e in log)
    both = Counter(line.split("\t")[1] for n in ("w1", "w2")
                   for line in (tmp_path / f"worker-{n}" / "pages" / "index.tsv").read_text().splitlines())
    assert both and all(c == 1 for c in both.values())
    per_worker = [len((tmp_path / f"worker-{n}" / "pages" / "index.tsv").read_text().splitlines())
                  for n in ("w1", "w2")]
    assert min(per_worker) > 0.3 * sum(per_worker), per_worker

    # Every page fetch is in its worker's archive as a request and a response record tied together, every file
    # passes warcio's check, and each stored page is there byte for byte as the site serves it.
    archived: set[str] = set()
    for n in ("w1", "w2"):
        archive = tmp_path / f"worker-{n}" / "archive"
        files = sorted(archive.glob("*.warc.gz"))
        check = subprocess.run([str(Path(sys.executable).parent / "warcio"), "check", *map(str, files)],
                               capture_output=True, text=True, check=False)
        assert files and check.returncode == 0, check.stdout + check.stderr
        refs = [r for r in iter_index(archive) if r.role == "page"]
        responses = {r.record_id: r.target for r in refs if r.kind == "response"}
        assert sorted(r.refers_to for r in refs if r.kind == "request") == sorted(responses)
        assert not archived & set(responses.values())      # each page fetched once, by one worker
        archived |= set(responses.values())
    assert {base + path for path in manifest.pages} <= archived, sorted({base + p for p in manifest.pages} - archived)
    stored = 0
    for n in ("w1", "w2"):
        pages_dir = tmp_path / f"worker-{n}" / "pages"
        for line in (pages_dir / "index.tsv").read_text().splitlines():
            location, url, _final, status, *_ = line.split("\t")
            path = url.removeprefix(base)
            if status == "200" and path.endswith(".html"):
                assert read_page(pages_dir, location) == (site_dir / path.lstrip("/")).read_bytes(), url
                stored += 1
    assert stored >= len([p for p in manifest.pages if p.endswith(".html")]) - len(manifest.not_found)

    # Every audio reference in the site is in the catalogue, with its title and artist, downloaded intact.
    rows = cluster.catalogue(tmp_path)
    found = {(r["url"].removeprefix(base), r["page"].removeprefix(base)): r for r in rows}
    missing = [a for a in manifest.audio if (a.url, a.page) not in found]
    assert not missing, f"{len(missing)} audio items missing, e.g. {missing[:3]}"
    for a in manifest.audio:
        row = found[(a.url, a.page)]
        assert (row["title"], row["artist"]) == (a.title, a.artist), (a, row)
        assert row["status"] == "ok"
        assert row["sha256"] == a.sha256, (a.url, row.get("reason"))
    assert len(rows) == len(manifest.audio), "items found that the site does not have"


async def test_pages_at_the_depth_limit_are_fetched_but_their_links_are_not_reported(site, tmp_path):
    """A link seen first on a page at the limit must not be held back by the worker's link cache when a
    shallower page names it later: the worker does not report (or cache) the links of pages at the limit."""
    site_dir, _ = site
    async with await siteserver.start(site_dir, behaviour=siteserver.Behaviour(record_log=True)) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"], crawl={"max_depth": 1})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path,
                                            extra=["--concurrency", "4"])
        assert await master.wait(120) == 0, master.log()[-3000:]
        assert await worker.wait(30) == 0
        log = list(server.log)
    home = (site_dir / "index.html").read_text()
    fetched = {e.path for e in log if e.method == "GET" and e.path.endswith(".html")}
    assert "/index.html" in fetched or "/" in {e.path for e in log}
    # The home page's links, and the targets of those that redirect (the same resource: the same depth).
    moved = sitegen.load_redirects(site_dir)
    named = {path for path in fetched if path.removeprefix("/") in home}
    targets = {r.location for path, r in moved.items() if path.removeprefix("/") in home}
    assert fetched and fetched <= named | targets, sorted(fetched - named - targets)
    summary = master.stdout.decode()
    # The links of the pages at the limit were not reported, but they are counted as discarded for depth:
    # every link element of every page fetched at depth 1.
    pages_dir = tmp_path / "worker-w1" / "pages"
    at_limit = [line.split("\t") for line in (pages_dir / "index.tsv").read_text().splitlines()]
    at_limit = [fields[0] for fields in at_limit if urlsplit(fields[1]).path not in ("/", "/index.html")]
    elements = sum(len(LexborHTMLParser(read_page(pages_dir, loc)).css(
        "a[href], area[href], iframe[src], frame[src]")) for loc in at_limit)
    discarded = next(line for line in summary.splitlines() if "discarded URLs" in line)
    too_deep = int(discarded.split("depth ")[1].split(",")[0])
    # Less the audio references of those pages (streams, playlists), which are followed past the limit: resolving
    # a page's audio is part of the page.
    refs = len({e.path for e in log if e.path.startswith((sitegen.STREAM_PREFIX, "/playlists/"))})
    # A redirect is not cut: its target is the same resource, at the same depth.
    assert elements - refs - 5 <= too_deep <= elements - refs, (discarded, elements, refs)
    assert elements > len(at_limit)
    links_line = next(line for line in summary.splitlines() if "links reported" in line)
    home_links = int(links_line.split()[2])
    assert 0 < home_links <= home.count("href=")     # only the home page's links were reported


async def test_a_finished_crawl_ends_without_waiting_for_the_next_heartbeat(site, tmp_path):
    """The master holds a done crawl's end until a heartbeat after each worker's last report says no fingerprint
    is pending. A worker left with nothing to do says so at once: with heartbeats a minute apart, the crawl
    (its audio downloaded and fingerprinted) still ends as soon as it is done, not at the worker's next one."""
    site_dir, manifest = site
    async with await siteserver.start(site_dir) as server:
        config = cluster.master_config(tmp_path, [server.url + "/"], ["w1"],
                                       crawl={"max_depth": manifest.max_depth + 3},
                                       scheduling={"heartbeat_interval": 60.0, "heartbeat_timeout": 180.0,
                                                   "lease_timeout": 300.0})
        master = await cluster.start_master(config, tmp_path)
        worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path)
        started = time.monotonic()
        assert await master.wait(120) == 0, master.log()[-3000:]
        took = time.monotonic() - started
        assert await worker.wait(30) == 0
    assert took < 40, f"the crawl ended {took:.1f} s after the worker started"
    rows = cluster.catalogue(tmp_path)
    assert len([r for r in rows if r["status"] == "ok"]) == len(manifest.audio)
