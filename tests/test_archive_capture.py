"""Every exchange besides page fetches handed to the archive: resolvers' API calls, robots.txt, downloads (each
ranged exchange of a resumed one, a 304 that confirms a stored file), HLS playlists and segments, and the metadata
record that names a stored file. Real loopback servers; the archive is tests/fakes/archive.py's Collected."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator

import httpx
import pytest

from crawler.archive import NO_ARCHIVE
from crawler.http.getter import Stack, build_stack
from crawler.http.recording import RecordingTransport, recorded_as
from crawler.http.transport import AiohttpTransport
from crawler.items import OK, AudioItem, RequestIdentity
from crawler.master.server import fetch_robots
from crawler.resolvers import ResolveContext
from crawler.resolvers.kugou import DESKTOP_USER_AGENT, KugouResolver
from crawler.worker import archived
from crawler.worker.downloader import DownloadConfig, Downloader
from testkit.hls import make_stream
from tests.fakes.archive import Collected
from tests.fakes.kugou import make_kugou_app, serve
from tests.fakes.rangeserver import RangeServer
from tests.test_resolver_kugou import config_for

pytestmark = pytest.mark.timeout(60)

KiB = 1024
CFG = DownloadConfig(chunk_size=64 * KiB, retry_backoff=0, timeout=10)
UA = "AudioCrawler/0.1 (+https://example.org/bot)"
PAGE = "http://site.test/song/1"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob(size: int, seed: int) -> bytes:
    """Random bytes behind an MPEG audio frame header: the downloader keeps only audio."""
    return (b"\xff\xfb\x90\x64" + random.Random(seed).randbytes(size))[:size]


def header(headers: tuple[tuple[bytes, bytes], ...], name: str) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name.lower().encode()), None)


class Clock:
    def __init__(self, at: float = 1_700_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        self.at += 1.0
        return self.at


def stack(archive: Collected | None = None, **kw: object) -> Stack:
    return build_stack(user_agent=UA, connect_timeout=10, read_timeout=10, max_redirects=5, max_connections=8,
                       dns_ttl=60, archive=archive if archive is not None else NO_ARCHIVE, **kw)  # type: ignore[arg-type]


@pytest.fixture
async def server() -> AsyncIterator[RangeServer]:
    async with RangeServer() as srv:
        yield srv


# -- the httpx client's exchanges --------------------------------------------------------------------------------

async def test_with_no_archive_the_client_talks_to_the_transport_directly() -> None:
    async with stack() as plain:
        assert isinstance(plain.client._transport, AiohttpTransport)   # nothing in between: nothing teed
    col = Collected()
    async with stack(col) as recording:
        assert isinstance(recording.client._transport, RecordingTransport)


async def test_kugou_api_calls_are_api_exchanges_of_the_page_being_resolved() -> None:
    app, kugou = make_kugou_app()
    song = kugou.add_song("周杰伦", "晴天", album="叶惠美", seconds=269, bitrate=128)
    col = Collected()
    clock = Clock()
    async with serve(app) as base, stack(col, clock=clock) as http:
        resolver = KugouResolver(config_for(base))
        ctx = ResolveContext(http=http, user_agent=UA, clock=kugou.clock, archive=col)
        url = f"{base}/song/#hash={song.hash}&album_id={song.album_id}"
        with recorded_as("api", url):      # as the worker resolves a page
            result = await resolver.resolve(url, None, ctx)
        # Outside a resolution a request of this stack is an API call of no page.
        await http.client.get(f"{base}/yy/index.php")
    [item] = result.items
    assert item.status == OK
    *resolving, outside = col.exchanges
    assert resolving and all(ex.role == "api" and ex.page == url for ex in resolving)
    assert (outside.role, outside.page) == ("api", "")
    [play] = [ex for ex in resolving if "/yy/index.php" in ex.url]
    assert play.method == "GET" and play.status == 200
    assert song.hash in play.url and item.url.split("?")[0].rsplit("/", 1)[-1] in play.body.decode()
    # The request as aiohttp sent it: Host, the resolver's identity and cookie.
    assert header(play.request_headers, "Host") == base.split("//", 1)[1]
    assert header(play.request_headers, "User-Agent") == DESKTOP_USER_AGENT
    assert "kg_mid=" in (header(play.request_headers, "Cookie") or "")
    assert header(play.response_headers, "Content-Type") is not None
    assert play.truncated == "" and play.payload_digest == "" and play.http_version == "1.1"
    assert 1_700_000_000 < play.started <= clock.at
    assert [m for m in col.metadatas] == []


async def test_a_redirect_is_two_exchanges_and_a_cut_body_is_marked_truncated(server: RangeServer) -> None:
    server.add("/robots.txt", b"User-agent: *\nDisallow: /private\n" + b"#" * 5000, content_type="text/plain")
    server.add("/old", b"", content_type="text/plain").redirect_to = server.url("/robots.txt")
    col = Collected()
    async with stack(col, role="robots", max_body=1000) as http:
        status, body = await fetch_robots(http, server.url("/old"))
    assert status == 200 and len(body) == 1001
    hop, ex = col.exchanges
    assert (hop.role, hop.url, hop.status) == ("robots", server.url("/old"), 302)
    assert header(hop.response_headers, "Location") == server.url("/robots.txt")
    assert (ex.role, ex.page, ex.url, ex.status) == ("robots", "", server.url("/robots.txt"), 200)
    assert ex.body == body and ex.truncated == "length"


async def test_a_stack_without_a_default_role_records_only_what_names_one(server: RangeServer) -> None:
    server.add("/robots.txt", b"User-agent: *\n", content_type="text/plain")
    col = Collected()
    async with stack(col, role=None) as http:
        await http.client.get(server.url("/robots.txt"))
        assert col.exchanges == []
        with recorded_as("playlist", PAGE):
            await http.client.get(server.url("/robots.txt"))
    [ex] = col.exchanges
    assert (ex.role, ex.page, ex.body) == ("playlist", PAGE, b"User-agent: *\n")


# -- downloads ---------------------------------------------------------------------------------------------------

def item_for(url: str) -> AudioItem:
    return AudioItem(url=url, page=PAGE, identity=RequestIdentity(
        user_agent="Player/1.0", cookies=(("sid", "s1"),), headers=(("Referer", PAGE),)))


async def test_a_resumed_download_records_each_ranged_exchange_then_the_stored_file(server: RangeServer,
                                                                                     tmp_path) -> None:
    data = blob(1_000_000, 1)
    res = server.add("/a.mp3", data)
    res.drops = [300_000]
    col = Collected()
    async with stack() as http:
        got = await Downloader(http, tmp_path, CFG, archive=col, clock=Clock()).fetch(item_for(server.url("/a.mp3")))
    assert got.status == OK and got.sha256 == sha(data)
    first, second = col.exchanges
    assert all(ex.role == "audio" and ex.page == PAGE and ex.url == item_for(server.url("/a.mp3")).url
               and ex.body == b"" for ex in (first, second))
    assert header(first.request_headers, "Range") is None and first.status == 200
    assert first.truncated == "disconnect"
    n = first.payload_size
    assert 0 < n < len(data) and first.payload_digest == f"sha256:{sha(data[:n])}"
    assert header(second.request_headers, "Range") == f"bytes={n}-" and second.status == 206
    assert header(second.request_headers, "If-Range") is not None
    assert second.payload_size == len(data) - n and second.payload_digest == f"sha256:{sha(data[n:])}"
    assert second.truncated == ""
    # Sent as the lean client sends them: Host first, the item's identity.
    assert first.request_headers[0] == (b"Host", server.url("/").split("//", 1)[1].rstrip("/").encode())
    assert header(first.request_headers, "User-Agent") == "Player/1.0"
    assert header(first.request_headers, "Cookie") == "sid=s1"
    assert header(first.request_headers, "Referer") == PAGE
    assert first.started < second.started
    [(target, fields, refers_to, page, role)] = col.metadatas
    assert (target, refers_to, page, role) == (got.url, "<urn:uuid:exchange-2>", PAGE, "audio")
    assert dict(fields) == {"stored-file": got.path, "sha256": sha(data), "size": str(len(data)),
                            "content-type": "audio/mpeg", "page": PAGE}


async def test_a_file_stored_from_memory_is_recorded_with_its_digest(server: RangeServer, tmp_path) -> None:
    data = blob(20_000, 2)
    server.add("/small.mp3", data)
    col = Collected()
    async with stack() as http:
        got = await Downloader(http, tmp_path, CFG, archive=col).fetch(item_for(server.url("/small.mp3")))
    assert got.status == OK
    [ex] = col.exchanges
    assert (ex.payload_digest, ex.payload_size, ex.body, ex.truncated) == (f"sha256:{sha(data)}", len(data), b"", "")
    [(_, fields, refers_to, _, _)] = col.metadatas
    assert refers_to == "<urn:uuid:exchange-1>" and dict(fields)["sha256"] == sha(data)


async def test_audio_payload_keeps_the_bytes_in_the_exchange(server: RangeServer, tmp_path) -> None:
    data = blob(300_000, 3)            # past OFF_LOOP: written from a thread
    server.add("/b.mp3", data)
    col = Collected()
    async with stack() as http:
        got = await Downloader(http, tmp_path, CFG, archive=col, audio_payload=True).fetch(
            item_for(server.url("/b.mp3")))
    assert got.status == OK
    [ex] = col.exchanges
    assert ex.body == data and ex.payload_digest == "" and ex.payload_size == -1


async def test_audio_payload_past_the_cap_is_recorded_by_its_digest(server: RangeServer, tmp_path,
                                                                     monkeypatch) -> None:
    """A download holds at most KEPT_MAX bytes for the archive: a bigger answer is recorded like a payload kept
    apart (its digest and size; the stored file holds the bytes)."""
    monkeypatch.setattr(archived, "KEPT_MAX", 50_000)
    data = blob(200_000, 5)
    server.add("/big.mp3", data)
    col = Collected()
    async with stack() as http:
        got = await Downloader(http, tmp_path, CFG, archive=col, audio_payload=True).fetch(
            item_for(server.url("/big.mp3")))
    assert got.status == OK
    [ex] = col.exchanges
    assert (ex.body, ex.payload_digest, ex.payload_size) == (b"", f"sha256:{sha(data)}", len(data))


async def test_a_304_that_confirms_the_stored_file_is_recorded_with_it(server: RangeServer, tmp_path) -> None:
    data = blob(100_000, 4)
    server.add("/c.mp3", data, etag='"v1"')
    async with stack() as http:
        await Downloader(http, tmp_path, CFG).fetch(item_for(server.url("/c.mp3")))
        col = Collected()
        again = DownloadConfig(chunk_size=64 * KiB, retry_backoff=0, timeout=10, revalidate_after=0)
        got = await Downloader(http, tmp_path, again, archive=col).fetch(item_for(server.url("/c.mp3")))
    assert got.status == OK and got.sha256 == sha(data)
    [ex] = col.exchanges
    assert ex.status == 304 and header(ex.request_headers, "If-None-Match") == '"v1"'
    assert ex.body == b"" and ex.truncated == ""
    [(_, fields, refers_to, _, _)] = col.metadatas
    assert refers_to == "<urn:uuid:exchange-1>" and dict(fields)["stored-file"] == got.path


async def test_with_no_archive_a_download_records_nothing(server: RangeServer, tmp_path) -> None:
    server.add("/d.mp3", blob(10_000, 5))
    async with stack() as http:
        downloader = Downloader(http, tmp_path, CFG)
        got = await downloader.fetch(item_for(server.url("/d.mp3")))
    assert got.status == OK
    assert downloader._archive is None and downloader.hls._archive is None


async def test_hls_records_its_playlists_segments_and_the_joined_file(server: RangeServer, tmp_path) -> None:
    stream = make_stream(segments=3, seed=6)
    for path, body in stream.files.items():
        server.add(f"/hls/{path}", body, content_type="application/vnd.apple.mpegurl" if path.endswith(".m3u8")
                   else "audio/aac")
    url = server.url(f"/hls/{stream.master}")
    col = Collected()
    item = AudioItem(url=url, page=PAGE, extra={"format": "hls"})
    async with stack(col) as http:
        got = await Downloader(http, tmp_path, CFG, archive=col).fetch(item)
    assert got.status == OK, got.reason
    roles = [(ex.role, ex.url.rsplit("/hls/", 1)[1]) for ex in col.exchanges]
    assert roles == [("playlist", stream.master), ("playlist", stream.media),
                     *[("segment", f"audio/seg{i}.aac") for i in range(3)]]
    assert all(ex.page == PAGE for ex in col.exchanges)
    master, media, *segments = col.exchanges
    assert master.body == stream.files[stream.master] and media.body == stream.files[stream.media]
    for ex, plain in zip(segments, stream.segments, strict=True):
        assert ex.body == b"" and ex.payload_digest == f"sha256:{sha(plain)}" and ex.payload_size == len(plain)
    [(target, fields, refers_to, page, role)] = col.metadatas
    assert (target, refers_to, page, role) == (url, f"<urn:uuid:exchange-{len(col.exchanges)}>", PAGE, "audio")
    assert dict(fields)["sha256"] == sha(stream.plain) == got.sha256


async def test_the_masters_robots_txt_fetch_is_a_robots_exchange(server: RangeServer, tmp_path) -> None:
    from crawler.master.config import MasterConfig
    from crawler.master.server import Master
    from testkit.cluster import write_secret

    server.add("/robots.txt", b"User-agent: *\nDisallow: /private\n", content_type="text/plain")
    origin = server.url("/").rstrip("/")
    raw = {"listen": "127.0.0.1:0", "data_dir": str(tmp_path / "m"), "nodes": ["a"], "seeds": [origin + "/"],
           "secret_file": str(write_secret(tmp_path / "s"))}
    master = Master(MasterConfig.from_mapping(raw, tmp_path), clock=Clock())
    assert master.archive is NO_ARCHIVE
    master._open_state()
    try:
        master.archive = col = Collected()
        await master._robots_one(origin)
    finally:
        master.store.close()
    [ex] = col.exchanges
    assert (ex.role, ex.page, ex.url, ex.status) == ("robots", "", origin + "/robots.txt", 200)
    assert ex.body == b"User-agent: *\nDisallow: /private\n" and ex.started > 1_700_000_000


async def test_the_worker_resolves_a_page_with_its_api_calls_in_the_pages_chain(server: RangeServer,
                                                                                tmp_path) -> None:
    from crawler.resolvers.base import Resolution, Resolver
    from crawler.worker.config import WorkerConfig
    from crawler.worker.server import Worker
    from testkit.cluster import write_secret

    server.add("/api/song", b'{"url": "x"}', content_type="application/json")

    class Asks(Resolver):
        name = "asks"

        async def resolve(self, url, page, ctx):  # type: ignore[no-untyped-def]
            await ctx.http.client.get(server.url("/api/song"))
            return Resolution()

    raw = {"master": "127.0.0.1:1", "id": "w", "data_dir": str(tmp_path),
           "secret_file": str(write_secret(tmp_path / "s"))}
    worker = Worker(WorkerConfig.build(None, raw))
    col = Collected()
    async with stack(col) as http:
        worker.ctx = ResolveContext(http=http, user_agent=UA, archive=col)
        await worker._resolve(Asks({}), PAGE, None)
        await http.client.get(server.url("/api/song"))     # after it: no page's
    [ex, after] = col.exchanges
    assert (ex.role, ex.page, ex.url, ex.body) == ("api", PAGE, server.url("/api/song"), b'{"url": "x"}')
    assert after.page == ""


async def test_an_answer_refused_past_the_cap_is_recorded_as_far_as_it_was_read(server: RangeServer) -> None:
    from crawler.http.bodies import BodyError

    server.add("/big.json", b"[" + b"1," * 50_000 + b"1]", content_type="application/json")
    col = Collected()
    async with stack(col, max_body=1000) as http:
        with pytest.raises(BodyError):
            await http.client.get(server.url("/big.json"))
    [ex] = col.exchanges
    assert ex.truncated == "length" and ex.status == 200 and len(ex.body) <= 1001


async def test_a_coded_answer_is_recorded_decoded_with_its_headers_as_received() -> None:
    import gzip

    from aiohttp import web

    plain = b'{"songs": []}' * 100

    async def coded(request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(plain), headers={"Content-Encoding": "gzip",
                                                                "Content-Type": "application/json"})

    app = web.Application()
    app.router.add_get("/api", coded)
    col = Collected()
    async with serve(app) as base, stack(col) as http:
        with recorded_as("api", PAGE):
            answer = await http.client.get(f"{base}/api")
    assert answer.content == plain
    [ex] = col.exchanges
    assert ex.body == plain and ex.decoded
    assert header(ex.response_headers, "Content-Encoding") == "gzip"
    assert header(ex.response_headers, "Content-Length") == str(len(gzip.compress(plain)))
    assert header(ex.request_headers, "Accept-Encoding") is not None


async def test_a_file_stored_from_memory_goes_to_the_writer_in_one_append(server: RangeServer, tmp_path) -> None:
    """The crawl's own writer takes the exchange and the stored file's metadata record together (one write to the
    WARC file, one to its index): the same records, in the same order, as two appends made."""
    from crawler.archive.records import parse_member, read_member
    from crawler.archive.writer import ArchiveWriter, iter_index

    data = blob(20_000, 9)
    server.add("/one.mp3", data)
    writer = ArchiveWriter(tmp_path / "archive")
    writes: list[list[str]] = []
    real_write = writer._write

    def counted(built, *rest):  # type: ignore[no-untyped-def]
        writes.append([b.kind for b in built])
        return real_write(built, *rest)

    writer._write = counted  # type: ignore[method-assign]
    async with stack() as http:
        got = await Downloader(http, tmp_path / "data", CFG, archive=writer).fetch(item_for(server.url("/one.mp3")))
    writer.close()
    assert got.status == OK
    assert writes == [["warcinfo"], ["revisit", "request", "metadata"]]
    refs = [r for r in iter_index(tmp_path / "archive") if r.kind != "warcinfo"]
    assert [r.kind for r in refs] == ["revisit", "request", "metadata"]
    revisit, request, meta = refs
    assert (revisit.sha256, request.sha256, meta.sha256) == (sha(data), "", sha(data))
    assert request.refers_to == revisit.record_id and meta.refers_to == revisit.record_id
    assert meta.target == got.url and meta.page == PAGE and meta.role == "audio"
    headers, block = parse_member(read_member(tmp_path / "archive" / meta.file, meta.offset, meta.length))
    assert dict(headers)["WARC-Refers-To"] == revisit.record_id
    assert f"stored-file: {got.path}".encode() in block and f"sha256: {sha(data)}".encode() in block
