"""End to end: a live HLS stream recorded and identified. A real master and worker (processes, on loopback) crawl a
site whose page links a live stream (testkit/livehls.py: a synthesised work cut by ffmpeg into MPEG-TS segments,
encrypted, behind a master playlist, its window moving with the clock). Each visit records a window of
``live_record_seconds``: the row is live, HLS, about a window long, its bytes exactly the segments the stream
served, and a refresh visit records a new window (a new sha256, the old one kept as the item's history). With the
work the stream plays added as a reference, the recording is matched to it at the offset it was on air."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime
from pathlib import Path

import pytest

from crawler.master.store import MasterStore
from testkit import cluster, music
from testkit.cluster import jsonl, master_command, store_count
from testkit.livehls import LiveHls, cut

pytestmark = pytest.mark.timeout(240)

KEY = bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0")
WINDOW = 20.0                 # live_record_seconds: long enough for a recording to be identified
SEGMENT = 2.0
WORK_SECONDS = 90.0           # the stream's loop: longer than the test, so no recording spans its seam
OFFSET_TOLERANCE = 0.5


def _recordings(db: Path, url: str) -> list[tuple[str, str]]:
    """(sha256, path) of every window recorded of ``url`` the catalogue holds (its history), in the order stored."""
    if not db.exists():
        return []
    try:
        store = MasterStore.open_readonly(db)
    except Exception:     # not created yet
        return []
    try:
        return [(w["sha256"], w["path"]) for w in store.export_recordings() if w["url"] == url]
    finally:
        store.close()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> tuple[Path, Path]:
    """The work the station plays (a WAV, and the CSV naming it as a reference)."""
    base = tmp_path_factory.mktemp("live-work")
    (base / "refs").mkdir()
    wav = music.write_wav(base / "refs" / "w-live.wav", music.work(141, WORK_SECONDS))
    meta = base / "works.csv"
    meta.write_text("path,work,title,artist\nrefs/w-live.wav,W-LIVE,On Air,Station Artist\n")
    return wav, meta


def _start_of(stream: LiveHls, seq: int) -> float:
    """Seconds into the work at which segment ``seq`` begins."""
    n = len(stream.source.durations)
    return sum(stream.source.durations[i % n] for i in range(seq - seq % n, seq))


async def test_a_live_stream_is_recorded_each_visit_and_identified(work, tmp_path):
    wav, meta = work
    source = cut(wav, tmp_path / "cut", seconds=SEGMENT)
    page = b'<html><body><h1>Radio</h1><a href="/live/index.m3u8">listen live</a></body></html>'
    master = worker = None
    async with LiveHls(source, window=6, key=KEY, master=True,
                       pages={"/": (page, "text/html")}) as stream:
        url = stream.stream
        config = cluster.master_config(tmp_path, [stream.url + "/"], ["w1"], exit_when_done=False,
                                       crawl={"refresh_interval": 2.0, "refresh_min": 2.0, "refresh_max": 2.0})
        db = Path(cluster.store_of(config))
        wcfg = tmp_path / "worker.yaml"
        wcfg.write_text(f"live_record_seconds: {WINDOW}\n")
        try:
            master = await cluster.start_master(config, tmp_path)
            said = await asyncio.to_thread(master_command, "references", "add", "--config", str(config),
                                           "--meta", str(meta), str(wav))
            assert said.startswith("added 1 reference works"), said
            worker = await cluster.start_worker(cluster.master_addr(config), "w1", tmp_path, config=wcfg)
            # The first window, then a refresh visit's new one.
            await cluster.until(lambda: len(set(_recordings(db, url))) >= 2, 150, "two recordings of the stream",
                                master, worker)
            await cluster.until(lambda: store_count(db, "SELECT count(*) FROM matches WHERE work = 'W-LIVE'") >= 1, 60,
                                "the recording's match", master, worker)
            await worker.stop()
            await master.stop()
            matches = jsonl(await asyncio.to_thread(cluster.operator, "export", config, "--matches"))
            recordings_export = jsonl(await asyncio.to_thread(cluster.operator, "export", config, "--recordings"))
            catalogue = jsonl(await asyncio.to_thread(cluster.operator, "export", config))
        finally:
            for proc in (worker, master):
                if proc is not None:
                    await proc.stop()
        served = list(stream.served)
        requests = list(stream.requests)

    # The row: a live HLS recording of about one window, its bytes the served segments' plain bytes in order.
    row = next(r for r in catalogue if r["url"] == url)
    assert row["status"] in ("ok", "changed") and row["page"] == stream.url + "/", row
    assert row["extra"].get("live") is True and row["extra"]["format"] == "hls", row
    assert WINDOW <= row["duration"] < WINDOW + SEGMENT + 0.1, row
    assert isinstance(row["extra"]["recorded_at"], (int, float)) and row["size"] > 0
    stored = tmp_path / "worker-w1" / row["path"]
    data = stored.read_bytes()
    assert hashlib.sha256(data).hexdigest() == row["sha256"] and len(data) == row["size"]
    # The segments it holds: a run of those served, one after another in the stream, none twice.
    mine = _segments_of(data, served, stream)
    assert mine and mine == list(range(mine[0], mine[0] + len(mine))), (mine, served)
    # The key was asked for; the video variant never.
    assert "/live/key.bin" in requests and "/live/video.m3u8" not in requests

    # Two visits, two windows: the earlier ones kept as the item's history, each a run of the stream of its own.
    recordings = _recordings(db, url)
    assert len({sha for sha, _ in recordings}) >= 2 and recordings[-1][0] == row["sha256"]
    starts, durations = [], []
    for sha, path in recordings:
        segments = _segments_of((tmp_path / "worker-w1" / path).read_bytes(), served, stream)
        assert segments == list(range(segments[0], segments[0] + len(segments))), (sha, segments)
        starts.append(_start_of(stream, segments[0]))
        durations.append(sum(stream.duration(s) for s in segments))
        assert WINDOW <= durations[-1] < WINDOW + SEGMENT + 0.1
    # The row describes its latest recording: the EXTINF total of its segments.
    assert durations[-1] == pytest.approx(row["duration"], abs=1e-3), (durations, row["duration"])

    # Identified: the work, at the point of the work where one of the recordings began.
    hits = [m for m in matches if m["url"] == url]
    assert hits and all(m["work"] == "W-LIVE" and m["title"] == "On Air" for m in hits), matches
    windows = {w["window"]: w for w in recordings_export}
    # A window's match says where in the work the part heard begins (offset) and where in the window that is
    # (window_offset: where the matcher first heard it, which its sparse pairs place a second or two late at
    # times): the work's second at the window's start is the one before.
    at_start = [m["offset"] - m["window_offset"] for m in hits]
    assert any(abs(o - s) <= OFFSET_TOLERANCE for o in at_start for s in starts), (at_start, starts, hits)
    # Each match says when the work was played: within the window it was heard in, for as long as it was heard.
    for m in hits:
        window = windows[m["window"]]
        assert m["live"] is True and m["station"] == row["title"], m
        begun = datetime.fromisoformat(window["recorded_at"]).timestamp()
        played = datetime.fromisoformat(m["played_at"]).timestamp()
        assert begun - 1 <= played <= begun + window["duration"], (m, window)
        assert 0 < m["played_seconds"] <= window["duration"] + 1e-6, (m, window)


def _segments_of(data: bytes, served: list[int], stream: LiveHls) -> list[int]:
    """The run of served segments (in the order they were asked for) whose plain bytes joined are ``data``."""
    for i in range(len(served)):
        joined = b""
        for j in range(i, len(served)):
            joined += stream.plain(served[j])
            if not data.startswith(joined):
                break
            if len(joined) == len(data):
                return served[i:j + 1]
    return []
