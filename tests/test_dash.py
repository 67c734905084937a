"""DASH audio: MPD parsing (ffmpeg's and hand-written ones), the representation chosen, downloads joined and
resumed at a segment, encrypted presentations refused with a reason, hostile manifests bounded, and a live
presentation recorded for its window."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
from pathlib import Path

import httpx
import pytest

from crawler.http.getter import Stack
from crawler.http.transport import build_transport
from crawler.items import FAILED, OK, UNAVAILABLE, AudioItem
from crawler.worker import dash
from crawler.worker.audiostore import partial_key
from crawler.worker.dash import MAX_ELEMENTS, DashDownloader, DashError, parse, static_plan
from crawler.worker.downloader import DownloadConfig, Downloader
from crawler.worker.segments import MAX_SEGMENTS, StreamError
from testkit import dash as tdash
from tests.fakes.rangeserver import RangeServer

pytestmark = pytest.mark.timeout(90)

CFG = DownloadConfig(retry_backoff=0, timeout=10)
MPD_TYPE = "application/dash+xml"
SITE = "http://site.test/dash/manifest.mpd"


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


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Nine seconds of stereo tones: short segments, quick to make."""
    path = tmp_path_factory.mktemp("src") / "tones.wav"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=440:d=9", "-f", "lavfi", "-i",
                    "sine=f=660:d=9", "-filter_complex", "amerge", "-ac", "2", str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def presentations(source, tmp_path_factory) -> dict[str, tdash.Presentation]:
    base = tmp_path_factory.mktemp("dash")
    made = {kind: tdash.make(source, base / kind, kind=kind, seconds=2.0) for kind in tdash.KINDS}
    made["protected"] = tdash.make(source, base / "protected", kind="number", protected=True)
    return made


def serve(srv: RangeServer, p: tdash.Presentation, folder: str) -> str:
    for f in p.root.iterdir():
        srv.add(f"/{folder}/{f.name}", f.read_bytes(), content_type=MPD_TYPE if f.suffix == ".mpd" else "audio/mp4")
    return srv.url(f"/{folder}/{tdash.MPD}")


def item(url: str, **kw) -> AudioItem:
    return AudioItem(url=url, page="http://site.test/song", resolver="generic", **kw)


def media_requests(srv: RangeServer) -> list[str]:
    return [r.path for r in srv.log if not r.path.endswith(".mpd") and r.status in (200, 206)]


def probe_duration(path: Path) -> float:
    """Seconds of audio ffprobe reads in the file, packet by packet (a joined WebM names no duration)."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "a:0", "-show_entries",
                          "packet=pts_time,duration_time", "-of", "csv=p=0", str(path)],
                         capture_output=True, text=True, check=True).stdout
    last = [line for line in out.splitlines() if line.strip()][-1].split(",")
    return float(last[0]) + float(last[1])


def mpd(body: str, *, root: str = 'type="static" mediaPresentationDuration="PT8S"', head: str = "") -> str:
    return (f'<?xml version="1.0"?>{head}<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" {root}>{body}</MPD>')


def names(plan: dash.Plan) -> list[str]:
    return [s.media.url + (f"@{s.media.byterange.offset}+{s.media.byterange.length}" if s.media.byterange else "")
            for s in plan.segments]


# -- parsing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", tdash.KINDS)
def test_ffmpeg_presentations_name_the_segments_the_packager_wrote(presentations, kind):
    p = presentations[kind]
    plan = static_plan(parse(p.mpd.read_text(), f"http://x.test/{kind}/manifest.mpd"))
    if kind == "list":
        whole = f"http://x.test/list/{p.files[0].name}"
        assert names(plan) == [f"{whole}@{a}+{b - a + 1}" for a, b in p.ranges[1:]]
        assert plan.segments[0].init == dash.Piece(whole, dash.ByteRange(p.ranges[0][1] + 1, 0))
    else:
        assert names(plan) == [f"http://x.test/{kind}/{f.name}" for f in p.files[1:]]
        assert plan.segments[0].init.url == f"http://x.test/{kind}/{p.files[0].name}"
    assert plan.duration == 9.0


def test_templates_fill_identifiers_widths_and_dollars():
    body = ('<Period><AdaptationSet contentType="audio"><Representation id="a1" bandwidth="128000" codecs="mp4a.40.2">'
            '<SegmentTemplate timescale="10" duration="20" startNumber="7" presentationTimeOffset="100" '
            'initialization="$RepresentationID$/init-$Bandwidth$.mp4" '
            'media="$RepresentationID$/$Number%04d$-$Time%08d$-$$.m4s"/></Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body, root='type="static" mediaPresentationDuration="PT7S"'), SITE))
    assert names(plan) == [f"http://site.test/dash/a1/{n:04d}-{t:08d}-$.m4s"
                           for n, t in [(7, 100), (8, 120), (9, 140), (10, 160)]]     # 7 s in 2 s segments
    assert plan.segments[0].init.url == "http://site.test/dash/a1/init-128000.mp4"
    assert [s.duration for s in plan.segments] == [2.0] * 4 and plan.duration == 7.0


def test_a_timeline_by_time_with_a_repeat_to_the_periods_end():
    body = ('<Period duration="PT10S"><AdaptationSet mimeType="audio/mp4"><Representation id="0" bandwidth="1">'
            '<SegmentTemplate timescale="1000" presentationTimeOffset="5000" media="s-$Time$.m4s" '
            'initialization="i.mp4"><SegmentTimeline><S t="5000" d="3000" r="1"/><S d="1000" r="-1"/>'
            '</SegmentTimeline></SegmentTemplate></Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body, root='type="static"'), SITE))
    # 2 x 3 s, then 1 s repeated to the period's end at pto + 10 s.
    times = [5000, 8000, 11000, 12000, 13000, 14000]
    assert names(plan) == [f"http://site.test/dash/s-{t}.m4s" for t in times]
    assert plan.duration == 10.0


def test_a_repeat_to_the_next_entry():
    body = ('<Period duration="PT9S"><AdaptationSet contentType="audio"><Representation id="0" bandwidth="1">'
            '<SegmentTemplate timescale="1" media="$Number$.m4s" startNumber="0"><SegmentTimeline>'
            '<S t="0" d="2" r="-1"/><S t="6" d="3"/></SegmentTimeline></SegmentTemplate>'
            '</Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body, root='type="static"'), SITE))
    assert [(s.number, s.time, s.duration) for s in plan.segments] == [(0, 0, 2.0), (1, 2, 2.0), (2, 4, 2.0),
                                                                       (3, 6, 3.0)]


def test_base_urls_are_resolved_level_by_level():
    body = ('<BaseURL>http://cdn.test/root/</BaseURL><Period><BaseURL>p1/</BaseURL>'
            '<AdaptationSet contentType="audio"><BaseURL>audio/</BaseURL>'
            '<Representation id="r" bandwidth="1"><BaseURL>hi/</BaseURL>'
            '<SegmentTemplate duration="4" media="$Number$.m4s" initialization="../init.mp4"/>'
            '</Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body), SITE))
    assert names(plan) == ["http://cdn.test/root/p1/audio/hi/1.m4s", "http://cdn.test/root/p1/audio/hi/2.m4s"]
    assert plan.segments[0].init.url == "http://cdn.test/root/p1/audio/init.mp4"


def test_template_attributes_are_inherited_from_the_adaptation_set():
    body = ('<Period><AdaptationSet contentType="audio"><SegmentTemplate timescale="1000" duration="4000" '
            'media="$RepresentationID$-$Number$.m4s" initialization="$RepresentationID$.mp4"/>'
            '<Representation id="lo" bandwidth="32000"/><Representation id="hi" bandwidth="128000">'
            '<SegmentTemplate startNumber="0"/></Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body), SITE))
    assert names(plan) == ["http://site.test/dash/hi-0.m4s", "http://site.test/dash/hi-1.m4s"]


def test_a_segment_list_with_an_initialization_and_media_ranges():
    body = ('<Period><AdaptationSet contentType="audio"><Representation id="0" bandwidth="1">'
            '<BaseURL>all.mp4</BaseURL><SegmentList timescale="1" duration="4">'
            '<Initialization sourceURL="head.mp4" range="0-99"/>'
            '<SegmentURL mediaRange="100-599"/><SegmentURL media="b.m4s"/></SegmentList>'
            '</Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body), SITE))
    assert names(plan) == ["http://site.test/dash/all.mp4@100+500", "http://site.test/dash/b.m4s"]
    assert plan.segments[0].init == dash.Piece("http://site.test/dash/head.mp4", dash.ByteRange(100, 0))


def test_a_single_file_representation_is_its_base_url():
    body = ('<Period><AdaptationSet contentType="audio"><Representation id="0" bandwidth="1" mimeType="audio/mp4">'
            '<BaseURL>song.mp4</BaseURL><SegmentBase indexRange="800-900"><Initialization range="0-799"/>'
            '</SegmentBase></Representation></AdaptationSet></Period>')
    plan = static_plan(parse(mpd(body), SITE))
    assert names(plan) == ["http://site.test/dash/song.mp4"] and plan.segments[0].init is None
    assert plan.duration == 8.0


def test_the_best_audio_is_chosen_over_video_and_protected_ones():
    body = ('<Period><AdaptationSet contentType="video"><Representation id="v" bandwidth="5000000" '
            'codecs="avc1.4d401f"><BaseURL>v.mp4</BaseURL></Representation></AdaptationSet>'
            '<AdaptationSet mimeType="audio/mp4"><ContentProtection schemeIdUri="urn:mpeg:dash:mp4protection:2011" '
            'value="cenc"/><Representation id="drm" bandwidth="320000"><BaseURL>drm.mp4</BaseURL></Representation>'
            '</AdaptationSet><AdaptationSet><Representation id="lo" bandwidth="64000" codecs="opus">'
            '<BaseURL>lo.webm</BaseURL></Representation><Representation id="hi" bandwidth="128000" '
            'codecs="mp4a.40.2"><BaseURL>hi.mp4</BaseURL></Representation></AdaptationSet></Period>')
    assert names(static_plan(parse(mpd(body), SITE))) == ["http://site.test/dash/hi.mp4"]


def test_sound_only_inside_video_and_only_encrypted_audio_are_not_downloaded():
    muxed = ('<Period><AdaptationSet mimeType="video/mp4"><Representation id="m" bandwidth="1" '
             'codecs="avc1.64001f,mp4a.40.2"><BaseURL>m.mp4</BaseURL></Representation></AdaptationSet></Period>')
    with pytest.raises(DashError, match="only inside video"):
        static_plan(parse(mpd(muxed), SITE))
    drm = ('<Period><AdaptationSet contentType="audio"><Representation id="a" bandwidth="1">'
           '<ContentProtection schemeIdUri="urn:uuid:edef8ba9-79d6-4ace-a3c8-27dcd51d21ed"/>'
           '<BaseURL>a.mp4</BaseURL></Representation></AdaptationSet></Period>')
    with pytest.raises(dash.Encrypted, match=r"encrypted \(cenc\)"):
        static_plan(parse(mpd(drm), SITE))


# -- hostile manifests -------------------------------------------------------------------------------------

LAUGHS = ('<!DOCTYPE MPD [<!ENTITY a "hahahahahaha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
          '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>')


@pytest.mark.parametrize("case", ["billion laughs", "external entity", "too many elements", "too large", "not xml",
                                  "no MPD", "endless repeat", "too many for its length", "a week long",
                                  "unknown length", "zero timescale", "wide number"])
def test_hostile_manifests_are_refused(case):
    rep = '<Period><AdaptationSet contentType="audio"><Representation id="a" bandwidth="1">{}</Representation>' \
          '</AdaptationSet></Period>'
    text = {
        "billion laughs": mpd("<Period><BaseURL>&c;</BaseURL></Period>", head=LAUGHS),
        "external entity": mpd("<Period><BaseURL>&x;</BaseURL></Period>",
                               head='<!DOCTYPE MPD [<!ENTITY x SYSTEM "file:///etc/passwd">]>'),
        "too many elements": mpd("<Period>" + "<X/>" * (MAX_ELEMENTS + 1) + "</Period>"),
        "too large": mpd("<Period>" + " " * dash.MAX_MPD_BYTES + "</Period>"),
        "not xml": "<MPD><Period>",
        "no MPD": '<?xml version="1.0"?><html/>',
        "endless repeat": mpd(rep.format('<SegmentTemplate media="$Number$" timescale="1"><SegmentTimeline>'
                                         '<S t="0" d="1" r="100000000"/></SegmentTimeline></SegmentTemplate>'),
                              root='type="static"'),
        "too many for its length": mpd(rep.format('<SegmentTemplate media="$Number$" timescale="1000" '
                                                  'duration="1"/>'), root='type="static" '
                                                                          'mediaPresentationDuration="PT30S"'),
        "a week long": mpd(rep.format('<SegmentTemplate media="$Number$" duration="6"/>'),
                           root='type="static" mediaPresentationDuration="P7D"'),
        "unknown length": mpd(rep.format('<SegmentTemplate media="$Number$" duration="6"/>'), root='type="static"'),
        "zero timescale": mpd(rep.format('<SegmentTemplate media="$Number$" duration="6" timescale="0"/>')),
        "wide number": mpd(rep.format('<SegmentTemplate media="$Number%0999d$" duration="4"/>')),
    }[case]
    with pytest.raises(StreamError) as err:
        static_plan(parse(text, SITE))
    expected = {"billion laughs": "DOCTYPE", "external entity": "DOCTYPE", "too many elements": "elements",
                "too large": "larger than", "not xml": "not XML", "no MPD": "no MPD",
                "endless repeat": f"more than {MAX_SEGMENTS}", "too many for its length": "segments for",
                "a week long": "more than 86400", "unknown length": "not known", "zero timescale": "timescale",
                "wide number": "width"}[case]
    assert expected in str(err.value)


# -- downloads ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", tdash.KINDS)
async def test_a_presentation_is_one_joined_file_players_open(server, client, tmp_path, presentations, kind):
    p = presentations[kind]
    url = serve(server, p, kind)

    got = await Downloader(client, tmp_path, CFG).fetch(item(url))

    assert (got.status, got.reason) == (OK, None)
    assert got.sha256 == p.sha256() and got.size == len(p.joined())
    path = tmp_path / got.path
    assert path.read_bytes() == p.joined()
    if kind == "webm":
        assert path.suffix == ".webm" and got.content_type == "audio/webm"
    else:
        assert path.suffix == ".m4a" and got.content_type == "audio/mp4"
    assert got.extra["format"] == "dash" and got.extra["segments"] == 5 and got.duration == 9.0
    assert 8.0 < probe_duration(path) < 10.0
    assert server.log[0].path == f"/{kind}/manifest.mpd"
    assert list((tmp_path / "audio" / "partial").iterdir()) == []


async def test_a_killed_download_resumes_at_the_next_segment(server, client, tmp_path, presentations):
    p = presentations["number"]
    url = serve(server, p, "n")
    server.resource("/n/chunk-stream0-00004.m4s").pause_at = 10      # held until the download is killed
    it = item(url)
    downloader = Downloader(client, tmp_path, CFG)
    downloader.dash.progress_every = 0

    task = asyncio.create_task(downloader.fetch(it))
    await server.wait_until(lambda: any(r.path.endswith("00004.m4s") for r in server.log))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.resource("/n/chunk-stream0-00004.m4s").pause_at = None
    server.release()
    partial = tmp_path / "audio" / "partial"
    assert json.loads((partial / f"{partial_key(it)}.dash.json").read_text())["segments"] == 3
    with open(partial / f"{partial_key(it)}.part", "ab") as fh:    # bytes past the record are not trusted
        fh.write(b"half a segment")
    server.log.clear()

    got = await Downloader(client, tmp_path, CFG).fetch(it)

    assert got.status == OK and got.sha256 == p.sha256(), got.reason
    assert media_requests(server) == [f"/n/chunk-stream0-0000{i}.m4s" for i in (4, 5)]


async def test_an_encrypted_presentation_is_recorded_with_a_reason(server, client, tmp_path, presentations):
    url = serve(server, presentations["protected"], "drm")

    got = await Downloader(client, tmp_path, CFG).fetch(item(url))

    assert (got.status, got.reason) == (UNAVAILABLE, "dash: encrypted (cenc)")
    assert got.sha256 is None and got.extra["format"] == "dash"
    assert [r.path for r in server.log] == ["/drm/manifest.mpd"]


async def test_a_finished_presentation_is_not_fetched_again(server, client, tmp_path, presentations):
    url = serve(server, presentations["timeline"], "t")
    first = await Downloader(client, tmp_path, CFG).fetch(item(url))
    server.log.clear()
    again = await Downloader(client, tmp_path, DownloadConfig(retry_backoff=0, revalidate_after=0)).fetch(item(url))
    assert again.status == OK and again.sha256 == first.sha256 and media_requests(server) == []


async def test_what_cannot_be_downloaded_fails_with_a_reason(server, client, tmp_path, presentations):
    url = serve(server, presentations["number"], "g")
    server.resource("/g/chunk-stream0-00002.m4s").fail_status = [404]
    got = await Downloader(client, tmp_path, CFG).fetch(item(url))
    assert got.status == FAILED and got.reason.startswith("dash: ") and "http 404" in got.reason
    server.add("/bad/manifest.mpd", LAUGHS.encode() + b"<MPD/>", content_type=MPD_TYPE)
    got = await Downloader(client, tmp_path, CFG).fetch(item(server.url("/bad/manifest.mpd")))
    assert got.status == FAILED and "DOCTYPE" in got.reason


def test_dash_items_go_to_dash_and_playlists_to_hls(tmp_path):
    async def check() -> None:
        async with httpx.AsyncClient() as c:
            d = Downloader(Stack(build_transport(max_connections=1, dns_ttl=1), c), tmp_path, CFG)
            for url, extra, module in [("http://a.test/x/manifest.mpd", {}, d.dash),
                                       ("http://a.test/x/stream", {"format": "dash"}, d.dash),
                                       ("http://a.test/x/index.m3u8", {}, d.hls),
                                       ("http://a.test/x/stream", {"format": "hls"}, d.hls)]:
                it = item(url, extra=extra)
                assert module.claims(it) and [m.claims(it) for m in (d.dash, d.hls)].count(True) == 1
    asyncio.run(check())


# -- live ----------------------------------------------------------------------------------------------------


class Clock:
    """Wall-clock and monotonic time at once, moved by the recorder's own waits: a window without sleeping."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture(scope="module")
def long_presentation(tmp_path_factory) -> tdash.Presentation:
    base = tmp_path_factory.mktemp("live")
    wav = base / "long.wav"
    subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=330:d=20", str(wav)], check=True)
    return tdash.make(wav, base / "p", kind="number", seconds=1.0)


@pytest.mark.parametrize("timeline", [False, True])
async def test_a_live_presentation_is_recorded_for_the_window(client, tmp_path, long_presentation, timeline):
    clock = Clock(1_800_000_000.0)
    cfg = DownloadConfig(retry_backoff=0, timeout=10, live_record_seconds=4.0)
    async with tdash.LiveServer(long_presentation, timeline=timeline, clock=clock, history=3.0) as live:
        downloader = Downloader(client, tmp_path, cfg, clock=clock)
        downloader.dash = DashDownloader(client.client, downloader.store, cfg, clock=clock, monotonic=clock,
                                         sleep=clock.sleep)
        got = await downloader.fetch(item(live.url))

    assert (got.status, got.reason) == (OK, None)
    # Three seconds in, segment 2 (from 0) is the newest whole one: it and the next three fill four seconds.
    segments = [p for p, status in live.log if status == 200 and "seg-" in p]
    assert len(segments) == 4 and got.extra["segments"] == 4
    assert got.duration == 4.0 and got.extra["live"] is True and got.extra["format"] == "dash"
    assert got.extra["recorded_at"] == 1_800_000_000.0
    expected = live.init + b"".join(live.segments[k] for k in (2, 3, 4, 5))
    assert got.sha256 == sha(expected) and got.size == len(expected)
    assert (tmp_path / got.path).read_bytes() == expected and got.path.endswith(".m4a")
    manifests = [p for p, _ in live.log if p.endswith(".mpd")]
    assert len(manifests) == (4 if timeline else 1)      # a timeline is fetched again for its new segments
    assert not [p for p, status in live.log if status != 200]
    # A recording is never kept as the item's finished download: the next visit records a new window.
    assert downloader.store.load_finished(partial_key(item(live.url))) is None
    assert list((tmp_path / "audio" / "partial").iterdir()) == []


async def test_a_live_recording_covers_its_window_past_the_deadline(client, tmp_path, long_presentation):
    """The window (real time, short) is longer than the download's deadline_base: the recording still ends
    with the window, not as too slow."""
    cfg = DownloadConfig(retry_backoff=0, timeout=10, live_record_seconds=2.5, deadline_base=1.0)
    async with tdash.LiveServer(long_presentation, history=1.5) as live:
        got = await Downloader(client, tmp_path, cfg).fetch(item(live.url))
    assert (got.status, got.reason) == (OK, None)
    assert got.extra["live"] is True and 1.0 <= got.duration <= 4.0
    assert got.duration == got.extra["segments"] * 1.0
    assert probe_duration(tmp_path / got.path) > 0.5


async def test_a_live_origin_whose_clock_is_behind_ours_is_waited_for(client, tmp_path, long_presentation):
    clock = Clock(1_800_000_000.0)
    cfg = DownloadConfig(retry_backoff=0, timeout=10, live_record_seconds=4.0)
    # The origin's clock runs 0.7 s behind: each segment we compute as due is not there for 0.7 s more.
    async with tdash.LiveServer(long_presentation, clock=lambda: clock.now - 0.7, history=3.0) as live:
        downloader = Downloader(client, tmp_path, cfg, clock=clock)
        downloader.dash = DashDownloader(client.client, downloader.store, cfg, clock=clock, monotonic=clock,
                                         sleep=clock.sleep)
        got = await downloader.fetch(item(live.url))
    assert (got.status, got.reason) == (OK, None)
    assert [p for p, status in live.log if status == 404]          # asked early, and again
    ok = [p for p, status in live.log if status == 200 and "seg-" in p]
    assert len(ok) == got.extra["segments"] >= 3 and got.duration == got.extra["segments"] * 1.0


async def test_a_live_stream_that_stops_keeps_what_was_recorded(client, tmp_path, long_presentation):
    clock = Clock(1_800_000_000.0)
    cfg = DownloadConfig(retry_backoff=0, timeout=10, live_record_seconds=10.0)
    async with tdash.LiveServer(long_presentation, clock=clock, history=3.0) as live:
        live.last = 4        # the stream ends after its fifth segment
        downloader = Downloader(client, tmp_path, cfg, clock=clock)
        downloader.dash = DashDownloader(client.client, downloader.store, cfg, clock=clock, monotonic=clock,
                                         sleep=clock.sleep)
        got = await downloader.fetch(item(live.url))
    assert (got.status, got.reason) == (OK, None)
    assert got.extra["segments"] == 3 and got.duration == 3.0      # segments 2, 3 and 4
    assert got.sha256 == sha(live.init + b"".join(live.segments[k] for k in (2, 3, 4)))


def test_the_live_edge_of_a_template_and_of_a_repeating_timeline():
    def live(template: str) -> tuple[dash.Manifest, dash.Representation]:
        body = (f'<Period start="PT0S"><AdaptationSet contentType="audio"><Representation id="a" bandwidth="1">'
                f'{template}</Representation></AdaptationSet></Period>')
        m = parse(mpd(body, root='type="dynamic" availabilityStartTime="1970-01-01T00:16:40Z" '
                                 'minimumUpdatePeriod="PT60S"'), SITE)
        assert m.dynamic and m.availability_start == 1000.0
        return m, dash.live_representation(m, 1007.5)

    m, rep = live('<SegmentTemplate timescale="1000" duration="2000" startNumber="5" media="n$Number$.m4s"/>')
    view = dash.live_view(m, rep, 1007.5, None)
    # 7.5 s in: segments 0-2 (numbers 5-7) are whole; the next is whole at 8 s.
    assert [s.number for s in view.segments] == [7] and view.wait == 0.5
    assert [s.number for s in dash.live_view(m, rep, 1011.0, view.segments[-1]).segments] == [8, 9]

    m, rep = live('<SegmentTemplate timescale="1000" media="t$Time$.m4s"><SegmentTimeline><S t="0" d="2000" r="-1"/>'
                  '</SegmentTimeline></SegmentTemplate>')
    view = dash.live_view(m, rep, 1007.5, None)
    assert [s.media.url.rsplit("/", 1)[-1] for s in view.segments] == ["t4000.m4s"] and view.wait == 2.0
    later = dash.live_view(m, rep, 1011.0, view.segments[-1])      # grown with the clock, no new manifest
    assert [s.time for s in later.segments] == [6000, 8000]
    assert dash.refresh_every(m) == 60.0


async def test_the_archive_records_the_manifest_the_segments_and_the_joined_file(server, tmp_path, presentations):
    from crawler.http.getter import build_stack
    from tests.fakes.archive import Collected

    p = presentations["number"]
    url = serve(server, p, "arc")
    col = Collected()
    async with build_stack(user_agent="ua", connect_timeout=10, read_timeout=10, max_redirects=5,
                           max_connections=8, dns_ttl=60, archive=col) as http:
        got = await Downloader(http, tmp_path, CFG, archive=col).fetch(item(url))
    assert got.status == OK, got.reason
    roles = [(ex.role, ex.url.rsplit("/arc/", 1)[1]) for ex in col.exchanges]
    assert roles == [("playlist", tdash.MPD), *[("segment", f.name) for f in p.files]]
    assert col.exchanges[0].body == p.mpd.read_bytes() and all(ex.page == item(url).page for ex in col.exchanges)
    for ex, f in zip(col.exchanges[1:], p.files, strict=True):     # the audio's digest, not its bytes
        assert ex.body == b"" and ex.payload_digest == f"sha256:{sha(f.read_bytes())}"
    [(target, fields, refers_to, _, role)] = col.metadatas
    assert (target, role, refers_to) == (url, "audio", f"<urn:uuid:exchange-{len(col.exchanges)}>")
    assert dict(fields)["sha256"] == got.sha256 == p.sha256()


@pytest.mark.parametrize("case", ["tiny segments", "a million listed", "ancient start"])
def test_hostile_live_manifests_cost_bounded_work(case):
    template = {
        "tiny segments": '<SegmentTemplate timescale="1000" duration="10" media="$Number$.m4s"/>',
        "a million listed": '<SegmentTemplate timescale="1" media="$Time$.m4s"><SegmentTimeline>'
                            '<S t="0" d="1" r="1000000"/></SegmentTimeline></SegmentTemplate>',
        "ancient start": '<SegmentTemplate timescale="1" duration="1" media="$Number$.m4s"/>',
    }[case]
    body = (f'<Period start="PT0S"><AdaptationSet contentType="audio"><Representation id="a" bandwidth="1">'
            f'{template}</Representation></AdaptationSet></Period>')
    m = parse(mpd(body, root='type="dynamic" availabilityStartTime="1970-01-01T00:00:00Z"'), SITE)
    rep = dash.live_representation(m, 1_800_000_000.0)
    if case == "ancient start":    # fifty-seven years of one-second segments: the newest, then a batch at most
        first = dash.live_view(m, rep, 1_800_000_000.0, None).segments
        assert [s.number for s in first] == [1_800_000_000]     # segment k is number k + 1
        behind = dash.Segment(first[0].media, 1.0, None, 1, 0)
        assert len(dash.live_view(m, rep, 1_800_000_000.0, behind).segments) == dash.MAX_LIVE_BATCH
        return
    with pytest.raises(DashError, match="live segments of|more than"):
        dash.live_view(m, rep, 1_800_000_000.0, None)
