"""Internet radio (crawler/worker/icy.py): the ICY metadata interleave taken apart however the reads split it, a
hostile station's metadata bounded, and a station recorded for a window against the loopback station
(testkit/radio.py): the file holds exactly the audio the station sent (its metadata taken out), the titles it told
with their offsets, its name; a station that hangs up is stored as far as it got, one that sends nothing fails with
a reason. The hand-offs: the downloader records a station instead of downloading it (holding its host's slot for
the window), the page fetcher reads a station's head only and reports audio at its address."""

from __future__ import annotations

import asyncio
import hashlib
import random
import time

import httpx
import pytest
import yarl

from crawler.http.getter import Stack
from crawler.http.transport import build_client, build_transport
from crawler.items import FAILED, OK, AudioItem
from crawler.web.urls import host_of
from crawler.worker import icy, recording
from crawler.worker.audiostore import AudioStore, partial_key
from crawler.worker.downloader import DownloadConfig, Downloader
from crawler.worker.fetcher import PageFetcher
from crawler.worker.transfer import LiveLease
from testkit import radio

pytestmark = pytest.mark.timeout(60)


# -- the demuxer -----------------------------------------------------------------------------------------------

def interleave(audio: bytes, metaint: int, blocks: dict[int, bytes]) -> bytes:
    """A station's bytes: ``metaint`` audio bytes, then the block for that point (an empty one if none)."""
    out = bytearray()
    for i in range(0, len(audio), metaint):
        out += audio[i:i + metaint]
        if i + metaint <= len(audio):
            out += blocks.get(i + metaint, b"\x00")
    return bytes(out)


def demux_all(data: bytes, metaint: int, cuts: list[int]) -> tuple[bytes, list[icy.Title]]:
    d = icy.Demuxer(metaint)
    audio = bytearray()
    titles: list[icy.Title] = []
    last = 0
    for cut in [*cuts, len(data)]:
        out = d.feed(data[last:cut])
        audio += out.audio
        titles += out.titles
        last = cut
    return bytes(audio), titles


AUDIO = random.Random(1).randbytes(64 * 9 + 17)
BLOCKS = {64: radio.metadata_block("First"), 192: radio.metadata_block("First"),     # repeated: no change
          256: radio.metadata_block("Second – ünïcode"), 320: b"\x00",
          448: radio.metadata_block("Third's title; with 'quotes'")}
STREAM = interleave(AUDIO, 64, BLOCKS)
EXPECTED = [icy.Title(64, "First"), icy.Title(256, "Second – ünïcode"),
            icy.Title(448, "Third's title; with 'quotes'")]


def test_the_interleave_reads_the_same_split_at_every_byte_boundary():
    for cut in range(len(STREAM) + 1):
        assert demux_all(STREAM, 64, [cut]) == (AUDIO, EXPECTED), cut


def test_the_interleave_reads_the_same_one_byte_a_read_and_in_random_reads():
    assert demux_all(STREAM, 64, list(range(1, len(STREAM)))) == (AUDIO, EXPECTED)
    for seed in range(30):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 40)))
        assert demux_all(STREAM, 64, cuts) == (AUDIO, EXPECTED), seed


def test_without_metadata_everything_is_audio():
    d = icy.Demuxer(None)
    assert d.feed(STREAM) == icy.Demuxed(STREAM, ())


@pytest.mark.parametrize("value", ["0", "1", "63", str(icy.MAX_METAINT + 1), "-5", "8192x", "99999999999", " "])
def test_an_absurd_metaint_is_refused(value):
    with pytest.raises(icy.IcyError):
        icy.metaint_of(value)


def test_a_plausible_metaint_is_taken():
    assert icy.metaint_of(" 16000 ") == 16000 and icy.metaint_of(None) is None


def test_titles_in_latin1_and_utf8_and_garbage_are_decoded_and_bounded():
    latin = b"\x01" + b"StreamTitle='Caf\xe9 del Mar';".ljust(16, b"\x00")
    assert icy.stream_title(latin[1:]) == "Café del Mar"
    assert icy.stream_title("StreamTitle='Café';".encode()) == "Café"
    # Bytes no code page defines, and control characters: replaced, never raised.
    assert icy.stream_title(b"StreamTitle='a\x81b\x07c';") == "a\ufffdb\ufffdc"
    assert icy.stream_title(b"StreamUrl='x';") is None and icy.stream_title(b"\x00" * 32) is None
    assert icy.stream_title(b"StreamTitle='';") is None
    long = b"StreamTitle='" + b"x" * 4000 + b"';"
    assert icy.stream_title(long) == "x" * icy.MAX_TITLE


def test_a_hostile_block_costs_at_most_one_block():
    # The largest block the length byte can announce, then audio: the block is held only until it ends.
    block = bytes([255]) + (b"StreamTitle='" + b"y" * 5000)[:255 * 16]
    data = b"a" * 64 + block + b"b" * 64 + b"\x00"
    d = icy.Demuxer(64)
    out = d.feed(data)
    assert out.audio == b"a" * 64 + b"b" * 64 and out.titles == ()      # no closing quote: no title
    assert len(d._meta) == 0


def test_every_title_change_is_reported_by_the_demuxer():
    blocks = {64 * (k + 1): radio.metadata_block(f"t{k}") for k in range(2000)}
    audio, titles = demux_all(interleave(b"z" * 64 * 2000, 64, blocks), 64, [])
    assert len(audio) == 64 * 2000 and titles == [icy.Title(64 * (k + 1), f"t{k}") for k in range(2000)]


# -- the recorder against the loopback station ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tracks(tmp_path_factory) -> list[radio.Track]:
    return radio.mp3_tracks(tmp_path_factory.mktemp("tracks"), {"Artist A - Song A": 11, "Artist B - Song B": 12},
                            seconds=1.5, bitrate=64)


@pytest.fixture
async def stack():
    transport = build_transport(max_connections=8, dns_ttl=60)
    client = build_client(transport, connect_timeout=5, read_timeout=5, max_redirects=3, user_agent="radio-test")
    yield Stack(transport, client)
    await client.aclose()


async def open_station(stack: Stack, url: str, read_timeout: float = 5.0):
    return await stack.get(yarl.URL(url), [icy.ASK_METADATA], timeout=(5.0, read_timeout, 5.0, None),
                           max_body=1 << 30, read_size=1 << 20)


def item_for(url: str, **kw) -> AudioItem:
    return AudioItem(url=url, page="http://site.test/radio", resolver="generic", **kw)


async def record(stack: Stack, store: AudioStore, url: str, seconds: float, *, read_timeout: float = 5.0,
                 max_size: int = 1 << 30, **kw) -> AudioItem:
    answer = await open_station(stack, url, read_timeout)
    try:
        return await icy.record_station(item_for(url, **kw), answer, store, "k",
                                        lease=LiveLease(seconds, read_timeout), max_size=max_size)
    finally:
        await answer.aclose()


def stored(store: AudioStore, done: AudioItem) -> bytes:
    assert done.path is not None
    return (store.root / done.path).read_bytes()


@pytest.mark.parametrize("icecast", [False, True], ids=["shoutcast", "icecast"])
async def test_a_station_is_recorded_for_its_window_without_its_metadata(stack, tracks, tmp_path, icecast):
    store = AudioStore(tmp_path)
    async with radio.Station(tracks, name="Loopback FM", genre="Synth", site="http://fm.test/", bitrate=64,
                             metaint=2000, icecast=icecast) as station:
        began = time.monotonic()
        done = await record(stack, store, station.url, 2.0)
        took = time.monotonic() - began
        await asyncio.sleep(0.2)
        listener = station.listeners[0]
    assert listener.metadata and b"Icy-MetaData: 1" in listener.request
    assert done.status == OK, done.reason
    assert 2.0 <= took < 4.0
    data = stored(store, done)
    # Exactly the audio the station sent, from its first byte, metadata taken out; as much as it sent meanwhile.
    assert bytes(listener.audio).startswith(data) and len(data) >= 8000 * 1.5
    assert done.sha256 == hashlib.sha256(data).hexdigest() and done.size == len(data)
    assert done.duration == pytest.approx(len(data) / 8000, abs=0.01) and 1.5 <= done.duration <= 2.6
    assert done.title == "Loopback FM" and done.path.endswith(".mp3")
    x = done.extra
    assert (x["live"], x["format"], x["icy_name"], x["icy_genre"], x["icy_url"], x["icy_br"]) == \
        (True, "icy", "Loopback FM", "Synth", "http://fm.test/", 64)
    assert abs(x["recorded_at"] - time.time()) < 10 and "ended" not in x
    # The titles as the station told them, the first at 0, the others where they came in the audio.
    told = [(off, t) for off, t in listener.titles if off <= len(data)]
    assert x["played"] == [{"offset": 0.0, "title": told[0][1]}] + [
        {"offset": round(off / 8000, 3), "title": t} for off, t in told[1:]]
    assert [p["title"] for p in x["played"]][:2] == ["Artist A - Song A", "Artist B - Song B"]
    assert not [p for p in (tmp_path / "audio").rglob("*.live*")]      # the part file went into the store


async def test_the_page_gave_the_title_it_stays_and_the_station_name_is_kept_in_extra(stack, tracks, tmp_path):
    async with radio.Station(tracks, name="Loopback FM", metaint=2000) as station:
        done = await record(stack, AudioStore(tmp_path), station.url, 0.5, title="Morning show")
    assert done.status == OK and done.title == "Morning show" and done.extra["icy_name"] == "Loopback FM"


async def test_a_station_that_hangs_up_is_stored_as_far_as_it_got(stack, tracks, tmp_path):
    store = AudioStore(tmp_path)
    async with radio.Station(tracks, metaint=2000, hang_up_after=0.6) as station:
        done = await record(stack, store, station.url, 5.0)
        sent = bytes(station.listeners[0].audio)
    assert done.status == OK, done.reason
    assert stored(store, done) == sent and len(sent) == 4800
    assert done.duration == pytest.approx(0.6) and done.extra["ended"] == "the station hung up"


async def test_a_stalled_station_is_stored_as_far_as_it_got(stack, tracks, tmp_path):
    store = AudioStore(tmp_path)

    class Stalling(radio.Station):
        async def _play(self, listener, writer):        # 0.5 s of audio, then silence on an open connection
            self.hang_up_after = 4000
            await super()._play(listener, writer)
            await self._stopping.wait()

    async with Stalling(tracks, metaint=2000) as station:
        began = time.monotonic()
        done = await record(stack, store, station.url, 10.0, read_timeout=1.0)
        took = time.monotonic() - began
    assert done.status == OK and done.size == 4000 and done.duration == pytest.approx(0.5)
    assert took < 3.0 and done.extra["ended"].startswith("ReadTimeout")


async def test_a_station_that_sends_nothing_fails_with_a_reason(stack, tracks, tmp_path):
    store = AudioStore(tmp_path)
    async with radio.Station(tracks, silent=True) as station:
        done = await record(stack, store, station.url, 1.0)
        assert done.status == FAILED and done.reason == "the station sent no audio (the window closed)"
        done = await record(stack, store, station.url, 10.0, read_timeout=0.5)
        assert done.status == FAILED and "no audio (ReadTimeout" in (done.reason or "")
    assert not any(p.is_file() for p in (tmp_path / "audio").rglob("*") if "sqlite" not in p.name)


async def test_the_recording_stops_at_max_size(stack, tracks, tmp_path):
    store = AudioStore(tmp_path)
    async with radio.Station(tracks, metaint=2000, burst=3.0) as station:
        done = await record(stack, store, station.url, 5.0, max_size=10_000)
        sent = bytes(station.listeners[0].audio)
    assert done.status == OK and done.size == 10_000 and sent.startswith(stored(store, done))
    assert done.extra["ended"] == "the recording reached 10000 bytes"


async def test_a_station_that_changes_its_title_on_every_block_is_bounded_in_the_row(stack, tmp_path):
    tracks = [radio.Track(f"title {k}", bytes([k % 256]) * 64) for k in range(recording.MAX_PLAYED + 200)]
    async with radio.Station(tracks, metaint=64, bitrate=1536, chunk_seconds=0.01) as station:
        done = await record(stack, AudioStore(tmp_path), station.url, 1.5)
        told = [t for _, t in station.listeners[0].titles]
    assert done.status == OK and done.size > 64 * (recording.MAX_PLAYED + 10)
    assert [p["title"] for p in done.extra["played"]] == told[:recording.MAX_PLAYED]


async def test_a_title_first_told_after_the_first_block_is_put_where_it_came(stack, tracks, tmp_path):
    # A station that names nothing at first (an empty StreamTitle), then the next track.
    untitled = [radio.Track("", tracks[0].audio[:8000]), radio.Track("Later", tracks[1].audio)]
    async with radio.Station(untitled, metaint=2000) as station:
        done = await record(stack, AudioStore(tmp_path), station.url, 1.5)
        told = [(off, t) for off, t in station.listeners[0].titles if t]
    assert done.status == OK and told[0] == (8000, "Later")
    assert done.extra["played"] == [{"offset": 1.0, "title": "Later"}]


async def test_a_station_with_an_absurd_metaint_is_refused(stack, tracks, tmp_path):
    async with radio.Station(tracks, metaint=8) as station:
        done = await record(stack, AudioStore(tmp_path), station.url, 1.0)
    assert done.status == FAILED and done.reason is not None and "icy-metaint 8 refused" in done.reason


async def test_without_a_bitrate_offsets_come_from_the_clock(stack, tracks, tmp_path):
    class NoBitrate(radio.Station):
        def head(self, metadata):
            return super().head(metadata).replace(b"icy-br:64\r\n", b"")

    async with NoBitrate(tracks, metaint=2000) as station:
        done = await record(stack, AudioStore(tmp_path), station.url, 2.0)
        told = station.listeners[0].titles
    assert done.status == OK and "icy_br" not in done.extra
    assert 1.5 <= done.duration <= 2.3
    change = next(p for p in done.extra["played"][1:])
    assert change["offset"] == pytest.approx(told[1][0] / 8000, abs=0.3)


# -- the hand-offs -------------------------------------------------------------------------------------------------

async def test_the_downloader_records_a_station_holding_one_host_slot_for_its_window(stack, tracks, tmp_path):
    cfg = DownloadConfig(live_record_seconds=1.5, timeout=5, max_per_host=1, retry_backoff=0)
    dl = Downloader(stack, tmp_path, cfg)
    async with radio.Station(tracks, name="Loopback FM", metaint=2000) as station:
        host = host_of(station.url)
        task = asyncio.create_task(dl.fetch(item_for(station.url)))
        for _ in range(100):            # until the station has its listener
            if station.listeners:
                break
            await asyncio.sleep(0.05)
        assert dl.hosts.holders(host) == 1 and not task.done()     # the stream: one long request to its host
        done = await task
        assert dl.hosts.holders(host) == 0 and len(dl.hosts) == 0
        # Each visit records anew: no finished record answers the next one.
        again = await dl.fetch(item_for(station.url))
        listeners = station.listeners
    assert done.status == OK and again.status == OK and len(listeners) == 2
    assert done.extra["format"] == "icy" and done.title == "Loopback FM" and done.extra["live"] is True
    assert all(b"Icy-MetaData: 1" in li.request for li in listeners)
    assert dl.stats.reused == 0 and dl.store.load_finished(partial_key(item_for(station.url))) is None
    assert station.url not in dl._by_url


async def test_the_page_fetcher_reads_only_a_stations_head(stack, tracks):
    fetcher = PageFetcher(stack)
    async with radio.Station(tracks, metaint=2000, bitrate=64) as station:
        began = time.monotonic()
        page, cut = await fetcher.fetch(station.url, max_bytes=1 << 20)
        took = time.monotonic() - began
        await asyncio.sleep(0.3)
        assert station.listeners[0].closed
    assert took < 1.0 and page.body == b"" and not cut
    assert page.status == 200 and page.content_type == "audio/mpeg" and page.headers["icy-name"] == "Loopback FM"


async def test_a_station_found_as_a_page_is_reported_as_audio_at_its_address(stack, tracks):
    from crawler.resolvers.generic import GenericResolver

    fetcher = PageFetcher(stack)
    async with radio.Station(tracks, metaint=2000) as station:
        page, _ = await fetcher.fetch(station.url, max_bytes=1 << 20)
    items = GenericResolver({}).resolve_page(page).items
    assert [i.url for i in items] == [station.url]


def test_is_stream_reads_the_status_line_or_a_stations_headers():
    assert icy.is_stream({"icy": True}, {})
    assert icy.is_stream({}, httpx.Headers({"icy-metaint": "8192"}))
    assert icy.is_stream({}, httpx.Headers({"ICY-NAME": "x"}))
    assert not icy.is_stream({}, httpx.Headers({"content-type": "audio/mpeg"}))
    assert not icy.is_stream({}, {"content-type": "audio/x-scpls"})


def test_the_station_headers_are_bounded():
    station = icy.Station.of(httpx.Headers({"icy-name": "n" * 5000, "icy-br": "128, 128", "icy-genre": "a\x01b"}))
    assert station.name == "n" * icy.MAX_HEADER and station.bitrate == 128 and station.genre == "a\ufffdb"
    assert icy.Station.of(httpx.Headers({"icy-br": "99999999"})).bitrate is None



@pytest.mark.parametrize("kind, body, content_type", [
    ("pls", "[playlist]\nNumberOfEntries=2\nFile1={a}\nTitle1=Loopback FM\nLength1=-1\nFile2={b}\nVersion=2\n",
     "audio/x-scpls"),
    ("m3u", "#EXTM3U\n#EXTINF:-1,Loopback FM\n{a}\n{b}\n", "audio/x-mpegurl"),
])
async def test_a_playlist_of_stations_leads_to_an_item_at_each_station(stack, tracks, kind, body, content_type):
    """A station listed in a .pls or .m3u is not named as audio: the entry is a link whose fetch (its head only)
    finds the station, and the station's answer becomes an item at its address."""
    from crawler.resolvers.generic import GenericResolver
    from crawler.web.page import FetchedPage

    resolver = GenericResolver({})
    fetcher = PageFetcher(stack)
    async with radio.Station(tracks, name="A") as a, radio.Station(tracks, name="B", icecast=True) as b:
        text = body.format(a=a.url, b=b.url).encode()
        listing = FetchedPage(url=f"http://site.test/radio.{kind}", final_url=f"http://site.test/radio.{kind}",
                              status=200, content_type=content_type, headers={"content-type": content_type},
                              body=text, referrer="http://site.test/")
        links = resolver.resolve_page(listing).links
        assert links == [a.url, b.url]
        items = []
        for link in links:
            page, _ = await fetcher.fetch(link, max_bytes=1 << 20, referrer=listing.url)
            items += resolver.resolve_page(page).items
    assert [i.url for i in items] == [a.url, b.url]
