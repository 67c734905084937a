"""Live HLS recorded for a window: the recorder against a loopback stream whose window moves with a clock
(testkit/livehls.py), the decisions of following a playlist (Follow), and the downloader's rules for every live
recording (no reuse, the deadline covering the window, one host slot for the window only, one recording shared).

Most tests drive the stream and the recorder by one fake clock that moves only when the recorder sleeps, so a
60-second window takes milliseconds and every reload sees exactly the stream the RFC's timing gives it."""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from crawler.http.getter import Stack
from crawler.http.transport import build_transport
from crawler.items import FAILED, OK, AudioItem
from crawler.web.urls import host_of
from crawler.worker.audiostore import Finished, partial_key
from crawler.worker.downloader import DownloadConfig, Downloader
from crawler.worker.hls import MediaPlaylist, Segment
from crawler.worker.livehls import LIVE_EDGE, MAX_RELOAD, MIN_RELOAD, STALL_RELOADS, Follow, LiveHls
from crawler.items import RECORDED_AT
from crawler.worker.recording import is_live
from crawler.worker.transfer import Deadline, LiveLease
from testkit import music
from testkit.livehls import Cut, LiveHls as LiveStream, cut
from tests.fakes.clock import FakeClock, until
from tests.fakes.hostile import mp3

pytestmark = pytest.mark.timeout(120)

KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
WINDOW = 20.0
CFG = DownloadConfig(retry_backoff=0, timeout=10, live_record_seconds=WINDOW)


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    return music.write_wav(tmp_path_factory.mktemp("live") / "work.wav", music.work(41, 24.0))


@pytest.fixture(scope="module")
def ts(wav) -> Cut:
    return cut(wav, wav.parent / "ts", seconds=2.0)


@pytest.fixture(scope="module")
def fmp4(wav) -> Cut:
    return cut(wav, wav.parent / "fmp4", seconds=2.0, fmt="fmp4")


@pytest.fixture
async def client():
    transport = build_transport(max_connections=8, dns_ttl=60)
    async with httpx.AsyncClient(transport=transport) as c:
        yield Stack(transport, c)


class Time:
    """One fake monotonic clock for the stream and the recorder: it moves only when the recorder sleeps."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.clock.time()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)
        await asyncio.sleep(0)


def downloader(client, tmp_path: Path, t: Time | None = None, **cfg) -> Downloader:
    dl = Downloader(client, tmp_path, replace(CFG, **cfg))
    if t is not None:
        dl.hls.live = LiveHls(monotonic=t, sleep=t.sleep)
    return dl


def live_item(url: str, page: str = "http://site.test/radio", **extra) -> AudioItem:
    return AudioItem(url=url, page=page, resolver="generic", extra={"format": "hls", **extra})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_recorded(got: AudioItem, stream: LiveStream, tmp_path: Path, *, init: bytes = b"",
                    each: float | None = None) -> list[int]:
    """The recording holds exactly the served segments' plain bytes, in order, none twice, and their duration
    (``each`` a segment, when the test's own playlist says so); returns them."""
    assert got.status == OK, got.reason
    served = stream.served
    assert served == sorted(set(served)), served
    data = (tmp_path / got.path).read_bytes()
    assert data == init + b"".join(stream.plain(s) for s in served)
    assert got.sha256 == sha(data) and got.size == len(data)
    durations = [each if each is not None else stream.duration(s) for s in served]
    assert (got.duration or 0.0) == pytest.approx(sum(durations), abs=1e-3)
    assert got.extra["live"] is True and got.extra["format"] == "hls"
    missed = served[-1] - served[0] + 1 - len(served)
    assert got.extra["gaps"] >= missed and got.extra["segments"] == len(served)
    return served


# -- the recorder against a moving stream -----------------------------------------------------------------
@pytest.mark.parametrize("fmt, key, master", [("ts", None, False), ("ts", KEY, True), ("fmp4", KEY, True)])
async def test_a_window_of_the_stream_is_recorded_in_order_from_the_live_edge(client, tmp_path, ts, fmp4,
                                                                               fmt, key, master):
    t = Time()
    source = ts if fmt == "ts" else fmp4
    wall = time.time()
    async with LiveStream(source, window=5, clock=t, key=key, master=master) as stream:
        t.clock.advance(30.0)     # on air for a while: the playlist lists segments 10 or so to 14
        edge = stream.listed(stream.elapsed())
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    served = assert_recorded(got, stream, tmp_path, init=source.init or b"")
    assert served[0] == edge[-LIVE_EDGE]                     # the third-last segment when it began
    assert got.extra["gaps"] == 0 and got.extra["stopped"] == "full"
    # The window of audio, give or take the last segment; reloads one target duration apart while the stream
    # moves (a reload that found nothing waits half of one).
    assert WINDOW <= got.duration < WINDOW + max(source.durations)
    assert all(s in (stream.target, stream.target / 2) or s < stream.target for s in t.slept)
    assert got.extra[RECORDED_AT] == pytest.approx(wall, abs=30)
    assert got.path.endswith(".m4a" if fmt == "fmp4" else ".ts")
    assert not any(tmp_path.joinpath("audio", "partial").glob("*.live*"))


async def test_segments_that_left_the_playlist_between_reloads_are_counted_as_gaps(client, tmp_path, ts):
    t = Time()
    # The playlist lists one segment of about 2 s but says to reload every 5 s: most leave before they are seen.
    async with LiveStream(ts, window=1, clock=t, target=5) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    served = assert_recorded(got, stream, tmp_path)
    missed = served[-1] - served[0] + 1 - len(served)
    assert missed > 0 and got.extra["gaps"] == missed


async def test_a_playlist_that_stops_moving_is_stored_as_far_as_it_got(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, window=3, clock=t, frozen_at=5.0) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))
        frozen_for = stream.elapsed() - 5.0

    served = assert_recorded(got, stream, tmp_path)
    assert served == list(range(0, stream.available(5.0)))
    assert got.extra["stopped"] == "stalled" and got.duration < WINDOW
    # It waited a few target durations for a change, not the whole window.
    assert STALL_RELOADS * stream.target - stream.target <= frozen_for <= STALL_RELOADS * stream.target + 1


async def test_endlist_mid_window_ends_the_recording_with_the_last_segments(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, window=3, clock=t, end_at=7.0) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    served = assert_recorded(got, stream, tmp_path)
    assert served == list(range(0, stream.available(7.0)))
    assert got.extra["stopped"] == "ended" and got.duration < WINDOW


async def test_the_window_closes_on_time_when_the_stream_is_slower_than_real_time(client, tmp_path, ts):
    t = Time()
    # A segment of about 2 s appears only every 5 s of the playlist's own time: the audio never fills the window.
    async with LiveStream(ts, window=3, clock=t, pace=0.4) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))
        elapsed = stream.elapsed()

    assert got.status == OK and got.extra["stopped"] == "window"
    assert elapsed == pytest.approx(WINDOW, abs=1e-6)


# -- hostile playlists ------------------------------------------------------------------------------------
def playlist(first: int, count: int, *, target: str = "2", extinf: str = "2.0", ended: bool = False) -> str:
    lines = ["#EXTM3U", f"#EXT-X-TARGETDURATION:{target}", f"#EXT-X-MEDIA-SEQUENCE:{first}"]
    for seq in range(first, first + count):
        lines += [f"#EXTINF:{extinf},", f"seg{seq}.ts"]
    return "\n".join(lines + (["#EXT-X-ENDLIST"] if ended else [])) + "\n"


async def test_a_playlist_that_never_moves_costs_a_few_reloads(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t, playlist=lambda _: playlist(100, 3)) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    assert assert_recorded(got, stream, tmp_path, each=2.0) == [100, 101, 102]
    assert got.extra["stopped"] == "stalled"
    # The first read, one reload a target duration later, then one every half target duration until stalled.
    assert stream.playlist_requests <= 2 + 2 * STALL_RELOADS


async def test_a_flood_of_segments_per_reload_takes_the_newest_and_counts_the_rest(client, tmp_path, ts):
    t = Time()
    per_reload = 20_000

    def flood(elapsed: float) -> str:
        return playlist(per_reload * int(elapsed), per_reload, extinf="0.6")

    started = time.monotonic()
    async with LiveStream(ts, clock=t, playlist=flood) as stream:
        got = await downloader(client, tmp_path, t, live_record_seconds=8.0).fetch(live_item(stream.stream))

    served = assert_recorded(got, stream, tmp_path, each=0.6)
    assert len(served) <= 8.0 / 0.6 + 1 and got.extra["gaps"] > per_reload
    assert time.monotonic() - started < 30


async def test_a_reload_of_a_million_segments_ends_the_recording_with_what_it_has(client, tmp_path, ts):
    t = Time()
    million = playlist(1_000, 1_000_000)      # 22 MB: past what a playlist may be

    async with LiveStream(ts, clock=t, playlist=lambda e: playlist(100, 3) if e == 0 else million) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    assert assert_recorded(got, stream, tmp_path, each=2.0) == [100, 101, 102]
    assert got.extra["stopped"].startswith("error:") and "too large" in got.extra["stopped"]
    assert stream.playlist_requests == 2


async def test_a_sequence_that_goes_backwards_brings_nothing_twice(client, tmp_path, ts):
    t = Time()

    def backwards(elapsed: float) -> str:
        return playlist(100, 3) if elapsed == 0 else playlist(max(0, 90 - int(elapsed)), 5)

    async with LiveStream(ts, clock=t, playlist=backwards) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    assert assert_recorded(got, stream, tmp_path, each=2.0) == [100, 101, 102]
    assert got.extra["stopped"] == "stalled"


@pytest.mark.parametrize("target, extinf, reload", [
    ("0", "2.0", 2.0),                      # none given: the last segment's duration
    ("0", "0", MIN_RELOAD),
    ("1000000000", "2.0", MAX_RELOAD),
    ("nan", "0.2", MIN_RELOAD),
])
async def test_a_target_duration_of_nothing_or_forever_is_clamped(client, tmp_path, ts, target, extinf, reload):
    t = Time()
    text = lambda e: playlist(int(e // 2), 3, target=target, extinf=extinf)   # noqa: E731
    async with LiveStream(ts, clock=t, playlist=text) as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))
        elapsed = stream.elapsed()

    assert_recorded(got, stream, tmp_path, each=float(extinf))
    assert elapsed <= WINDOW
    assert t.slept and max(t.slept) <= reload
    assert stream.playlist_requests <= 2 + WINDOW / reload * 2


async def test_endless_durations_count_at_most_the_longest_reload(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t, playlist=lambda e: playlist(0, 3, extinf="1e308")) as stream:
        got = await downloader(client, tmp_path, t, live_record_seconds=60).fetch(live_item(stream.stream))

    assert assert_recorded(got, stream, tmp_path, each=MAX_RELOAD) == [0, 1]
    assert got.duration == 2 * MAX_RELOAD and math.isfinite(got.duration)


async def test_a_stream_whose_segments_are_all_gone_records_nothing_and_fails(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t, playlist=lambda e: playlist(int(e // 2), 3).replace("seg", "gone")) \
            as stream:
        got = await downloader(client, tmp_path, t).fetch(live_item(stream.stream))

    assert got.status == FAILED and "nothing recorded" in got.reason and got.extra["gaps"] > 0
    assert not any(tmp_path.joinpath("audio", "partial").glob("*.live*"))


# -- the decisions, with no I/O ---------------------------------------------------------------------------
def media(first: int, count: int, *, target: float = 2.0, duration: float = 2.0, ended: bool = False):
    segments = tuple(Segment(f"http://x.test/s{first + i}.ts", duration, first + i) for i in range(count))
    return MediaPlaylist("http://x.test/live.m3u8", segments, ended, first, target)


def test_follow_starts_three_back_then_takes_each_new_segment_once():
    f = Follow(seconds=60, started=0.0)
    assert [s.sequence for s in f.reload(media(10, 6), 0.0)] == [13, 14, 15]
    assert [s.sequence for s in f.reload(media(11, 6), 2.0)] == [16]
    assert f.reload(media(11, 6), 4.0) == [] and not f.fresh
    assert f.next_reload() == 4.0 + f.target / 2
    assert [s.sequence for s in f.reload(media(14, 6), 5.0)] == [17, 18, 19] and f.gaps == 0


def test_follow_counts_what_left_between_reloads_and_skips_a_flood():
    f = Follow(seconds=60, started=0.0)
    f.reload(media(0, 3), 0.0)
    assert [s.sequence for s in f.reload(media(10, 3), 2.0)] == [10, 11, 12] and f.gaps == 7
    flood = f.reload(media(13, 1000), 4.0)          # 2 s explain at most 4 new segments, plus 3
    assert [s.sequence for s in flood] == [1010, 1011, 1012] and f.gaps == 7 + 997


def test_follow_stalls_after_a_few_target_durations_and_clamps_the_target():
    f = Follow(seconds=60, started=0.0)
    f.reload(media(0, 3, target=1e9), 0.0)
    assert f.target == MAX_RELOAD
    f.reload(media(0, 3, target=0.0, duration=0.0), 1.0)
    assert f.target == MIN_RELOAD and not f.fresh
    assert not f.stalled(STALL_RELOADS * MIN_RELOAD - 0.1) and f.stalled(STALL_RELOADS * MIN_RELOAD)


def test_follow_is_full_at_the_window_or_at_more_segments_than_it_explains():
    f = Follow(seconds=4, started=0.0)
    for s in f.reload(media(0, 3), 0.0)[:2]:
        f.took(s)
    assert f.full()
    g = Follow(seconds=1, started=0.0)
    for i in range(g.max_segments):
        g.took(Segment("s", 0.0, i))
    assert g.full()


async def test_a_live_deadline_covers_the_window_past_its_base():
    clock = FakeClock()
    cfg = DownloadConfig(deadline_base=5, live_record_seconds=60, timeout=3)
    deadline = Deadline(clock.time(), cfg)
    lease = LiveLease(cfg.live_record_seconds, cfg.timeout, deadline)
    assert deadline.at == clock.time() + 5
    lease.opened()
    assert deadline.at == clock.time() + 5 + 60 + 3
    deadline.stretch(None, 10)    # bytes never pull it back
    assert deadline.at == clock.time() + 68


# -- the downloader's rules for every live recording -------------------------------------------------------
async def test_each_visit_records_anew_and_leaves_no_record_to_reuse(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t) as stream:
        dl = downloader(client, tmp_path, t)
        item = live_item(stream.stream)
        first = await dl.fetch(item)
        seen = len(stream.served)
        t.clock.advance(60)
        second = await dl.fetch(item)
        assert len(stream.served) > seen
        assert dl.store.load_finished(partial_key(item)) is None and item.url not in dl._by_url
        # A record of a finished download of the key (as a file once stored there would leave) does not answer
        # for an item that says it is live.
        dl.store.save_finished(partial_key(item), Finished(url=item.url, sha256=second.sha256, size=second.size,
                                                           path=second.path, verified_at=time.time()))
        seen = len(stream.served)
        t.clock.advance(60)
        third = await dl.fetch(second)
        assert is_live(second) and len(stream.served) > seen

    assert first.status == second.status == third.status == OK
    assert len({first.sha256, second.sha256, third.sha256}) == 3
    assert dl.stats.reused == 0


async def test_a_recording_holds_one_host_slot_for_its_window_only(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t, pages={"/song.mp3": (mp3(1), "audio/mpeg")}) as stream:
        dl = downloader(client, tmp_path, t, max_per_host=1)
        host = host_of(stream.stream)
        held: list[int] = []
        song_waited: list[bool] = []
        sleep = t.sleep

        async def watching(seconds: float) -> None:
            await go.wait()
            held.append(dl.hosts.holders(host))
            song_waited.append(not song.done())
            await sleep(seconds)

        go = asyncio.Event()
        dl.hls.live = LiveHls(monotonic=t, sleep=watching)
        commit = dl.store.commit
        at_commit: list[bool] = []

        def committing(*args, **kw):
            # In the store's thread: the song, waiting for the host's one slot, gets it while the recording is
            # still to be stored (if the recording held on to it, the song would never come).
            deadline = time.monotonic() + 10
            while "/song.mp3" not in stream.requests and time.monotonic() < deadline:
                time.sleep(0.01)
            at_commit.append("/song.mp3" in stream.requests)
            return commit(*args, **kw)

        dl.store.commit = committing    # type: ignore[method-assign]
        recording = asyncio.create_task(dl.fetch(live_item(stream.stream)))
        await until(lambda: dl.hosts.holders(host) == 1)
        song = asyncio.create_task(dl.fetch(AudioItem(url=f"{stream.url}/song.mp3", page="http://site.test/p")))
        await asyncio.sleep(0.2)
        assert not song.done()
        go.set()
        got, other = await asyncio.gather(recording, song)

    assert got.status == OK and other.status == OK, other.reason
    assert held and set(held) == {1} and all(song_waited)      # one slot, the song waiting for it throughout
    assert at_commit == [True]                                  # given back before the recording was stored
    assert dl.hosts.holders(host) == 0


async def test_the_deadline_covers_the_window_in_real_time(client, tmp_path, wav):
    source = cut(wav, tmp_path / "cut1", seconds=1.0)
    async with LiveStream(source, window=3) as stream:
        # Reaching the stream may take half a second; the recording runs two seconds past its three in hand.
        dl = Downloader(client, tmp_path, replace(CFG, deadline_base=0.5, timeout=2, live_record_seconds=5.0))
        started = time.monotonic()
        got = await dl.fetch(live_item(stream.stream))
        took = time.monotonic() - started

    assert got.status == OK, got.reason
    assert 5.0 <= got.duration < 6.1 and 1.5 <= took < 0.5 + 5.0 + 2
    assert_recorded(got, stream, tmp_path)


async def test_two_pages_listing_one_stream_at_once_share_one_recording(client, tmp_path, ts):
    t = Time()
    async with LiveStream(ts, clock=t) as stream:
        dl = downloader(client, tmp_path, t)
        a, b = await asyncio.gather(dl.fetch(live_item(stream.stream, page="http://a.test/")),
                                    dl.fetch(live_item(stream.stream, page="http://b.test/", live=True)))

    assert_recorded(a, stream, tmp_path)
    assert b.page == "http://b.test/" and b.status == OK
    assert (b.sha256, b.size, b.path, b.duration) == (a.sha256, a.size, a.path, a.duration)
    assert {k: b.extra[k] for k in ("live", "format", RECORDED_AT, "gaps")} == \
        {k: a.extra[k] for k in ("live", "format", RECORDED_AT, "gaps")}
    assert dl.stats.shared == 1
