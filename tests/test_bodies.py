"""Bodies bounded after decoding: bombs, stacks of encodings and unknown codings, through the real transport."""

import asyncio
import gzip
import time
import zlib

import httpx
import pytest
from aiohttp import web

from crawler.http.bodies import ACCEPT_ENCODING, BodyError, BoundedDecoder, content_coding
from crawler.http.getter import Stack
from crawler.http.transport import build_client, build_transport
from crawler.worker.fetcher import FetchError, PageFetcher
from tests.fakes import hostile

MiB = 1024 * 1024


@pytest.mark.parametrize(("header", "coding"), [
    (None, ""), ("", ""), ("identity", ""), ("gzip", "gzip"), (" GZip ", "gzip"), ("x-gzip", "x-gzip"),
    ("deflate", "deflate"), ("identity, gzip", "gzip"),
])
def test_one_coding_is_named(header, coding):
    assert content_coding(header) == coding


@pytest.mark.parametrize("header", ["gzip, gzip", "gzip,deflate", "deflate, gzip, gzip", "br, gzip", "zstd, zstd",
                                    "compress", "sdch"])
def test_stacks_and_unknown_codings_are_refused(header):
    with pytest.raises(BodyError):
        content_coding(header)


def feed_all(decoder: BoundedDecoder, data: bytes, chunk: int = 16 * 1024) -> bytes:
    out = []
    for i in range(0, len(data), chunk):
        out.append(decoder.feed(data[i:i + chunk]))
        if decoder.full:
            break
    return b"".join(out)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
def test_a_bomb_is_cut_at_the_limit_without_expanding(coding):
    if coding == "gzip":
        wire = hostile.gzip_zeros(256 * MiB)
    else:
        plain = b"\0" * (256 * MiB)
        c = zlib.compressobj(wbits=zlib.MAX_WBITS if coding == "deflate" else -zlib.MAX_WBITS)
        wire = c.compress(plain) + c.flush()
        coding = "deflate"
    assert len(wire) < 300 * 1024
    started = time.process_time()
    decoder = BoundedDecoder(coding, MiB, cut=True)
    out = feed_all(decoder, wire)
    assert len(out) == MiB + 1 and decoder.full          # one byte past the limit says "there was more"
    assert time.process_time() - started < 1.0             # 256 MiB were never inflated
    with pytest.raises(BodyError, match="larger than"):
        feed_all(BoundedDecoder(coding, MiB, cut=False), wire)


def _brotli_zeros(size: int) -> bytes:
    import brotli
    c = brotli.Compressor(quality=1)
    return b"".join(c.process(b"\0" * MiB) for _ in range(size // MiB)) + c.finish()


def _zstd_zeros(size: int, window_log: int | None = None) -> bytes:
    from crawler.http.bodies import zstd
    options = {zstd.CompressionParameter.window_log: window_log} if window_log else None
    c = zstd.ZstdCompressor(options=options)
    return b"".join(c.compress(b"\0" * MiB) for _ in range(size // MiB)) + c.flush()


@pytest.mark.parametrize("coding", ["br", "zstd"])
def test_brotli_and_zstd_bombs_are_bounded_the_same_way(coding):
    assert coding in ACCEPT_ENCODING                 # asked for, because decoded within bounds
    wire = _brotli_zeros(128 * MiB) if coding == "br" else _zstd_zeros(128 * MiB)
    assert len(wire) < 200 * 1024
    started = time.process_time()
    decoder = BoundedDecoder(content_coding(coding), MiB, cut=True)
    assert len(feed_all(decoder, wire)) == MiB + 1 and decoder.full
    assert time.process_time() - started < 1.0
    with pytest.raises(BodyError, match="larger than"):
        feed_all(BoundedDecoder(coding, MiB, cut=False), wire)
    small = b"hello " * 1000
    import brotli

    from crawler.http.bodies import zstd
    wire = brotli.compress(small) if coding == "br" else zstd.compress(small)
    assert feed_all(BoundedDecoder(coding, 10_000, cut=False), wire, chunk=7) == small


def test_a_zstd_window_past_8_mib_is_refused():
    wire = _zstd_zeros(32 * MiB, window_log=27)      # asks the decoder for a 128 MiB window
    with pytest.raises(BodyError, match="undecodable zstd"):
        feed_all(BoundedDecoder("zstd", 64 * MiB, cut=False), wire)


def test_identity_and_small_bodies_pass_whole():
    assert feed_all(BoundedDecoder("", 10, cut=False), b"0123456789") == b"0123456789"
    assert feed_all(BoundedDecoder("gzip", 100, cut=False), gzip.compress(b"hello")) == b"hello"
    with pytest.raises(BodyError):
        feed_all(BoundedDecoder("", 9, cut=False), b"0123456789")
    with pytest.raises(BodyError, match="undecodable"):
        BoundedDecoder("gzip", 100, cut=False).feed(b"not gzip at all")


@pytest.fixture
async def encoded_server():
    bomb = hostile.stacked_bomb()            # two gzip layers: 590 bytes, 256 MiB per layer decoded

    async def stacked(request):
        return web.Response(body=bomb, headers={"Content-Type": "text/html", "Content-Encoding": "gzip, gzip"})

    async def two_lines(request):
        resp = web.Response(body=bomb, headers={"Content-Type": "application/json"})
        resp.headers.add("Content-Encoding", "gzip")
        resp.headers.add("Content-Encoding", "gzip")
        return resp

    async def json_bomb(request):
        return web.Response(body=hostile.gzip_zeros(256 * MiB),
                            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    async def trickle(request):
        resp = web.StreamResponse(headers={"Content-Type": "text/html"})
        await resp.prepare(request)
        for _ in range(600):
            await resp.write(b"<")
            await asyncio.sleep(0.1)      # the behaviour under test: a byte in time for the read timeout, 60 s in all
        return resp

    app = web.Application()
    for path, h in (("/stacked", stacked), ("/two-lines", two_lines), ("/json-bomb", json_bomb),
                    ("/trickle", trickle)):
        app.router.add_get(path, h)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_stacked_encodings_are_a_permanent_page_error(encoded_server):
    transport = build_transport(max_connections=4, dns_ttl=60, max_body=MiB)
    client = build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=2)
    try:
        for path in ("/stacked", "/two-lines"):
            with pytest.raises(FetchError, match="stacked") as e:
                await PageFetcher(Stack(transport, client)).fetch(encoded_server + path, max_bytes=MiB)
            assert not e.value.transient
        # An API call through the same client: refused, not expanded.
        with pytest.raises(httpx.DecodingError, match="stacked"):
            await client.get(encoded_server + "/two-lines")
        with pytest.raises(httpx.DecodingError, match="larger than"):
            await client.get(encoded_server + "/json-bomb")
    finally:
        await client.aclose()


async def test_a_trickling_server_is_cut_off_by_the_total_deadline(encoded_server):
    transport = build_transport(max_connections=4, dns_ttl=60, max_body=MiB, total_timeout=1.0)
    client = build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=2)
    try:
        started = time.monotonic()
        with pytest.raises(FetchError) as e:
            await PageFetcher(Stack(transport, client)).fetch(encoded_server + "/trickle", max_bytes=MiB)
        assert e.value.transient and time.monotonic() - started < 10   # the read timeout alone never fires
        with pytest.raises(httpx.TimeoutException):
            await client.get(encoded_server + "/trickle")
    finally:
        await client.aclose()


async def test_the_kugou_api_client_is_bounded_through_the_workers_transport():
    """Kugou's play-data API answered with a stacked bomb, a single-layer bomb and a trickle: each song fails
    with a reason, in bounded time and memory, instead of expanding gigabytes on the event loop."""
    from crawler.items import FAILED
    from crawler.resolvers.base import ResolveContext
    from crawler.resolvers.kugou import KugouResolver, ListedSong

    stacked, single = hostile.stacked_bomb(), hostile.gzip_zeros(256 * MiB)

    async def play(request):
        kind = request.query["hash"]
        if kind == "STACKED":
            return web.Response(body=stacked, headers={"Content-Type": "application/json",
                                                       "Content-Encoding": "gzip, gzip"})
        if kind == "SINGLE":
            return web.Response(body=single, headers={"Content-Type": "application/json",
                                                      "Content-Encoding": "gzip"})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for _ in range(600):
            await resp.write(b" ")
            await asyncio.sleep(0.1)      # the behaviour under test: a byte in time for the read timeout, 60 s in all
        return resp

    app = web.Application()
    app.router.add_get("/yy/index.php", play)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    transport = build_transport(max_connections=4, dns_ttl=60, max_body=MiB, total_timeout=1.0)
    client = build_client(transport, user_agent="t", connect_timeout=5, read_timeout=5, max_redirects=2)
    resolver = KugouResolver({"api_base": base, "mobile_api_base": base, "www_hosts": ["127.0.0.1"],
                              "mobile_hosts": ["127.0.0.1"], "referer": base + "/", "retry_delay": 0})
    ctx = ResolveContext(http=Stack(transport, client), user_agent="t")
    try:
        for song, words in (("STACKED", "BodyError"), ("SINGLE", "BodyError"), ("TRICKLE", "Timeout")):
            started = time.monotonic()
            item = await resolver.resolve_song(ListedSong(song), base + "/page", ctx)
            assert item.status == FAILED and words in item.reason, (song, item.reason)
            assert time.monotonic() - started < 10
    finally:
        await client.aclose()
        await runner.cleanup()
