"""Resumable downloads against a loopback server that counts the bytes it serves and misbehaves on demand.

Most tests run with both transports: httpx's own (httpcore) and the worker's aiohttp
transport (crawler/http/transport.py), which is what production uses.
Where a test bounds the bytes served by a chunk per cut, the server is rate limited so that, as on the internet,
the link and not the disk is the slow side. test_cut_connections_cost_no_byte_twice is not: at full loopback speed
every byte received before a cut must be kept, so the file is served exactly once in all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib
import json
import os
import random
import re
import signal
import sys
import threading
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from crawler.http.getter import ClientGetter, Stack
from crawler.http.transport import build_transport
from crawler.items import FAILED, OK, AudioItem, RequestIdentity
from crawler.worker.audiostore import AudioStore, Finished, extension_for, partial_key
from crawler.worker.downloader import DownloadConfig, Downloader, HostSlots, Started, _Commit, _Committer
from crawler.worker.config import WorkerConfig
from testkit.cluster import write_secret
from tests.fakes.rangeserver import RangeServer, ThreadedRangeServer, _etag_for

KiB = 1024
CHUNK = 64 * KiB
CFG = DownloadConfig(chunk_size=CHUNK, retry_backoff=0, timeout=10)
RATE = 100e6          # bytes/s: fast enough for quick tests, slow enough that the client keeps up
REPO = Path(__file__).resolve().parent.parent
STORED = re.compile(r"audio/[0-9a-f]{2}/[0-9a-f]{64}(\.[a-z0-9]{1,5})?")

pytestmark = pytest.mark.timeout(60)


def blob(size: int, seed: int) -> bytes:
    """A file of random bytes behind an MPEG audio frame header: the downloader keeps only audio."""
    return (b"\xff\xfb\x90\x64" + random.Random(seed).randbytes(size))[:size]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def server():
    async with RangeServer() as srv:
        yield srv


@pytest.fixture(params=["aiohttp", "httpcore"])
async def client(request):
    """The stack the downloader is handed: the worker's, or a Getter over a plain httpx client."""
    transport = build_transport(max_connections=16, dns_ttl=60) if request.param == "aiohttp" else None
    async with httpx.AsyncClient(transport=transport) as c:
        yield ClientGetter(c) if transport is None else Stack(transport, c)


def requests_to(srv: RangeServer, path: str) -> list:
    return [r for r in srv.log if r.path == path]


def leftovers(data_dir: Path) -> list[str]:
    partial = data_dir / "audio" / "partial"
    return sorted(p.name for p in partial.iterdir()) if partial.exists() else []


# -- the plain path --------------------------------------------------------------------------------


async def test_download_is_stored_by_content_with_its_sha256(server, client, tmp_path):
    data = blob(300_000, 1)
    server.add("/music/song.MP3", data, content_type="audio/mpeg; charset=binary")
    item = AudioItem(url=server.url("/music/song.MP3"), page="http://site/page", title="t")

    got = await Downloader(client, tmp_path, CFG).fetch(item)

    assert (got.status, got.reason) == (OK, None)
    assert got.sha256 == sha(data) and got.size == len(data) and got.content_type == "audio/mpeg"
    assert got.path == f"audio/{sha(data)[:2]}/{sha(data)}.mp3"
    assert (tmp_path / got.path).read_bytes() == data
    assert got.title == "t" and got.page == "http://site/page"
    assert server.served("/music/song.MP3") == len(data)
    assert leftovers(tmp_path) == []


async def test_extension_comes_from_content_type_when_the_url_has_none(server, client, tmp_path):
    data = blob(10_000, 2)
    server.add("/get", data, content_type="audio/flac")
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/get") + "?id=7", page="p"))
    assert got.path == f"audio/{sha(data)[:2]}/{sha(data)}.flac"


# -- interrupted transfers -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
async def test_dropped_connections_resume_losing_at_most_one_chunk_each(server, client, tmp_path, seed):
    data = blob(4_000_000, seed)
    res = server.add("/a.mp3", data)
    res.rate = RATE
    drops = server.drop_random("/a.mp3", 8, seed=seed)

    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))

    assert got.status == OK, got.reason
    assert got.sha256 == sha(data)
    assert (tmp_path / got.path).read_bytes() == data
    assert res.requests == len(drops) + 1
    assert server.served("/a.mp3") - len(data) <= len(drops) * CHUNK
    # every request after the first continued from where the file on disk ended
    ranges = [r.headers.get("range") for r in requests_to(server, "/a.mp3")]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:])
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("size", [3_000_000, CHUNK - 1000], ids=["streamed", "one-chunk"])
@pytest.mark.parametrize("seed", [11, 12, 13])
async def test_cut_connections_cost_no_byte_twice(server, client, tmp_path, seed, size):
    """The server hangs up (FIN) after exactly N body bytes at random points, as fast as loopback goes: all N
    reached the client, nothing was in flight at the cut, so every byte received is kept and each resume asks
    for the byte where the data ends. In all the file is served exactly once, with no checkpoint rounding."""
    data = blob(size, seed)
    server.add("/a.mp3", data)
    drops = server.drop_random("/a.mp3", 6, seed=seed)

    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))

    assert got.status == OK, got.reason
    assert got.sha256 == sha(data) and (tmp_path / got.path).read_bytes() == data
    assert [r.headers.get("range") for r in requests_to(server, "/a.mp3")] == [None] + [
        f"bytes={d}-" for d in drops]
    assert server.served("/a.mp3") == len(data)
    assert leftovers(tmp_path) == []


async def test_a_file_that_fits_in_one_chunk_goes_straight_to_the_store(server, client, tmp_path):
    data = blob(CHUNK, 15)
    server.add("/a.mp3", data)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and (tmp_path / got.path).read_bytes() == data
    # No part file and no sidecar were ever made: their folder would still be there.
    assert not (tmp_path / "audio" / "partial").exists()
    # Its finished record was written all the same: the next fetch of it is answered from there.
    key = partial_key(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert AudioStore(tmp_path).load_finished(key).sha256 == sha(data)


async def test_the_slots_are_given_up_once_the_bytes_are_in_before_the_file_is_stored(server, client, tmp_path):
    """`transferred` tells the caller the host is done with the download: storing the file comes after, and
    needs no slot (the worker's ask slot goes back then). It is called once, also for a file streamed to disk."""
    small, large = blob(10_000, 31), blob(3 * CHUNK, 32)
    server.add("/small.mp3", small)
    server.add("/large.mp3", large)
    downloader = Downloader(client, tmp_path, CFG)
    for name, data in (("small", small), ("large", large)):
        calls: list[bool] = []

        def transferred(calls: list[bool] = calls, data: bytes = data) -> None:
            # Not stored yet: the file is not in the store when the slot is given up.
            calls.append((tmp_path / "audio" / sha(data)[:2]).exists())

        got = await downloader.fetch(AudioItem(url=server.url(f"/{name}.mp3"), page="p"), transferred=transferred)
        assert got.status == OK and (tmp_path / got.path).read_bytes() == data
        assert calls == [False], (name, calls)
        assert downloader.hosts.holders(server.url("/").split("//")[1].rstrip("/")) == 0


async def test_connection_reset_mid_body_resumes(server, client, tmp_path):
    data = blob(2_000_000, 5)
    res = server.add("/a.mp3", data)
    res.drop_reset = True
    server.drop_random("/a.mp3", 4, seed=5)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(data)
    assert res.requests == 5


async def test_server_errors_are_retried_then_given_up(server, client, tmp_path):
    data = blob(50_000, 6)
    res = server.add("/a.mp3", data)
    res.fail_status = [503, 500]
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(data)

    res.fail_status = [503] * 20
    other = AudioItem(url=server.url("/a.mp3") + "?again", page="p")
    before = res.requests
    got = await Downloader(client, tmp_path, CFG).fetch(other)
    assert got.status == FAILED and "5 attempts" in got.reason and "503" in got.reason
    assert res.requests - before == CFG.max_attempts


async def test_cancelled_download_leaves_a_partial_that_a_new_downloader_resumes(server, client, tmp_path):
    data = blob(3_000_000, 7)
    res = server.add("/a.mp3", data)
    res.pause_at = pause = 1_500_000
    item = AudioItem(url=server.url("/a.mp3"), page="p", source_id="42")
    part = AudioStore(tmp_path).part_path(partial_key(item))

    task = asyncio.create_task(Downloader(client, tmp_path, CFG).fetch(item))
    await wait_for_size(part, pause - CHUNK)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = part.stat().st_size
    assert pause - CHUNK <= kept <= pause

    got = await Downloader(client, tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data)
    assert requests_to(server, "/a.mp3")[-1].headers["range"] == f"bytes={kept}-"
    assert server.served("/a.mp3") - len(data) <= CHUNK


_CHILD = r"""
import asyncio, sys
from pathlib import Path
import httpx
from crawler.http.getter import Stack
from crawler.http.transport import build_transport
from crawler.items import AudioItem
from crawler.worker.downloader import Downloader, DownloadConfig

async def main():
    transport = build_transport(max_connections=16, dns_ttl=60)
    async with httpx.AsyncClient(transport=transport) as client:
        cfg = DownloadConfig(chunk_size=int(sys.argv[3]), retry_backoff=0)
        dl = Downloader(Stack(transport, client), Path(sys.argv[2]), cfg)
        await dl.fetch(AudioItem(url=sys.argv[1], page="p", source_id="song-1"))

asyncio.run(main())
"""


async def test_process_killed_mid_download_resumes_after_restart(server, tmp_path):
    data = blob(6_000_000, 8)
    res = server.add("/a.mp3", data)
    res.pause_at = pause = 3_500_000      # the server holds the body here until the client goes away
    item = AudioItem(url=server.url("/a.mp3"), page="p", source_id="song-1")
    part = AudioStore(tmp_path).part_path(partial_key(item))

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, item.url, str(tmp_path), str(CHUNK),
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        await wait_for_size(part, pause - CHUNK, timeout=30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
    kept = part.stat().st_size
    sidecar = json.loads(AudioStore(tmp_path).sidecar_path(partial_key(item)).read_text())
    assert sidecar["expected_size"] == len(data) and sidecar["etag"] == res.etag

    transport = build_transport(max_connections=16, dns_ttl=60)
    async with httpx.AsyncClient(transport=transport) as client:
        got = await Downloader(Stack(transport, client), tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data)
    assert (tmp_path / got.path).read_bytes() == data
    resumed = requests_to(server, "/a.mp3")[-1]
    assert resumed.headers["range"] == f"bytes={kept}-" and resumed.headers["if-range"] == res.etag
    assert server.served("/a.mp3") - len(data) <= CHUNK


async def wait_for_size(path: Path, size: int, timeout: float = 20.0) -> None:
    """The partial file growing is an event in another task or process; polling its size is how to see it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (path.exists() and path.stat().st_size >= size):
        if loop.time() > deadline:
            raise AssertionError(f"{path.name} never reached {size} bytes")
        await asyncio.sleep(0.005)


# -- the server changes its mind -------------------------------------------------------------------


async def test_server_ignoring_the_range_starts_over_cleanly(server, client, tmp_path):
    data = blob(1_000_000, 9)
    res = server.add("/a.mp3", data)
    res.ignore_ranges = True
    res.drops = [400_000]
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(data)
    assert (tmp_path / got.path).read_bytes() == data
    assert server.served("/a.mp3") == 400_000 + len(data)     # the 200's body was kept, not fetched again


async def test_changed_etag_starts_over_with_the_new_file(server, client, tmp_path):
    old, new = blob(1_000_000, 10), blob(900_000, 11)
    res = server.add("/a.mp3", old)
    old_etag = res.etag
    res.drops = [300_000]
    res.on_drop = lambda r: server.replace_content("/a.mp3", new)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(new)
    assert (tmp_path / got.path).read_bytes() == new
    assert requests_to(server, "/a.mp3")[1].headers["if-range"] == old_etag != res.etag
    assert server.served("/a.mp3") == 300_000 + len(new)


async def test_range_with_a_new_etag_from_a_cache_ignoring_if_range_is_not_appended(server, client, tmp_path):
    old, new = blob(1_000_000, 12), blob(1_000_000, 13)
    res = server.add("/a.mp3", old)
    res.ignore_if_range = True
    res.drops = [300_000]
    res.on_drop = lambda r: server.replace_content("/a.mp3", new)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(new)
    assert [r.status for r in requests_to(server, "/a.mp3")] == [200, 206, 200]


async def test_416_after_the_file_shrank_starts_over(server, client, tmp_path):
    old, new = blob(1_000_000, 14), blob(200_000, 15)
    res = server.add("/a.mp3", old, etag=None, last_modified=None)
    res.rate = RATE
    res.drops = [600_000]
    res.on_drop = lambda r: server.replace_content("/a.mp3", new)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(new)
    assert [r.status for r in requests_to(server, "/a.mp3")] == [200, 416, 200]


async def test_416_for_a_partial_already_complete_finishes_without_refetching(server, client, tmp_path):
    data = blob(500_000, 16)
    server.add("/a.mp3", data)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    store = AudioStore(tmp_path)
    key = partial_key(item)
    # A crash after the last byte was written but before the sidecar recorded the size.
    store.partial_dir.mkdir(parents=True)
    store.part_path(key).write_bytes(data)
    store.sidecar_path(key).write_text(json.dumps({"version": 1, "url": item.url}))

    got = await Downloader(client, tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data)
    assert [r.status for r in server.log] == [416]
    assert server.served("/a.mp3") == 0


async def test_complete_partial_with_known_size_needs_no_request(server, client, tmp_path):
    data = blob(100_000, 17)
    server.add("/a.mp3", data)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    store = AudioStore(tmp_path)
    key = partial_key(item)
    store.partial_dir.mkdir(parents=True)
    store.part_path(key).write_bytes(data)
    sidecar = {"version": 1, "url": item.url, "expected_size": len(data)}
    store.sidecar_path(key).write_text(json.dumps(sidecar))
    got = await Downloader(client, tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data) and server.log == []


async def test_length_disagreeing_with_content_range_starts_over(server, client, tmp_path):
    data = blob(800_000, 18)
    res = server.add("/a.mp3", data)
    res.bad_range_length = True
    res.drops = [250_000]
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(data)
    assert [r.status for r in requests_to(server, "/a.mp3")] == [200, 206, 200]


async def test_total_size_changing_under_the_same_etag_starts_over(server, client, tmp_path):
    old, new = blob(800_000, 19), blob(900_000, 20)
    res = server.add("/a.mp3", old)
    res.drops = [250_000]
    res.on_drop = lambda r: server.replace_content("/a.mp3", new, keep_etag=True)
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == OK and got.sha256 == sha(new)


async def test_corrupt_sidecar_means_a_clean_start(server, client, tmp_path):
    data = blob(100_000, 21)
    server.add("/a.mp3", data)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    store = AudioStore(tmp_path)
    store.partial_dir.mkdir(parents=True)
    store.part_path(partial_key(item)).write_bytes(b"garbage" * 1000)
    store.sidecar_path(partial_key(item)).write_text("{not json")
    got = await Downloader(client, tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data)
    assert "range" not in server.log[0].headers


# -- expired links ---------------------------------------------------------------------------------


async def test_expired_link_is_reresolved_and_resumed_when_the_file_is_the_same(server, client, tmp_path):
    data = blob(2_000_000, 22)
    old = server.add("/old.mp3", data)
    old.rate = RATE
    old.drops = [700_000]
    old.expires_after_requests = 1
    new = server.add("/new.mp3", data, etag='"cdn-2"')    # another host's validator, same bytes
    new.rate = RATE
    item = AudioItem(url=server.url("/old.mp3"), page="p", source_id="s1", resolver="kugou")
    calls = []

    async def reresolve(it: AudioItem) -> AudioItem:
        calls.append(it)
        return it.replace(url=server.url("/new.mp3"))

    got = await Downloader(client, tmp_path, CFG).fetch(item, reresolve)

    assert got.status == OK and got.sha256 == sha(data)
    assert got.url == server.url("/new.mp3") and len(calls) == 1
    assert [r.status for r in requests_to(server, "/old.mp3")] == [200, 403]
    resumed = requests_to(server, "/new.mp3")
    assert [r.status for r in resumed] == [206] and "if-range" not in resumed[0].headers
    assert server.served("/old.mp3") + server.served("/new.mp3") - len(data) <= CHUNK


async def test_expired_link_reresolved_to_another_file_starts_over(server, client, tmp_path):
    data, other = blob(1_000_000, 23), blob(1_200_000, 24)
    old = server.add("/old.mp3", data)
    old.drops = [300_000]
    old.expires_after_requests = 1
    server.add("/new.mp3", other)

    async def reresolve(it: AudioItem) -> AudioItem:
        return it.replace(url=server.url("/new.mp3"))

    got = await Downloader(client, tmp_path, CFG).fetch(
        AudioItem(url=server.url("/old.mp3"), page="p", source_id="s2"), reresolve)
    assert got.status == OK and got.sha256 == sha(other)
    assert [r.status for r in requests_to(server, "/new.mp3")] == [206, 200]


async def test_expired_link_without_a_new_address_fails_and_keeps_the_partial(client, tmp_path):
    clock = [0.0]
    async with RangeServer(clock=lambda: clock[0]) as srv:
        data = blob(1_000_000, 25)
        res = srv.add("/old.mp3", data)
        res.rate = RATE
        res.drops = [400_000]
        srv.expire("/old.mp3", after=60)
        res.on_drop = lambda r: clock.__setitem__(0, 61.0)    # the link's lifetime runs out meanwhile

        async def nothing(it: AudioItem) -> None:
            return None

        item = AudioItem(url=srv.url("/old.mp3"), page="p", source_id="s3")
        got = await Downloader(client, tmp_path, CFG).fetch(item, nothing)
        assert got.status == FAILED and "expired" in got.reason
        kept = AudioStore(tmp_path).part_path(partial_key(item)).stat().st_size
        assert 400_000 - CHUNK <= kept <= 400_000

        # A later crawl resolves the same song to a new address: the same partial is continued.
        srv.add("/fresh.mp3", data, etag=None)
        got = await Downloader(client, tmp_path, CFG).fetch(item.replace(url=srv.url("/fresh.mp3")))
        assert got.status == OK and got.sha256 == sha(data)
        assert srv.served("/fresh.mp3") == len(data) - kept


# -- identity and redirects ------------------------------------------------------------------------


async def test_redirect_to_another_host_keeps_only_the_user_agent(server, client, tmp_path):
    data = blob(200_000, 26)
    res = server.add("/a.mp3", data)
    res.user_agent = "Player/2.0"           # the link is bound to the client that asked for it
    server.add("/go", b"").redirect_to = server.url("/a.mp3", host="127.0.0.2")
    ident = RequestIdentity(user_agent="Player/2.0", headers=(("Referer", "http://site/page"),),
                            cookies=(("sid", "secret"),))
    got = await Downloader(client, tmp_path, CFG).fetch(
        AudioItem(url=server.url("/go"), page="p", identity=ident))

    assert got.status == OK and got.sha256 == sha(data)
    first, second = server.log
    assert first.host == "127.0.0.1" and first.headers["cookie"] == "sid=secret"
    assert first.headers["referer"] == "http://site/page"
    assert second.host == "127.0.0.2" and second.headers["user-agent"] == "Player/2.0"
    assert "cookie" not in second.headers and "referer" not in second.headers


async def test_link_bound_to_a_user_agent_fails_without_it(server, client, tmp_path):
    server.add("/a.mp3", blob(1000, 27)).user_agent = "Player/2.0"
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/a.mp3"), page="p"))
    assert got.status == FAILED and "403" in got.reason


async def test_redirects_are_capped(server, client, tmp_path):
    server.add("/loop", b"").redirect_to = server.url("/loop")
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/loop"), page="p"))
    assert got.status == FAILED and "redirects" in got.reason
    assert len(server.log) == CFG.max_redirects + 1


# -- limits, dedup, paths --------------------------------------------------------------------------


async def test_file_over_the_size_limit_is_refused_and_nothing_is_kept(server, client, tmp_path):
    server.add("/big.mp3", blob(100_000, 28))
    cfg = DownloadConfig(max_size=50_000, chunk_size=CHUNK, retry_backoff=0)
    got = await Downloader(client, tmp_path, cfg).fetch(AudioItem(url=server.url("/big.mp3"), page="p"))
    assert got.status == FAILED and "too large" in got.reason
    assert leftovers(tmp_path) == [] and got.path is None


async def test_same_content_is_stored_once_and_each_item_keeps_its_place(server, client, tmp_path):
    data = blob(150_000, 29)
    server.add("/one.mp3", data)
    server.add("/two", data, content_type="audio/ogg")
    dl = Downloader(client, tmp_path, CFG)
    a = await dl.fetch(AudioItem(url=server.url("/one.mp3"), page="http://a/page"))
    b = await dl.fetch(AudioItem(url=server.url("/two"), page="http://b/page"))

    assert a.sha256 == b.sha256 == sha(data) and a.path == b.path
    stored = [p for p in (tmp_path / "audio").rglob("*") if p.is_file() and STORED.fullmatch(
        p.relative_to(tmp_path).as_posix())]
    assert len(stored) == 1
    # Where it was found travels with each item to the master's catalogue; the worker keeps no index of it.
    assert (a.url, a.page, b.url, b.page) == (server.url("/one.mp3"), "http://a/page", server.url("/two"),
                                              "http://b/page")
    assert not [p for p in (tmp_path / "audio").rglob("*.places.json")]


def test_a_batch_of_small_files_stores_each_content_once_and_fails_only_its_bad_entry(tmp_path):
    store = AudioStore(tmp_path)
    old, new, twice = blob(3000, 40), blob(4000, 41), blob(5000, 42)
    first = store.put(sha(old), [old], len(old), ".ogg")
    store.save_finished_many([("k", Finished(url="http://h/a.ogg", sha256=sha(old), size=len(old), path=first))])
    out = store.put_many([
        (sha(old), [old], len(old), ".mp3"),              # stored before under another name: found, not rewritten
        (sha(twice), [twice[:10], twice[10:]], len(twice), ".mp3"),
        ("not a hash", [new], len(new), ".mp3"),          # refused: its own error, nobody else's
        (sha(twice), [twice], len(twice), ".m4a"),        # the same content again in the batch: written once
        (sha(new), [new], len(new), "/../x"),
        (sha(new), [new], len(new), ""),
    ])
    assert out[0] == first
    assert out[1] == out[3] == f"audio/{sha(twice)[:2]}/{sha(twice)}.mp3"
    assert isinstance(out[2], ValueError) and isinstance(out[4], ValueError)
    assert out[5] == f"audio/{sha(new)[:2]}/{sha(new)}"
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "audio").rglob("*")
                   if p.is_file() and STORED.fullmatch(p.relative_to(tmp_path).as_posix()))
    assert files == sorted({first, out[1], out[5]})
    assert (tmp_path / out[1]).read_bytes() == twice


def test_a_file_under_its_own_name_is_kept_whole_and_written_again_when_cut_short(tmp_path):
    """New content is created without a stat first (O_EXCL); a name that exists is kept when it holds the file
    at its size, and a file a crash cut short is written again."""
    store = AudioStore(tmp_path)
    whole, cut = blob(3000, 60), blob(4000, 61)
    kept = store.put(sha(whole), [whole], len(whole), ".mp3")
    before = os.stat(tmp_path / kept)
    (tmp_path / f"audio/{sha(cut)[:2]}").mkdir(exist_ok=True)
    (tmp_path / f"audio/{sha(cut)[:2]}/{sha(cut)}.mp3").write_bytes(cut[:100])
    out = store.put_many([(sha(whole), [whole], len(whole), ".mp3"), (sha(cut), [cut], len(cut), ".mp3")])
    assert out == [kept, f"audio/{sha(cut)[:2]}/{sha(cut)}.mp3"]
    after = os.stat(tmp_path / kept)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert (tmp_path / out[1]).read_bytes() == cut


async def test_files_waiting_to_be_stored_are_bounded_in_bytes(tmp_path):
    """A download hands its in-memory file to the store only once the bytes waiting there are under the bound:
    a disk slower than the network holds the downloads back, not memory."""
    disk = threading.Event()

    class SlowDisk(AudioStore):
        def put_many(self, files):
            disk.wait(30)     # the disk answers when the test says so
            return super().put_many(files)

    committer = _Committer(SlowDisk(tmp_path), gather=60.0, max_bytes=10_000)

    def entry(data: bytes) -> _Commit:
        return _Commit(key=sha(data)[:16], pieces=[data], size=len(data), ext=".mp3", tags=False,
                       record=Finished(url="http://h/a.mp3", sha256="", size=len(data), path=""))

    first = committer.commit(entry(blob(4000, 50)))
    await committer.room()              # 4,000 bytes waiting: room, and the batch waits for its gather time
    assert not first.done()
    second = committer.commit(entry(blob(7000, 51)))   # past the bound: the batch goes at once
    waiting = asyncio.ensure_future(committer.room())
    for _ in range(10):               # loop turns: the batch goes to its thread, which the disk holds
        await asyncio.sleep(0)
    assert not waiting.done() and not first.done()    # no room while the batch is being stored
    disk.set()
    done = await asyncio.gather(first, second)
    await asyncio.wait_for(waiting, 5)
    assert [(tmp_path / record.path).stat().st_size for record, _ in done] == [4000, 7000]


async def test_concurrent_fetches_of_one_song_share_one_download(server, client, tmp_path):
    data = blob(1_000_000, 30)
    server.add("/a.mp3", data).rate = RATE
    dl = Downloader(client, tmp_path, CFG)
    items = [AudioItem(url=server.url("/a.mp3"), page=f"http://site/{i}", source_id="same") for i in range(3)]
    got = await asyncio.gather(*(dl.fetch(i) for i in items))
    assert [g.status for g in got] == [OK] * 3 and {g.sha256 for g in got} == {sha(data)}
    assert [g.page for g in got] == [i.page for i in items]
    assert server.served("/a.mp3") == len(data)


async def test_hostile_url_cannot_choose_where_the_file_lands(server, client, tmp_path):
    path = "/x/..%2F..%2F..%2Fetc%2Fcron.d%2Fevil.sh%00.mp3%2F..%2F"
    data = blob(5000, 31)
    server.add(path, data, content_type="../../x")
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url(path), page="p"))
    assert got.status == OK and STORED.fullmatch(got.path)
    assert (tmp_path / got.path).resolve().is_relative_to(tmp_path.resolve())


@given(st.text(max_size=80), st.text(max_size=40), st.one_of(st.none(), st.text(max_size=40)))
def test_extension_is_always_safe(path, query, content_type):
    ext = extension_for([f"http://h/{path}?{query}", path], content_type)
    assert ext == "" or re.fullmatch(r"\.[a-z0-9]{1,5}", ext)


def test_threaded_server_serves_ranges_to_blocking_callers():
    data = blob(10_000, 32)
    with ThreadedRangeServer(second_host=False) as srv:
        srv.add("/a.mp3", data)
        whole = httpx.get(srv.url("/a.mp3"))
        tail = httpx.get(srv.url("/a.mp3"), headers={"Range": "bytes=9000-"})
        beyond = httpx.get(srv.url("/a.mp3"), headers={"Range": "bytes=10000-"})
    assert whole.status_code == 200 and whole.content == data
    assert tail.status_code == 206 and tail.content == data[9000:]
    assert tail.headers["content-range"] == "bytes 9000-9999/10000"
    assert beyond.status_code == 416 and beyond.headers["content-range"] == "bytes */10000"
    assert srv.served("/a.mp3") == len(data) + 1000


def test_partial_key_follows_the_song_not_the_address():
    a = AudioItem(url="http://a/1.mp3", page="p", source_id="abc", resolver="kugou")
    assert partial_key(a) == partial_key(a.replace(url="http://b/other.mp3"))
    assert partial_key(a) != partial_key(a.replace(resolver="other"))
    assert partial_key(AudioItem(url="http://a/1.mp3", page="p")) != partial_key(
        AudioItem(url="http://a/2.mp3", page="p"))


def test_config_rejects_nonsense():
    with pytest.raises(ValueError):
        DownloadConfig(chunk_size=0)
    assert DownloadConfig().max_size == 2 * 1024**3 and DownloadConfig().chunk_size == 1024 * KiB


# -- finished downloads are not repeated -----------------------------------------------------------

DAY = 86_400.0


class Clock:
    """Wall-clock time the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def finished_downloader(client, data_dir: Path, clock: Clock, **cfg) -> Downloader:
    return Downloader(client, data_dir, DownloadConfig(chunk_size=CHUNK, retry_backoff=0, timeout=10, **cfg),
                      clock=clock)


async def test_second_fetch_within_revalidate_after_makes_no_request(server, client, tmp_path):
    data = blob(300_000, 40)
    server.add("/a.mp3", data)
    clock = Clock()
    item = AudioItem(url=server.url("/a.mp3"), page="http://site/1", source_id="s40", resolver="site")
    first = await finished_downloader(client, tmp_path, clock).fetch(item)
    assert first.status == OK and len(server.log) == 1

    clock.now += DAY - 1
    again = item.replace(page="http://site/2")
    # A new Downloader: what it knows came from the disk, as after a worker restart.
    got = await finished_downloader(client, tmp_path, clock).fetch(again)

    assert len(server.log) == 1 and server.served("/a.mp3") == len(data)
    assert (got.status, got.sha256, got.size, got.path) == (OK, sha(data), len(data), first.path)
    assert got.content_type == "audio/mpeg" and got.page == "http://site/2"


@pytest.mark.parametrize("later", [DAY + 1, -3600.0], ids=["stale", "clock-set-back"])
async def test_an_old_record_is_confirmed_by_a_304_that_costs_no_body(server, client, tmp_path, later):
    data = blob(300_000, 41)
    res = server.add("/a.mp3", data)
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    first = await dl.fetch(item)

    clock.now += later
    got = await dl.fetch(item)
    assert (got.status, got.sha256, got.path) == (OK, sha(data), first.path)
    confirm = server.log[-1]
    assert confirm.status == 304 and confirm.headers["if-none-match"] == res.etag
    assert "range" not in confirm.headers and server.served("/a.mp3") == len(data)
    assert leftovers(tmp_path) == []

    # The confirmation counts as a verification: the next fetch soon after asks nothing.
    clock.now += 60
    await dl.fetch(item)
    assert len(server.log) == 2
    assert (dl.stats.fetched, dl.stats.confirmed, dl.stats.reused) == (1, 1, 1)


@pytest.mark.parametrize("etag", [None, 'W/"weak"'], ids=["no-etag", "weak-etag"])
async def test_without_a_strong_etag_if_modified_since_is_asked(server, client, tmp_path, etag):
    data = blob(100_000, 42)
    res = server.add("/a.mp3", data, etag=etag)
    dl = finished_downloader(client, tmp_path, Clock(), revalidate_after=0)    # 0: always ask
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    await dl.fetch(item)
    got = await dl.fetch(item)
    assert got.status == OK and got.sha256 == sha(data)
    confirm = server.log[-1]
    assert confirm.status == 304 and confirm.headers["if-modified-since"] == res.last_modified
    assert "if-none-match" not in confirm.headers and server.served("/a.mp3") == len(data)


async def test_a_changed_file_is_downloaded_again_in_the_same_request(server, client, tmp_path):
    old, new = blob(200_000, 43), blob(250_000, 44)
    res = server.add("/a.mp3", old)
    old_etag = res.etag
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    first = await dl.fetch(item)
    server.replace_content("/a.mp3", new)

    clock.now += DAY + 1
    got = await dl.fetch(item)
    assert got.status == OK and got.sha256 == sha(new) and (tmp_path / got.path).read_bytes() == new
    assert server.log[-1].headers["if-none-match"] == old_etag and server.log[-1].status == 200
    assert server.served("/a.mp3") == len(old) + len(new) and len(server.log) == 2
    assert (tmp_path / first.path).read_bytes() == old     # evidence already kept is not thrown away

    # The record now describes the new file.
    clock.now += 60
    assert (await dl.fetch(item)).sha256 == sha(new) and len(server.log) == 2


async def test_a_server_ignoring_conditionals_costs_a_download_not_a_second_copy(server, client, tmp_path):
    data = blob(200_000, 45)
    server.add("/a.mp3", data).ignore_conditionals = True
    dl = finished_downloader(client, tmp_path, Clock(), revalidate_after=0)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    first = await dl.fetch(item)
    got = await dl.fetch(item)
    assert got.status == OK and got.path == first.path and [r.status for r in server.log] == [200, 200]
    stored = [p for p in (tmp_path / "audio").rglob("*") if p.is_file() and STORED.fullmatch(
        p.relative_to(tmp_path).as_posix())]
    assert len(stored) == 1 and leftovers(tmp_path) == []


async def test_a_deleted_stored_file_is_downloaded_again(server, client, tmp_path):
    data = blob(200_000, 46)
    server.add("/a.mp3", data)
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    first = await dl.fetch(item)
    (tmp_path / first.path).unlink()          # an operator cleaned up the disk

    got = await dl.fetch(item)                # the record is recent, but describes nothing any more
    assert got.status == OK and (tmp_path / got.path).read_bytes() == data
    assert len(server.log) == 2 and server.log[-1].status == 200
    assert "if-none-match" not in server.log[-1].headers and "if-modified-since" not in server.log[-1].headers
    assert (dl.stats.fetched, dl.stats.reused) == (2, 0)


async def test_a_truncated_stored_file_is_downloaded_again(server, client, tmp_path):
    data = blob(200_000, 47)
    server.add("/a.mp3", data)
    dl = finished_downloader(client, tmp_path, Clock())
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    first = await dl.fetch(item)
    os.truncate(tmp_path / first.path, 1000)
    got = await dl.fetch(item)
    assert got.status == OK and len(server.log) == 2
    assert (tmp_path / got.path).read_bytes() == data


_PASSWD_PATH = "../../../../etc/passwd"


@pytest.mark.parametrize("corrupt", [
    b"", b"{not json", b"\xff\xfe\x00garbage", b"[1, 2]", b"[" * 100_000,
    json.dumps({"version": 1, "url": "u", "sha256": "0" * 64, "size": 1, "path": _PASSWD_PATH,
                "verified_at": 1e18}).encode(),
    json.dumps({"version": 1, "url": "u", "sha256": "0" * 64, "size": True, "path": "audio/00/" + "0" * 64,
                "verified_at": 1e18}).encode(),
    b'{"version": 1, "url": "u", "sha256": "' + b"0" * 64 + b'", "size": 1, "path": "audio/00/' + b"0" * 64
    + b'", "verified_at": 1' + b"0" * 400 + b"}",
], ids=["empty", "broken-json", "not-utf8", "not-a-map", "deep", "path-escapes", "bool-size", "huge-time"])
async def test_a_corrupt_record_is_ignored_and_replaced(server, client, tmp_path, corrupt):
    data = blob(50_000, 48)
    server.add("/a.mp3", data)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    store = AudioStore(tmp_path)
    record = store.finished_path(partial_key(item))
    record.parent.mkdir(parents=True)
    record.write_bytes(corrupt)

    got = await finished_downloader(client, tmp_path, Clock()).fetch(item)

    assert got.status == OK and got.sha256 == sha(data) and STORED.fullmatch(got.path)
    assert len(server.log) == 1 and "if-none-match" not in server.log[0].headers
    replaced = store.load_finished(partial_key(item))
    assert replaced is not None and replaced.sha256 == sha(data) and replaced.path == got.path


async def test_one_address_under_two_keys_is_downloaded_once(server, client, tmp_path):
    data = blob(500_000, 49)
    server.add("/shared.mp3", data).rate = RATE
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    url = server.url("/shared.mp3")
    # Two sites' ids for one CDN file, found at the same time and later again.
    a, b = (AudioItem(url=url, page=f"http://{s}/p", source_id="1", resolver=s) for s in ("x", "y"))
    assert partial_key(a) != partial_key(b)
    got = await asyncio.gather(dl.fetch(a), dl.fetch(b))
    assert [g.sha256 for g in got] == [sha(data)] * 2 and server.served("/shared.mp3") == len(data)

    assert (dl.stats.fetched, dl.stats.shared) == (1, 1)
    c = AudioItem(url=url, page="http://z/p", source_id="1", resolver="z")
    assert (await dl.fetch(c)).path == got[0].path and len(server.log) == 1
    assert dl.stats.reused == 1
    # ... and c's key now has a durable record of its own, for after a restart.
    assert AudioStore(tmp_path).load_finished(partial_key(c)) is not None


async def test_addresses_remembered_in_memory_are_bounded(server, client, tmp_path):
    dl = finished_downloader(client, tmp_path, Clock(), remembered_urls=2)
    for i in range(3):
        server.add(f"/{i}.mp3", blob(1000, 50 + i))
        await dl.fetch(AudioItem(url=server.url(f"/{i}.mp3"), page="p", source_id=str(i)))
    requests = len(server.log)
    # Other keys for the last two addresses are served from memory; the first address was forgotten.
    for i in (2, 1, 0):
        await dl.fetch(AudioItem(url=server.url(f"/{i}.mp3"), page="p", source_id=f"other-{i}"))
    assert [r.path for r in server.log[requests:]] == ["/0.mp3"]


async def test_an_expired_link_met_while_revalidating_is_reresolved_and_confirmed(server, client, tmp_path):
    data = blob(300_000, 53)
    old = server.add("/old.mp3", data)
    server.add("/new.mp3", data, etag=old.etag, last_modified="Mon, 01 Jan 2024 00:00:00 GMT")
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    item = AudioItem(url=server.url("/old.mp3"), page="p", source_id="s53", resolver="site")
    first = await dl.fetch(item)
    server.expire("/old.mp3", status=410)

    async def reresolve(it: AudioItem) -> AudioItem:
        return it.replace(url=server.url("/new.mp3"))

    clock.now += DAY + 1
    got = await dl.fetch(item, reresolve)
    assert (got.status, got.url, got.path) == (OK, server.url("/new.mp3"), first.path)
    ask = requests_to(server, "/new.mp3")
    # The same ETag from the new address; its dates mean nothing to the old record, so none is sent.
    assert [r.status for r in ask] == [304] and ask[0].headers["if-none-match"] == old.etag
    assert "if-modified-since" not in ask[0].headers and server.served("/new.mp3") == 0


async def test_a_date_from_one_address_is_not_sent_to_another(server, client, tmp_path):
    data = blob(100_000, 55)
    server.add("/old.mp3", data, etag=None)
    server.add("/new.mp3", data, etag=None)
    clock = Clock()
    dl = finished_downloader(client, tmp_path, clock)
    item = AudioItem(url=server.url("/old.mp3"), page="p", source_id="s55", resolver="site")
    first = await dl.fetch(item)

    clock.now += DAY + 1       # a later crawl resolves the song to a new address
    got = await dl.fetch(item.replace(url=server.url("/new.mp3")))
    ask = requests_to(server, "/new.mp3")
    assert [r.status for r in ask] == [200] and "if-modified-since" not in ask[0].headers
    assert got.path == first.path


async def test_validators_a_304_brings_are_kept_for_the_next_question(server, client, tmp_path):
    data = blob(100_000, 56)
    res = server.add("/a.mp3", data, etag=None)
    dl = finished_downloader(client, tmp_path, Clock(), revalidate_after=0)
    item = AudioItem(url=server.url("/a.mp3"), page="p")
    await dl.fetch(item)
    res.etag = '"added-later"'          # the server started sending ETags
    await dl.fetch(item)
    await dl.fetch(item)
    assert [r.status for r in server.log] == [200, 304, 304]
    assert "if-modified-since" in server.log[1].headers
    assert server.log[2].headers.get("if-none-match") == '"added-later"'


_FINISH_THEN_HANG = r"""
import asyncio, sys
from pathlib import Path
import httpx
from crawler.http.getter import ClientGetter
from crawler.items import AudioItem
from crawler.worker.downloader import Downloader, DownloadConfig

async def main():
    async with httpx.AsyncClient() as client:
        got = await Downloader(ClientGetter(client), Path(sys.argv[2]), DownloadConfig()).fetch(
            AudioItem(url=sys.argv[1], page="p", source_id="song-9"))
        print(got.status, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_the_record_outlives_a_killed_process(server, tmp_path):
    data = blob(200_000, 54)
    server.add("/a.mp3", data)
    item = AudioItem(url=server.url("/a.mp3"), page="p", source_id="song-9")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FINISH_THEN_HANG, item.url, str(tmp_path), stdout=asyncio.subprocess.PIPE,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
    assert line.strip() == b"ok" and await proc.wait() == -signal.SIGKILL

    async with httpx.AsyncClient() as client:
        got = await Downloader(ClientGetter(client), tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(data) and len(server.log) == 1


# -- per-host limits -------------------------------------------------------------------------------


async def test_downloads_to_one_host_are_limited_while_another_host_proceeds(server, client, tmp_path):
    busy = [server.add(f"/cdn/{i}.mp3", blob(400_000, 60 + i)) for i in range(5)]
    for res in busy:
        res.pause_at = 100_000        # held mid-body until released: the downloads overlap for sure
        res.rate = 20e6
    server.add("/other.mp3", blob(100_000, 70))
    dl = finished_downloader(client, tmp_path, Clock(), max_per_host=2)
    tasks = [asyncio.create_task(dl.fetch(AudioItem(url=server.url(r.path), page="p"))) for r in busy]
    await server.wait_until(lambda: server.active["127.0.0.1"] == 2)

    elsewhere = AudioItem(url=server.url("/other.mp3", host="127.0.0.2"), page="p")
    other = await asyncio.wait_for(dl.fetch(elsewhere), 10)
    assert other.status == OK, "a busy host held up another host's download"
    assert sum(r.requests for r in busy) == 2 and dl.hosts.holders("127.0.0.1") == 2

    server.release()
    got = await asyncio.gather(*tasks)
    assert [g.status for g in got] == [OK] * 5 and sum(r.requests for r in busy) == 5
    assert server.peak["127.0.0.1"] == 2
    assert len(dl.hosts) == 0, "idle hosts are forgotten"


async def test_the_workers_downloads_per_host_bounds_one_host_while_its_downloads_bound_all(server, client,
                                                                                          tmp_path):
    """The worker's keys reach the downloader: `downloads_per_host` downloads at once to one host (here 3, of 32
    in all), whatever the worker's `downloads` leaves room for."""
    cfg = WorkerConfig.build(None, {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path),
                                    "secret_file": str(write_secret(tmp_path / "s")), "downloads_per_host": 3})
    assert (cfg.downloads, cfg.downloads_per_host) == (32, 3)
    dl_cfg = cfg.download_config()
    assert (dl_cfg.max_downloads, dl_cfg.max_per_host) == (32, 3)
    assert WorkerConfig.build(None, {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path),
                                     "secret_file": str(tmp_path / "s")}).download_config().max_per_host == 4
    busy = [server.add(f"/cdn/{i}.mp3", blob(400_000, 90 + i)) for i in range(7)]
    for res in busy:
        res.pause_at = 100_000        # held mid-body until released: the downloads overlap for sure
        res.rate = 20e6
    dl = Downloader(client, tmp_path, dataclasses.replace(dl_cfg, chunk_size=CHUNK, retry_backoff=0, timeout=10))
    tasks = [asyncio.create_task(dl.fetch(AudioItem(url=server.url(r.path), page="p"))) for r in busy]
    await server.wait_until(lambda: server.active["127.0.0.1"] == 3)
    assert sum(r.requests for r in busy) == 3 and dl.hosts.holders("127.0.0.1") == 3
    server.release()
    got = await asyncio.gather(*tasks)
    assert [g.status for g in got] == [OK] * 7 and server.peak["127.0.0.1"] == 3


async def test_max_downloads_bounds_all_hosts_together(server, client, tmp_path):
    items = [AudioItem(url=server.url(f"/{i}.mp3", host=f"127.0.0.{1 + i % 2}"), page="p") for i in range(4)]
    for i in range(4):
        res = server.add(f"/{i}.mp3", blob(200_000, 80 + i))
        res.rate = 20e6
    dl = finished_downloader(client, tmp_path, Clock(), max_per_host=2, max_downloads=1)
    got = await asyncio.gather(*(dl.fetch(i) for i in items))
    assert [g.status for g in got] == [OK] * 4
    assert server.peak_total == 1 and len(dl.hosts) == 0


async def test_a_cancelled_waiter_leaves_no_host_behind():
    slots = HostSlots(1)
    await slots.acquire("cdn")
    waiter = asyncio.create_task(slots.acquire("cdn"))
    await asyncio.sleep(0)          # let it queue behind the holder
    assert slots.holders("cdn") == 1 and len(slots) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots.release("cdn")
    assert len(slots) == 0
    await slots.acquire("cdn")      # and the host is usable again
    assert slots.holders("cdn") == 1


def test_config_rejects_nonsense_limits():
    for bad in ({"max_per_host": 0}, {"max_downloads": 0}, {"revalidate_after": -1}, {"remembered_urls": -1}):
        with pytest.raises(ValueError):
            DownloadConfig(**bad)
    assert DownloadConfig().max_per_host == 2 and DownloadConfig().revalidate_after == DAY


# -- hostile servers -----------------------------------------------------------------------------------

async def test_a_body_that_is_not_audio_is_failed_not_catalogued(server, client, tmp_path):
    server.add("/song.mp3", b"<!doctype html><html><body>404 not found</body></html>" * 50)
    server.add("/tool.mp3", b"MZ\x90\x00" + b"\0" * 5000, content_type="audio/mpeg")   # an executable
    for path in ("/song.mp3", "/tool.mp3"):
        got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url(path), page="p"))
        assert (got.status, got.reason, got.sha256) == (FAILED, "not audio", None)
    assert leftovers(tmp_path) == [] and not list((tmp_path / "audio").rglob("*.mp3"))


async def test_a_trickling_download_is_cut_off_by_its_deadline_and_kept_for_later(server, client, tmp_path,
                                                                                    fake_clock):
    data = blob(1_000_000, 40)
    res = server.add("/slow.mp3", data)
    res.pause_at = 3 * CHUNK              # then nothing more: the slowest trickle
    cfg = dataclasses.replace(CFG, deadline_base=0.5, min_rate=1_000_000)    # 0.5 s + 1 s for its size
    item = AudioItem(url=server.url("/slow.mp3"), page="p")
    kept = AudioStore(tmp_path).part_path(partial_key(item))
    fetch = asyncio.ensure_future(Downloader(client, tmp_path, cfg, deadline_clock=fake_clock).fetch(item))
    await wait_for_size(kept, CHUNK)      # bytes arrive, and go on disk
    fake_clock.advance(1.4)
    await asyncio.sleep(0)
    assert not fetch.done()               # its deadline is not yet due
    fake_clock.advance(0.2)
    got = await asyncio.wait_for(fetch, 10)
    assert got.status == FAILED and got.reason.startswith("download too slow"), got.reason
    assert got.reason.endswith("in 2 s (deadline 0 s + size at 1000000 B/s)"), got.reason   # the clock's 1.6 s
    assert CHUNK <= kept.stat().st_size < len(data)      # the bytes so far stay for a later resume


async def test_a_short_deadline_is_kept_while_a_long_download_holds_a_far_one(server, client, tmp_path, fake_clock):
    # One timer keeps every download's deadline: a large file's deadline stretched far ahead must not hold
    # back a small file's deadline that comes due long before it.
    big, small = blob(1_000_000, 41), blob(2_000, 42)
    server.add("/big.mp3", big).pause_at = 3 * CHUNK    # its deadline: 0.5 s + 100 s for its size
    server.add("/small.mp3", small).pause_at = 100      # held after 100 bytes; its deadline: 0.5 s + 0.2 s
    cfg = dataclasses.replace(CFG, deadline_base=0.5, min_rate=10_000)
    dl = Downloader(client, tmp_path, cfg, deadline_clock=fake_clock)
    big_item = AudioItem(url=server.url("/big.mp3"), page="p")
    long = asyncio.ensure_future(dl.fetch(big_item))
    try:
        await wait_for_size(AudioStore(tmp_path).part_path(partial_key(big_item)), CHUNK)   # its size is known
        fake_clock.advance(1.0)      # past the big one's first deadline: the timer is now set ~100 s ahead
        await asyncio.sleep(0)
        assert not long.done()
        assert fake_clock.alarms() == [pytest.approx(fake_clock.now - 1.0 + 100.5)]
        short = asyncio.ensure_future(dl.fetch(AudioItem(url=server.url("/small.mp3"), page="p")))
        await server.wait_until(lambda: bool(requests_to(server, "/small.mp3")))   # its deadline is kept
        fake_clock.advance(0.8)
        got = await asyncio.wait_for(short, 10)
        assert got.status == FAILED and got.reason.startswith("download too slow"), got.reason
        assert not long.done()       # the other download goes on
    finally:
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long


async def test_a_download_cancelled_from_outside_is_cancelled_not_timed_out(server, client, tmp_path, fake_clock):
    server.add("/slow.mp3", blob(1_000_000, 43)).pause_at = 3 * CHUNK
    cfg = dataclasses.replace(CFG, deadline_base=0.3, min_rate=1_000_000)
    dl = Downloader(client, tmp_path, cfg, deadline_clock=fake_clock)
    task = asyncio.ensure_future(dl.fetch(AudioItem(url=server.url("/slow.mp3"), page="p")))
    await server.wait_until(lambda: bool(requests_to(server, "/slow.mp3")))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Its deadline went with it: a later download is not cancelled by it.
    server.add("/ok.mp3", blob(3_000, 44))
    fake_clock.advance(1.5)
    got = await dl.fetch(AudioItem(url=server.url("/ok.mp3"), page="p"))
    assert got.status == OK, got.reason


async def test_an_encoded_download_is_refused(client, tmp_path):
    body = gzip.compress(b"\xff\xfb\x90\x64" + b"\0" * 100_000)

    async def encoded(request):
        return web.Response(body=body, headers={"Content-Type": "audio/mpeg", "Content-Encoding": "gzip"})

    async def stacked(request):
        return web.Response(body=gzip.compress(body), headers={"Content-Type": "audio/mpeg",
                                                                "Content-Encoding": "gzip, gzip"})

    app = web.Application()
    app.router.add_get("/enc.mp3", encoded)
    app.router.add_get("/stacked.mp3", stacked)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        for path in ("/enc.mp3", "/stacked.mp3"):
            got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=base + path, page="p"))
            # Through our transport the coding is refused; through plain httpcore the gzip bytes are not audio.
            assert got.status == FAILED and got.sha256 is None, got
    finally:
        await runner.cleanup()


async def test_a_large_body_that_is_not_audio_is_refused_from_its_first_bytes(server, client, tmp_path):
    res = server.add("/big.mp3", b"<html>" + b"x" * (64 * 1024 * 1024))
    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=server.url("/big.mp3"), page="p"))
    assert (got.status, got.reason) == (FAILED, "not audio")
    assert res.served < 16 * 1024 * 1024         # cut off early (what sits in socket buffers aside)
    assert leftovers(tmp_path) == []


# -- the file's own tags ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mp3", "ogg", "m4a"])
@pytest.mark.parametrize("size", [CHUNK // 2, 3 * CHUNK], ids=["from-memory", "from-disk"])
async def test_file_tags_come_back_with_the_item_whichever_way_it_was_stored(server, client, tmp_path, kind, size):
    from tests.fakes import audiofiles

    data = audiofiles.write(tmp_path / f"src.{kind}", kind, "Título", "Artíst", "Albüm", size=size).read_bytes()
    server.add(f"/a.{kind}", data, content_type="application/octet-stream")
    dl = Downloader(client, tmp_path / "data", CFG, file_tags=True)
    item = AudioItem(url=server.url(f"/a.{kind}"), page="p", title="Título")

    got = await dl.fetch(item)
    assert got.status == OK, got.reason
    assert (got.title, got.artist, got.album) == ("Título", "Artíst", "Albüm")
    assert got.meta_source.get("artist") == "file" and got.codec
    # Fetched again (a record answers, no request): the tags are read from the stored file.
    again = await dl.fetch(item.replace(page="q"))
    assert (again.artist, again.codec, len(server.log)) == ("Artíst", got.codec, 1)


# -- a download that starts from the bytes its page fetch read --------------------------------------------------

async def test_a_stream_fetched_as_a_page_resumes_after_the_bytes_that_fetch_read(server, client, tmp_path):
    data = blob(300_000, 41)
    server.add("/stream/1", data, content_type="audio/mpeg")
    url = server.url("/stream/1")
    start = Started(url=url, body=data[:65536], size=len(data), etag=_etag_for(server.resource("/stream/1")),
                    content_type="audio/mpeg")

    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=url, page="http://site/p"), start=start)

    assert (got.status, got.sha256, got.size) == (OK, sha(data), len(data))
    [asked] = requests_to(server, "/stream/1")
    assert asked.headers["range"] == "bytes=65536-" and asked.headers["if-range"] == start.etag
    assert server.served("/stream/1") == len(data) - 65536
    assert leftovers(tmp_path) == []


async def test_a_stream_the_page_fetch_read_whole_needs_no_request(server, client, tmp_path):
    data = blob(20_000, 42)
    server.add("/stream/2", data, content_type="audio/mpeg")
    url = server.url("/stream/2")
    start = Started(url=url, body=data, size=len(data), content_type="audio/mpeg")
    dl = Downloader(client, tmp_path, CFG, file_tags=True)
    sidecars, parts = [], []
    dl.store.save_sidecar = lambda key, record: sidecars.append(key)
    dl.store.commit = lambda *a: parts.append(a)

    got = await dl.fetch(AudioItem(url=url, page="http://site/p"), start=start)

    assert (got.status, got.sha256, got.size) == (OK, sha(data), len(data))
    assert requests_to(server, "/stream/2") == []
    # Stored from memory, as a file that came whole in one chunk: no part file, no sidecar, its tags read there.
    assert sidecars == [] and parts == [] and leftovers(tmp_path) == []
    assert (tmp_path / got.path).read_bytes() == data and got.path not in dl._fresh_tags


async def test_a_start_that_is_not_the_files_is_thrown_away(server, client, tmp_path):
    data = blob(200_000, 43)
    server.add("/stream/3", data, content_type="audio/mpeg")
    url = server.url("/stream/3")
    # Bytes of another version of the file (another ETag): the server's If-Range sends the whole file again.
    start = Started(url=url, body=blob(65536, 44), size=len(data), etag='"old"', content_type="audio/mpeg")

    got = await Downloader(client, tmp_path, CFG).fetch(AudioItem(url=url, page="http://site/p"), start=start)

    assert (got.status, got.sha256) == (OK, sha(data))
    assert (tmp_path / got.path).read_bytes() == data
