"""HLS audio: playlist parsing, the rendition chosen, AES-128 decryption, and downloads that resume at a segment."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from crawler.http.getter import Stack
from crawler.http.targets import TargetPolicy
from crawler.http.transport import build_transport
from crawler.items import FAILED, OK, AudioItem, RequestIdentity
from crawler.worker.audiostore import partial_key
from crawler.worker.downloader import DownloadConfig, Downloader
from crawler.worker.hls import (
    MAX_DURATION,
    PROGRESS_EVERY,
    SEGMENT_ALLOWANCE,
    HlsDownloader,
    HlsError,
    MasterPlaylist,
    MediaPlaylist,
    check_length,
    choose_audio,
    decrypt,
    parse,
    segment_iv,
)
from testkit.hls import encrypt, make_stream
from tests.fakes.rangeserver import RangeServer

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parent.parent

CFG = DownloadConfig(retry_backoff=0, timeout=10)
KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
MPEGURL = "application/vnd.apple.mpegurl"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def server():
    async with RangeServer() as srv:
        yield srv


@pytest.fixture
async def client():
    transport = build_transport(max_connections=8, dns_ttl=60)
    async with httpx.AsyncClient(transport=transport) as c:
        yield Stack(transport, c)


def serve_stream(srv: RangeServer, stream, folder: str = "/hls") -> str:
    for path, data in stream.files.items():
        srv.add(f"{folder}/{path}", data, content_type=MPEGURL if path.endswith(".m3u8") else "audio/aac")
    return srv.url(f"{folder}/{stream.master}")


def hls_item(url: str, **kw) -> AudioItem:
    return AudioItem(url=url, page="http://site.test/song", resolver="browser", extra={"format": "hls"}, **kw)


def segment_requests(srv: RangeServer) -> list[str]:
    return [r.path for r in srv.log if r.path.endswith(".aac") and r.status in (200, 206)]


# -- parsing ---------------------------------------------------------------------------------------------


def test_media_playlist_segments_keys_and_sequence_numbers():
    text = ("#EXTM3U\n#EXT-X-TARGETDURATION:4\n#EXT-X-MEDIA-SEQUENCE:10\n"
            '#EXT-X-KEY:METHOD=AES-128,URI="k1.bin"\n#EXTINF:4.0,\na.ts\n'
            '#EXT-X-KEY:METHOD=AES-128,URI="https://keys.test/k2",IV=0x0000000000000000000000000000000A\n'
            "#EXTINF:3.5,title\nhttps://cdn.test/b.ts?token=1\n#EXT-X-KEY:METHOD=NONE\n#EXTINF:1,\nc.ts\n"
            "#EXT-X-ENDLIST\n")
    pl = parse(text, "https://site.test/s/index.m3u8")
    assert isinstance(pl, MediaPlaylist) and pl.ended and pl.media_sequence == 10
    a, b, c = pl.segments
    assert (a.uri, a.sequence, a.key.uri, a.key.iv) == ("https://site.test/s/a.ts", 10, "https://site.test/s/k1.bin",
                                                        None)
    assert (b.uri, b.duration, b.sequence) == ("https://cdn.test/b.ts?token=1", 3.5, 11)
    assert b.key.iv == (10).to_bytes(16, "big") and segment_iv(b) == (10).to_bytes(16, "big")
    assert segment_iv(a) == (10).to_bytes(16, "big") and c.key is None
    assert pl.duration == 8.5


def test_byteranges_and_init_section():
    text = ('#EXTM3U\n#EXT-X-MAP:URI="init.mp4",BYTERANGE="100@0"\n#EXTINF:2,\n#EXT-X-BYTERANGE:500@100\n'
            "all.mp4\n#EXTINF:2,\n#EXT-X-BYTERANGE:300\nall.mp4\n#EXT-X-ENDLIST\n")
    pl = parse(text, "http://x.test/p.m3u8")
    assert isinstance(pl, MediaPlaylist)
    first, second = pl.segments
    assert first.init.uri == "http://x.test/init.mp4" and (first.init.byterange.length, first.init.byterange.offset) \
        == (100, 0)
    assert (first.byterange.length, first.byterange.offset) == (500, 100)
    assert (second.byterange.length, second.byterange.offset) == (300, 600)    # continues the previous range


def test_without_endlist_the_playlist_is_live():
    pl = parse("#EXTM3U\n#EXT-X-TARGETDURATION:6\n#EXTINF:6,\nlive1.ts\n", "http://x.test/live.m3u8")
    assert isinstance(pl, MediaPlaylist) and not pl.ended


def test_not_a_playlist_is_refused():
    with pytest.raises(HlsError):
        parse("<html>not found</html>", "http://x.test/a.m3u8")


def test_the_best_audio_only_variant_is_chosen_over_video():
    text = ("#EXTM3U\n"
            '#EXT-X-STREAM-INF:BANDWIDTH=5000000,CODECS="avc1.640028,mp4a.40.2",RESOLUTION=1920x1080\nhd.m3u8\n'
            '#EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS="mp4a.40.5"\nlow.m3u8\n'
            '#EXT-X-STREAM-INF:BANDWIDTH=256000,CODECS="mp4a.40.2"\nhigh.m3u8\n'
            "#EXT-X-STREAM-INF:BANDWIDTH=900000,RESOLUTION=640x360\nsd.m3u8\n")
    pl = parse(text, "http://x.test/master.m3u8")
    assert isinstance(pl, MasterPlaylist) and len(pl.variants) == 4
    assert choose_audio(pl) == "http://x.test/high.m3u8"


def test_an_audio_rendition_group_is_used_when_every_variant_has_video():
    text = ("#EXTM3U\n"
            '#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="lo",NAME="Low",URI="a/lo.m3u8"\n'
            '#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="hi",NAME="English",LANGUAGE="en",URI="a/hi-en.m3u8"\n'
            '#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID="hi",NAME="Main",DEFAULT=YES,URI="a/hi-main.m3u8"\n'
            '#EXT-X-STREAM-INF:BANDWIDTH=800000,CODECS="avc1.4d401e,mp4a.40.2",AUDIO="lo"\nv/lo.m3u8\n'
            '#EXT-X-STREAM-INF:BANDWIDTH=4000000,CODECS="avc1.640028,mp4a.40.2",AUDIO="hi"\nv/hi.m3u8\n')
    pl = parse(text, "http://x.test/master.m3u8")
    assert isinstance(pl, MasterPlaylist)
    assert choose_audio(pl) == "http://x.test/a/hi-main.m3u8"


def test_sound_only_inside_video_is_not_taken_for_audio():
    pl = parse('#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1,CODECS="avc1.4d401e,mp4a.40.2"\nv.m3u8\n',
               "http://x.test/m.m3u8")
    assert isinstance(pl, MasterPlaylist)
    with pytest.raises(HlsError, match="no audio-only"):
        choose_audio(pl)


def test_decrypt_reverses_the_packager_and_refuses_the_wrong_key():
    data = b"abc" * 1000 + b"tail"
    iv = (42).to_bytes(16, "big")
    assert decrypt(encrypt(data, KEY, iv), KEY, iv) == data
    assert decrypt(encrypt(b"", KEY, iv), KEY, iv) == b""
    with pytest.raises(HlsError):
        decrypt(encrypt(data, KEY, iv), bytes(16), iv)
    with pytest.raises(HlsError, match="whole number of blocks"):
        decrypt(b"x" * 17, KEY, iv)


# -- downloads -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("explicit_iv", [False, True])
async def test_encrypted_stream_is_one_decrypted_file(server, client, tmp_path, explicit_iv):
    stream = make_stream(segments=5, key=KEY, explicit_iv=explicit_iv, seed=3)
    url = serve_stream(server, stream)
    item = hls_item(url, identity=RequestIdentity(user_agent="Player/1.0", cookies=(("sid", "s1"),),
                                                  headers=(("Referer", "http://site.test/song"),)))

    got = await Downloader(client, tmp_path, CFG).fetch(item)

    assert (got.status, got.reason) == (OK, None), got.reason
    assert got.sha256 == sha(stream.plain) and got.size == len(stream.plain)
    assert (tmp_path / got.path).read_bytes() == stream.plain
    assert got.path.endswith(".aac") and got.content_type == "audio/aac"
    assert got.extra["format"] == "hls" and got.extra["segments"] == 5 and got.duration == 20.0
    # Segments in order, each once, the video variant never touched, all with the item's identity.
    assert segment_requests(server) == [f"/hls/audio/seg{i}.aac" for i in range(5)]
    assert not any("video" in r.path for r in server.log)
    assert all(r.headers.get("user-agent") == "Player/1.0" and r.headers.get("cookie") == "sid=s1"
               and r.headers.get("referer") == "http://site.test/song" for r in server.log)
    assert sum(1 for r in server.log if r.path == "/hls/key.bin") == 1
    assert list((tmp_path / "audio" / "partial").iterdir()) == []


async def test_a_killed_download_resumes_at_the_next_segment(server, client, tmp_path):
    stream = make_stream(segments=6, key=KEY, seed=4)
    url = serve_stream(server, stream)
    server.resource("/hls/audio/seg3.aac").pause_at = 10      # hold the 4th segment until the download is killed
    item = hls_item(url)
    key = partial_key(item)

    task = asyncio.create_task(Downloader(client, tmp_path, CFG).fetch(item))
    await server.wait_until(lambda: any(r.path == "/hls/audio/seg3.aac" for r in server.log))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.resource("/hls/audio/seg3.aac").pause_at = None
    server.release()
    progress = json.loads((tmp_path / "audio" / "partial" / f"{key}.hls.json").read_text())
    assert progress["segments"] == 3
    # A crash between a write and its progress record leaves extra bytes: they are cut off, not kept.
    with open(tmp_path / "audio" / "partial" / f"{key}.part", "ab") as fh:
        fh.write(b"half a segment")
    server.log.clear()

    got = await Downloader(client, tmp_path, CFG).fetch(item)

    assert got.status == OK and got.sha256 == sha(stream.plain), got.reason
    assert segment_requests(server) == [f"/hls/audio/seg{i}.aac" for i in range(3, 6)]


async def test_a_changed_playlist_starts_over(server, client, tmp_path):
    stream = make_stream(segments=4, seed=5)
    url = serve_stream(server, stream)
    item = hls_item(url)
    key = partial_key(item)
    partial = tmp_path / "audio" / "partial"
    partial.mkdir(parents=True)
    (partial / f"{key}.part").write_bytes(b"x" * 5000)
    (partial / f"{key}.hls.json").write_text(json.dumps({
        "version": 1, "playlist": url, "fingerprint": "other segments", "segments": 2, "size": 5000}))

    got = await Downloader(client, tmp_path, CFG).fetch(item)

    assert got.status == OK and got.sha256 == sha(stream.plain)
    assert segment_requests(server) == [f"/hls/audio/seg{i}.aac" for i in range(4)]


async def test_a_live_playlist_without_a_recorder_is_reported_not_downloaded(server, client, tmp_path):
    # The downloader records live playlists (tests/test_livehls.py); an HlsDownloader without a recorder only
    # says what it found.
    stream = make_stream(segments=3, ended=False, seed=6)
    url = serve_stream(server, stream)
    dl = Downloader(client, tmp_path, CFG)
    dl.hls.live = None

    got = await dl.fetch(hls_item(url))

    assert got.status == OK and got.sha256 is None and got.extra["live"] is True
    assert segment_requests(server) == []


async def test_fragmented_mp4_is_written_after_its_init_section(server, client, tmp_path):
    init = b"\x00\x00\x00\x18ftypiso6\x00\x00\x00\x00iso6dash" + b"moov-bytes"
    fragments = [b"\x00\x00\x00\x10moof" + bytes([i]) * 200 for i in range(3)]
    lines = ["#EXTM3U", "#EXT-X-TARGETDURATION:2", '#EXT-X-MAP:URI="init.mp4"']
    for i, frag in enumerate(fragments):
        server.add(f"/f/frag{i}.m4s", frag, content_type="audio/mp4")
        lines += ["#EXTINF:2.0,", f"frag{i}.m4s"]
    server.add("/f/init.mp4", init, content_type="audio/mp4")
    server.add("/f/a.m3u8", ("\n".join([*lines, "#EXT-X-ENDLIST"]) + "\n").encode(), content_type=MPEGURL)

    got = await Downloader(client, tmp_path, CFG).fetch(hls_item(server.url("/f/a.m3u8")))

    assert got.status == OK, got.reason
    assert (tmp_path / got.path).read_bytes() == init + b"".join(fragments)
    assert got.path.endswith(".m4a") and got.content_type == "audio/mp4"


@pytest.mark.parametrize("case", ["short key", "too large", "segment gone", "sample-aes"])
async def test_what_cannot_be_downloaded_fails_with_a_reason(server, client, tmp_path, case):
    stream = make_stream(segments=3, key=KEY, seed=7)
    if case == "short key":
        stream.files["key.bin"] = b"short"
    if case == "sample-aes":
        media = stream.files[stream.media].replace(b"METHOD=AES-128", b"METHOD=SAMPLE-AES")
        stream.files[stream.media] = media
    url = serve_stream(server, stream)
    if case == "segment gone":
        server.resource("/hls/audio/seg1.aac").fail_status = [404]
    cfg = DownloadConfig(retry_backoff=0, timeout=10, max_size=len(stream.plain) - 1 if case == "too large"
                         else 2 ** 31)

    got = await Downloader(client, tmp_path, cfg).fetch(hls_item(url))

    assert got.status == FAILED and got.reason.startswith("hls: ") and got.sha256 is None
    expected = {"short key": "not 16", "too large": "too large", "segment gone": "http 404",
                "sample-aes": "SAMPLE-AES"}[case]
    assert expected in got.reason


async def test_a_finished_stream_is_not_fetched_again(server, client, tmp_path):
    stream = make_stream(segments=2, seed=8)
    url = serve_stream(server, stream)
    first = await Downloader(client, tmp_path, CFG).fetch(hls_item(url))
    server.log.clear()
    again = await Downloader(client, tmp_path, DownloadConfig(retry_backoff=0, revalidate_after=0)).fetch(
        hls_item(url))
    assert again.status == OK and again.sha256 == first.sha256 == sha(stream.plain)
    assert segment_requests(server) == []


_CHILD = r"""
import asyncio, sys
from pathlib import Path
import httpx
from crawler.http.getter import ClientGetter
from crawler.items import AudioItem
from crawler.worker.downloader import DownloadConfig, Downloader

async def main():
    async with httpx.AsyncClient() as client:
        item = AudioItem(url=sys.argv[1], page="http://site.test/song", resolver="browser", extra={"format": "hls"})
        downloader = Downloader(ClientGetter(client), Path(sys.argv[2]), DownloadConfig(retry_backoff=0))
        downloader.hls.progress_every = 0     # a record after every segment: the kill lands after the 4th
        await downloader.fetch(item)

asyncio.run(main())
"""


async def test_a_process_killed_mid_stream_resumes_after_restart(server, client, tmp_path):
    stream = make_stream(segments=6, key=KEY, seed=9)
    url = serve_stream(server, stream)
    server.resource("/hls/audio/seg4.aac").pause_at = 100     # held until the process is gone
    key = partial_key(hls_item(url))
    progress_file = tmp_path / "audio" / "partial" / f"{key}.hls.json"

    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, url, str(tmp_path), cwd=REPO,
                                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        await server.wait_until(lambda: any(r.path == "/hls/audio/seg4.aac" for r in server.log), timeout=30)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
    server.resource("/hls/audio/seg4.aac").pause_at = None
    server.release()
    assert json.loads(progress_file.read_text())["segments"] == 4
    server.log.clear()

    got = await Downloader(client, tmp_path, CFG).fetch(hls_item(url))

    assert got.status == OK and got.sha256 == sha(stream.plain), got.reason
    assert segment_requests(server) == ["/hls/audio/seg4.aac", "/hls/audio/seg5.aac"]
    assert not progress_file.exists()


# -- hostile playlists: bounded in time, in requests, and refused quietly --------------------------------


def media_playlist(durations: list[str], name: str = "seg{}.aac") -> bytes:
    lines = ["#EXTM3U", "#EXT-X-TARGETDURATION:10"]
    for i, d in enumerate(durations):
        lines += [f"#EXTINF:{d},", name.format(i)]
    return ("\n".join([*lines, "#EXT-X-ENDLIST"]) + "\n").encode()


def test_a_playlists_length_is_tied_to_its_declared_duration():
    def media(durations: list[str]) -> MediaPlaylist:
        pl = parse(media_playlist(durations).decode(), "http://x.test/a.m3u8")
        assert isinstance(pl, MediaPlaylist)
        return pl

    check_length(media(["1.0"] * 7200))                     # two hours in 1 s segments
    check_length(media(["6"] * (int(MAX_DURATION) // 6)))    # the longest allowed, in ordinary segments
    check_length(media(["0"] * SEGMENT_ALLOWANCE))           # a few segments that declare nothing
    with pytest.raises(HlsError, match="segments for"):
        check_length(media(["0.01"] * 1000))
    with pytest.raises(HlsError, match="more than 86400 s"):
        check_length(media(["6"] * (int(MAX_DURATION) // 6 + 1)))
    for bad in ("inf", "1e400"):
        with pytest.raises(HlsError, match="more than"):
            check_length(media(["4", bad]))


@pytest.mark.parametrize("case", ["50,000 short segments", "a week of audio", "infinite"])
async def test_a_playlist_longer_than_its_duration_allows_is_refused_before_any_segment(server, client,
                                                                                          tmp_path, case):
    durations = {"50,000 short segments": ["0.2"] * 50_000, "a week of audio": ["30"] * 20_160,
                 "infinite": ["4", "inf", "4"]}[case]
    server.add("/long/a.m3u8", media_playlist(durations), content_type=MPEGURL)   # segments: 404

    got = await Downloader(client, tmp_path, CFG).fetch(hls_item(server.url("/long/a.m3u8")))

    assert got.status == FAILED and got.reason.startswith("hls: "), got.reason
    assert ("segments for" if case.startswith("50") else "more than 86400 s") in got.reason
    assert [r.path for r in server.log] == ["/long/a.m3u8"]


async def test_a_slow_stream_ends_at_the_whole_download_deadline(server, client, tmp_path, fake_clock):
    stream = make_stream(segments=40, seed=11)       # 8 KiB segments, each sent in about 0.1 s
    url = serve_stream(server, stream)
    for i in range(40):
        server.resource(f"/hls/audio/seg{i}.aac").rate = 80_000
    cfg = DownloadConfig(retry_backoff=0, timeout=10, deadline_base=0.5, min_rate=10_000_000)
    item = hls_item(url)

    fetch = asyncio.ensure_future(Downloader(client, tmp_path, cfg, deadline_clock=fake_clock).fetch(item))
    await server.wait_until(lambda: len(segment_requests(server)) >= 3)    # two segments written
    fake_clock.advance(1.0)                          # past the deadline: 0.5 s and next to nothing for the size
    got = await asyncio.wait_for(fetch, 10)

    assert got.status == FAILED and got.reason.startswith("download too slow"), got.reason
    assert len(segment_requests(server)) < 20
    # The segments written before the deadline are recorded: a later crawl carries on from there.
    progress = json.loads((tmp_path / "audio" / "partial" / f"{partial_key(item)}.hls.json").read_text())
    assert progress["segments"] >= 1 and f"{progress['size']} bytes" in got.reason
    server.log.clear()
    for i in range(40):
        server.resource(f"/hls/audio/seg{i}.aac").rate = None
    again = await Downloader(client, tmp_path, CFG).fetch(item)
    assert again.status == OK and again.sha256 == sha(stream.plain), again.reason
    assert segment_requests(server)[0] == f"/hls/audio/seg{progress['segments']}.aac"


class Ticks:
    """A monotonic clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_progress_is_saved_every_few_seconds_not_per_segment(server, client, tmp_path):
    stream = make_stream(segments=12, seed=12)
    url = serve_stream(server, stream)
    server.resource("/hls/audio/seg8.aac").pause_at = 10      # hold the 9th segment
    item = hls_item(url)
    progress_file = tmp_path / "audio" / "partial" / f"{partial_key(item)}.hls.json"
    downloader = Downloader(client, tmp_path, CFG)
    # One second passes per segment: a record every PROGRESS_EVERY (5) segments, not after each.
    downloader.hls = HlsDownloader(client.client, downloader.store, CFG, monotonic=Ticks())
    assert downloader.hls.progress_every == PROGRESS_EVERY == 5.0

    task = asyncio.create_task(downloader.fetch(item))
    await server.wait_until(lambda: any(r.path == "/hls/audio/seg8.aac" for r in server.log))
    assert json.loads(progress_file.read_text())["segments"] == 5
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Stopped: what is on disk is recorded.
    assert json.loads(progress_file.read_text())["segments"] == 8
    server.resource("/hls/audio/seg8.aac").pause_at = None
    server.release()
    server.log.clear()

    got = await Downloader(client, tmp_path, CFG).fetch(item)
    assert got.status == OK and got.sha256 == sha(stream.plain), got.reason
    assert segment_requests(server) == [f"/hls/audio/seg{i}.aac" for i in range(8, 12)]


@pytest.mark.parametrize("what", ["key", "segment"])
async def test_a_key_or_segment_at_a_refused_address_fails_the_item_with_one_log_line(server, tmp_path, caplog,
                                                                                      what):
    # The site's own address is allowed; 127.0.0.2, the same server, stands for an intranet service.
    policy = TargetPolicy([("127.0.0.1", server.port)])
    inside = server.url("/hls/inside", host="127.0.0.2")
    if what == "key":
        stream = make_stream(segments=3, key=KEY, seed=13, key_uri=f"{inside}/key.bin")
    else:
        stream = make_stream(segments=3, seed=13)
        stream.files[stream.media] = stream.files[stream.media].replace(b"seg1.aac", f"{inside}/seg1.aac".encode())
    url = serve_stream(server, stream)
    caplog.set_level(logging.DEBUG)

    transport = build_transport(max_connections=8, dns_ttl=60, policy=policy)
    async with httpx.AsyncClient(transport=transport) as c:
        got = await Downloader(Stack(transport, c), tmp_path, CFG).fetch(hls_item(url))

    assert got.status == FAILED and got.reason.startswith("hls: ") and "outside the public internet" in got.reason
    assert not [r for r in server.log if r.path.startswith("/hls/inside")]
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info]
