"""The loopback site server, driven with httpx (and raw sockets where httpx would tidy the request) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from pathlib import Path

import httpx
import pytest

from testkit import sitegen, siteserver
from testkit.sitegen import Manifest
from testkit.siteserver import Behaviour, RunningSite

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    sitegen.generate(out, songs=40, seed=5, audio_size=1500, large_files=1, large_size=200_000)
    return out


@pytest.fixture(scope="module")
def manifest(site_dir: Path) -> Manifest:
    return Manifest.load(site_dir)


@pytest.fixture
async def site(site_dir: Path) -> AsyncIterator[RunningSite]:
    async with await siteserver.start(site_dir, behaviour=Behaviour(record_log=True)) as running:
        yield running


@pytest.fixture
async def client(site: RunningSite) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=site.url, timeout=10) as c:
        yield c


async def _raw_get(site: RunningSite, target: str) -> tuple[int, bytes]:
    """Send the request line exactly as written (httpx would resolve dot segments before sending)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(data.split(b" ", 2)[1]), data


def _big(site_dir: Path, manifest: Manifest) -> tuple[str, bytes]:
    url = manifest.large[0]
    return url, (site_dir / url.lstrip("/")).read_bytes()


async def test_serves_pages_and_audio_with_their_types(client: httpx.AsyncClient, site_dir: Path,
                                                       manifest: Manifest) -> None:
    home = await client.get("/")
    assert home.status_code == 200 and home.headers["content-type"] == "text/html; charset=utf-8"
    assert home.content == (site_dir / "index.html").read_bytes()
    news = await client.get("/news/")
    assert news.status_code == 200 and b"<h1>News</h1>" in news.content
    expected = {".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".m4a": "audio/mp4", ".flac": "audio/flac",
                ".wav": "audio/wav", ".wma": "audio/x-ms-wma", ".aac": "audio/aac"}
    for item in manifest.audio:
        r = await client.get(item.url)
        assert r.status_code == 200 and len(r.content) == item.size
        ctype = "audio/mpeg" if item.url.startswith("/stream/") else expected[Path(item.url).suffix]
        assert r.headers["content-type"] == ctype, item.url
        if item.playlist:
            p = await client.get(item.playlist)
            assert p.headers["content-type"] in ("audio/x-mpegurl", "audio/x-scpls")
    robots = await client.get("/robots.txt")
    assert "Disallow: /private/" in robots.text


async def test_head_sends_headers_only(client: httpx.AsyncClient, site_dir: Path, manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    r = await client.head(url)
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(data) and r.content == b""
    assert r.headers["accept-ranges"] == "bytes" and r.headers["etag"] and r.headers["last-modified"]
    page = (site_dir / "about.html").read_bytes()
    r = await client.head("/about.html")
    assert r.status_code == 200 and int(r.headers["content-length"]) == len(page) and r.content == b""


async def test_range_gives_206_with_the_right_bytes(client: httpx.AsyncClient, site_dir: Path,
                                                    manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    r = await client.get(url, headers={"Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.content == data[1000:2000]
    assert r.headers["content-range"] == f"bytes 1000-1999/{len(data)}"
    r = await client.get(url, headers={"Range": "bytes=150000-"})
    assert r.status_code == 206 and r.content == data[150000:]
    r = await client.get(url, headers={"Range": "bytes=-100"})
    assert r.status_code == 206 and r.content == data[-100:]


async def test_range_beyond_the_end_is_416(client: httpx.AsyncClient, site_dir: Path, manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    r = await client.get(url, headers={"Range": f"bytes={len(data)}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(data)}"


async def test_if_range_resumes_only_while_the_validator_holds(client: httpx.AsyncClient, site_dir: Path,
                                                               manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    head = await client.head(url)
    etag, modified = head.headers["etag"], head.headers["last-modified"]
    ok = {"Range": "bytes=500-"}
    r = await client.get(url, headers={**ok, "If-Range": etag})
    assert r.status_code == 206 and r.content == data[500:]
    r = await client.get(url, headers={**ok, "If-Range": modified})
    assert r.status_code == 206 and r.content == data[500:]
    stale = ['"0-0"', "W/" + etag, formatdate(sitegen.FIXED_MTIME - 3600, usegmt=True)]
    for validator in stale:
        r = await client.get(url, headers={**ok, "If-Range": validator})
        assert r.status_code == 200 and r.content == data, validator   # the whole, current file


async def test_conditional_get_gives_304(client: httpx.AsyncClient, manifest: Manifest) -> None:
    first = await client.get("/about.html")
    r = await client.get("/about.html", headers={"If-None-Match": first.headers["etag"]})
    assert r.status_code == 304 and r.content == b""
    r = await client.get("/about.html", headers={"If-Modified-Since": first.headers["last-modified"]})
    assert r.status_code == 304


async def test_small_files_from_memory_look_like_file_responses(client: httpx.AsyncClient) -> None:
    # A plain GET of a page is answered from memory; one with a condition goes through FileResponse.
    plain = await client.get("/about.html")
    conditional = await client.get("/about.html", headers={"If-None-Match": '"something-else"'})
    assert conditional.status_code == plain.status_code == 200
    assert conditional.content == plain.content
    for h in ("etag", "last-modified", "content-type", "content-length", "accept-ranges"):
        assert conditional.headers[h] == plain.headers[h], h


async def test_redirects_follow_the_generated_map(client: httpx.AsyncClient, manifest: Manifest) -> None:
    for src, target in manifest.redirects.items():
        r = await client.get(src)
        assert (r.status_code, r.headers["location"]) == (target.status, target.location)
    r = await client.get("/blog.html", follow_redirects=True)
    assert r.status_code == 200 and str(r.url).endswith("/news/")
    assert [h.status_code for h in r.history] == [301, 302]
    r = await client.get("/news")
    assert r.status_code == 301 and r.headers["location"] == "/news/"


async def test_missing_and_unserved_files_are_404(client: httpx.AsyncClient, manifest: Manifest) -> None:
    for path in [*manifest.not_found, "/manifest.json", "/_redirects.json", "/nginx.conf.fragment",
                 "/media/nope.mp3", "/song/1.html/x"]:
        r = await client.get(path)
        assert r.status_code == 404, path
    assert (await client.post("/")).status_code == 405


UP = 12   # more levels than any temporary directory is deep


@pytest.mark.parametrize("target", ["/../" * UP + "etc/passwd", "/%2e%2e" * UP + "/etc/passwd",
                                    "/media/" + "..%2f" * UP + "etc/passwd", "/" + "..%5c" * UP + "etc%5cpasswd",
                                    "/song/" + "%2E%2E/" * UP + "etc/passwd", "/%00/etc/passwd"])
async def test_path_traversal_is_refused(site: RunningSite, target: str) -> None:
    status, raw = await _raw_get(site, target)
    assert status in (400, 403, 404), raw[:200]
    assert b"root:" not in raw and b'"audio"' not in raw


async def test_slow_paths_wait_before_answering(site_dir: Path) -> None:
    behaviour = Behaviour(slow_paths={r"^/about\.html$": 0.3})
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        t0 = time.monotonic()
        assert (await c.get("/about.html")).status_code == 200
        slow = time.monotonic() - t0
        t0 = time.monotonic()
        assert (await c.get("/help.html")).status_code == 200
        fast = time.monotonic() - t0
    assert slow >= 0.3 and fast < 0.25


async def test_gated_paths_wait_until_the_gate_opens_and_are_listed_meanwhile(site_dir: Path) -> None:
    gate = asyncio.Event()
    async with await siteserver.start(site_dir, behaviour=Behaviour(gates={r"^/about\.html$": gate})) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        held = [asyncio.ensure_future(c.get("/about.html")) for _ in range(3)]
        assert (await c.get("/help.html")).status_code == 200    # other paths pass
        while len(running.stalled) < 3:
            await asyncio.sleep(0.01)
        assert running.stalled == ["/about.html"] * 3 and not any(h.done() for h in held)
        gate.set()
        assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200, 200]
        assert running.stalled == []
        assert (await c.get("/about.html")).status_code == 200    # an open gate holds nothing


async def test_broken_paths_drop_the_connection_mid_body(site_dir: Path, manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    behaviour = Behaviour(broken_paths={r"^/media/": 0.25}, record_log=True)
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        got = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("GET", url) as r:
                assert int(r.headers["content-length"]) == len(data)
                async for chunk in r.aiter_bytes():
                    got += chunk
        assert bytes(got) == data[:len(data) // 4]
        # A ranged retry breaks as well, a quarter of the way into the range.
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get(url, headers={"Range": "bytes=1000-"})
        assert (await c.get("/about.html")).status_code == 200   # other paths are unaffected
        assert [e.bytes_sent for e in running.log[:2]] == [len(data) // 4, (len(data) - 1000) // 4]


async def test_small_files_break_too(site_dir: Path, manifest: Manifest) -> None:
    page = manifest.audio[0].page
    data = (site_dir / page.lstrip("/")).read_bytes()
    behaviour = Behaviour(broken_paths={r"^/song/": 0.5})
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get(page)
        assert len(data) < siteserver.SMALL_FILE


async def test_broken_times_lets_a_resumed_download_finish(site_dir: Path, manifest: Manifest) -> None:
    url, data = _big(site_dir, manifest)
    behaviour = Behaviour(broken_paths={r"^/media/|^/stream/": 0.5}, broken_times=1)
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        got = bytearray()
        etag = None
        with pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("GET", url) as r:
                etag = r.headers["etag"]
                async for chunk in r.aiter_bytes():
                    got += chunk
        r = await c.get(url, headers={"Range": f"bytes={len(got)}-", "If-Range": etag})
        assert r.status_code == 206
        assert bytes(got) + r.content == data


async def test_ua_bound_paths_need_the_user_agent(site_dir: Path, manifest: Manifest) -> None:
    url = manifest.audio[0].url
    behaviour = Behaviour(ua_bound={r"^/media/": "DemoPlayer/2"})
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        assert (await c.get(url)).status_code == 403
        assert (await c.get(url, headers={"User-Agent": "curl/8"})).status_code == 403
        assert (await c.get(url, headers={"User-Agent": "Mozilla/5.0 DemoPlayer/2.1"})).status_code == 200
        assert (await c.get("/")).status_code == 200


async def test_status_overrides(site_dir: Path) -> None:
    behaviour = Behaviour(status_overrides={r"^/song/1\.html$": 503, r"^/song/2\.html$": 500})
    async with await siteserver.start(site_dir, behaviour=behaviour) as running, \
            httpx.AsyncClient(base_url=running.url) as c:
        r = await c.get("/song/1.html")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert (await c.get("/song/2.html")).status_code == 500
        assert (await c.get("/song/3.html")).status_code == 200


async def test_request_log_records_what_was_served(site: RunningSite, client: httpx.AsyncClient,
                                                   site_dir: Path, manifest: Manifest,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    url, _ = _big(site_dir, manifest)
    t0 = time.monotonic()
    await client.get("/", headers={"User-Agent": "democrawler/1.0"})
    await client.get(url, headers={"Range": "bytes=0-99"})
    await client.get("/events.html")
    await client.get("/songs.html")
    await client.head(url)
    got = [(e.method, e.path, e.status, e.bytes_sent) for e in site.log]
    assert got == [("GET", "/", 200, (site_dir / "index.html").stat().st_size), ("GET", url, 206, 100),
                   ("GET", "/events.html", 404, got[2][3]), ("GET", "/songs.html", 301, got[3][3]),
                   ("HEAD", url, 200, 0)]
    assert got[2][3] > 0
    assert site.log[0].user_agent == "democrawler/1.0" and site.log[1].range == "bytes=0-99"
    assert all(t0 <= e.time <= time.monotonic() for e in site.log)
    assert [e.time for e in site.log] == sorted(e.time for e in site.log)
    assert not [r for r in caplog.records if r.name.startswith("aiohttp")], "the server logged errors"


async def test_log_is_off_by_default(site_dir: Path) -> None:
    async with await siteserver.start(site_dir) as running, httpx.AsyncClient(base_url=running.url) as c:
        assert (await c.get("/")).status_code == 200
        assert running.log == [] and running.url == f"http://127.0.0.1:{running.port}"


async def test_keep_alive_serves_many_requests_on_one_connection(site: RunningSite,
                                                                 client: httpx.AsyncClient) -> None:
    connects = []

    async def trace(name: str, info: dict) -> None:
        if name == "connection.connect_tcp.complete":
            connects.append(info)

    for _ in range(20):
        r = await client.get("/about.html", extensions={"trace": trace})
        assert r.status_code == 200
    assert len(connects) == 1


def test_cli_prints_the_url_and_exits_cleanly_on_sigterm(site_dir: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts/siteserver.py"), str(site_dir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url + "/", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_nginx_with_the_generated_rules_serves_the_site_alike(site: RunningSite, client: httpx.AsyncClient,
                                                                    site_dir: Path, manifest: Manifest,
                                                                    tmp_path: Path) -> None:
    # The benchmark crawls nginx; the end-to-end tests crawl this server. They must be the same site.
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")
    assert nginx, "nginx is missing: scripts/setup.sh installs it"
    port = _free_port()
    (tmp_path / "tmp").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(sitegen.nginx_config(site_dir, port, tmp_path))
    proc = await asyncio.create_subprocess_exec(nginx, "-p", str(tmp_path), "-c", str(conf),
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:   # nginx has no readiness signal with daemon off: wait for the port to accept
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                assert proc.returncode is None, (tmp_path / "error.log").read_text()
                assert time.monotonic() < deadline, "nginx did not start"
                await asyncio.sleep(0.05)
        paths = ["/", "/news", "/robots.txt", "/static/site.css", "/video/intro.mp4", *manifest.pages[:40],
                 *manifest.not_found, *manifest.redirects, *manifest.robots_disallowed, "/manifest.json",
                 "/_redirects.json", "/nginx.conf.fragment"]
        paths += [a.url for a in manifest.audio] + [a.playlist for a in manifest.audio if a.playlist]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as ngx:
            for path in paths:
                ours, theirs = await client.get(path), await ngx.get(path)
                assert ours.status_code == theirs.status_code, path
                assert ours.headers.get("location") == theirs.headers.get("location"), path
                if ours.status_code == 200:
                    assert ours.headers["content-type"] == theirs.headers["content-type"], path
                    assert ours.content == theirs.content, path
            url = manifest.large[0]
            r = await ngx.get(url, headers={"Range": "bytes=10-19"})
            assert r.status_code == 206 and r.content == (site_dir / url.lstrip("/")).read_bytes()[10:20]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
