"""What was played, where and when: the master's side of live streams, on SQLite and PostgreSQL.

Each visit of a live stream records a new window (crawler/worker/recording.py fills the row: extra.live,
extra.recorded_at, duration, sha256, and a station's extra.played). The store keeps every window as the item's
history (live_recordings), never as a "change"; a window's fingerprint is its own; the matcher finds each work a
window holds, where in it (crawler.identify's Match.at/length) and so when it was played (played_at) and for how
long (played_seconds). A "station recording" is synthesised (testkit/music.py): three works with noise, silence
and speech between, fingerprinted for real.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from crawler.identify import ReferenceIndex, fingerprint_file
from crawler.items import AudioItem
from crawler.master.backend import open_backend
from crawler.master.matching import Matcher
from crawler.master.store import Checked, MasterStore, Reference
from crawler.master.store_identify import MATCH_COLUMNS, alert_row
from testkit import music

R = music.RATE
SEEDS = (311, 312, 313)
# Where each work is heard in the station recording (seconds into it), for how long, and from which second of the
# work: noise 2.5 s, work A 5-35 s, silence 2 s, work B 0-30 s, speech 3 s, work C 10-40 s, noise 1.5 s.
HEARD = {"A": (2.5, 30.0, 5.0), "B": (34.5, 30.0, 0.0), "C": (67.5, 30.0, 10.0)}
STATION_SECONDS = 99.0
# How close the matched span is to where the work was heard. The pairs a match is verified by are about one a
# second, so each end is known to about a second (scripts/bench_fingerprint.py's works; a sparse match of 15
# pairs may be off by two).
SPAN_TOLERANCE = 1.25
RECORDED_AT = 1_765_000_000.0            # 2025-12-06T05:46:40Z: a wall-clock start, as a worker reports it


@pytest.fixture(scope="module")
def station(tmp_path_factory) -> dict:
    """The works' fingerprints (A, B, C) and the station recording's, made once for the module."""
    d = tmp_path_factory.mktemp("station")
    works = {name: music.work(seed, 45.0) for name, seed in zip("ABC", SEEDS, strict=True)}
    parts = [music.noise(1, 2.5), works["A"][5 * R:35 * R], np.zeros(2 * R, np.float32), works["B"][:30 * R],
             music.speech(2, 3.0), works["C"][10 * R:40 * R], music.noise(3, 1.5)]
    recording = np.concatenate(parts)
    assert abs(len(recording) / R - STATION_SECONDS) < 0.01
    return {"works": {n: fingerprint_file(music.write_wav(d / f"{n}.wav", pcm)) for n, pcm in works.items()},
            "recording": fingerprint_file(music.write_wav(d / "station.wav", recording)),
            "other": fingerprint_file(music.write_wav(d / "other.wav", np.concatenate(
                [music.speech(5, 10.0), works["B"][10 * R:35 * R]])))}


@pytest.fixture
def store(store_location):
    s = MasterStore(store_location)
    yield s
    s.close()


def _live(url: str, page: str, sha: str, recorded_at: float, at: float, *, title: str | None = "Radio One",
          played: list | None = None, fingerprint: bytes | None = None, status: str = "ok") -> AudioItem:
    """A window's item as crawler.worker.recording.recorded leaves it."""
    extra = {"live": True, "format": "icy", "recorded_at": recorded_at}
    if played is not None:
        extra["played"] = played
    return AudioItem(url=url, page=page, status=status, sha256=sha if status == "ok" else None,
                     size=1000 if status == "ok" else None, path=f"audio/{sha[:8]}.mp3" if status == "ok" else None,
                     duration=STATION_SECONDS if status == "ok" else None, title=title, extra=extra,
                     fingerprint=fingerprint)


def _row(item: AudioItem, at: float, node: str = "w1") -> dict:
    return {**item.catalogue_row(), "node": node, "found_at": at}


# -- where in a recording each work was heard (crawler/identify/index.py) ------------------------------------

def test_the_match_says_where_in_a_station_recording_each_work_was_heard(station):
    index = ReferenceIndex()
    for name, fp in station["works"].items():
        index.add(name, fp)
    found = {m.work: m for m in index.match(station["recording"])}
    assert set(found) == {"A", "B", "C"}       # three works in one recording, each verified on its own
    for name, (at, length, offset) in HEARD.items():
        m = found[name]
        assert abs(m.at - at) <= SPAN_TOLERANCE, (name, m)
        assert abs(m.at + m.length - (at + length)) <= SPAN_TOLERANCE, (name, m)
        # The offset is the work's time at the query's start, as for a file: the heard part starts at offset + at.
        assert abs(m.offset + m.at - offset) <= SPAN_TOLERANCE, (name, m)
    # A file copy is a query like any: the whole of it is heard (speech, then B from 10 s for 25 s).
    (m,) = index.match(station["other"])
    assert m.work == "B" and abs(m.at - 10.0) <= SPAN_TOLERANCE and abs(m.at + m.length - 35.0) <= SPAN_TOLERANCE


# -- the windows kept as the item's history ------------------------------------------------------------------

def test_each_window_of_a_live_row_is_kept_as_history_never_as_a_change(store):
    url, page = "http://radio.test/stream", "http://radio.test/"
    played = [{"offset": 0.0, "title": "Ann - One"}, {"offset": 31.5, "title": "Bob - Two"}]
    first = _live(url, page, "a" * 64, 1000.0, 0, played=played)
    assert store.add_audio([_row(first, 1001.0)]) == [True]
    second = _live(url, page, "b" * 64, 2000.0, 0, played=[{"offset": 0.0, "title": "Cy - Three"}])
    assert store.add_audio([_row(second, 2001.0, node="w2")]) == [False]
    assert store.add_audio([_row(second, 2001.0, node="w2")]) == [False]   # the same report again: one window
    # A visit whose recording failed (the stream was down) keeps the item and its windows.
    failed = _live(url, page, "c" * 64, 3000.0, 0, status="failed")
    store.add_audio([_row(failed, 3001.0)])
    # The same stream from another page is another item, with its own windows.
    store.add_audio([_row(_live(url, "http://other.test/", "d" * 64, 2500.0, 0, title=None), 2501.0)])
    store.commit()
    rows = {r["page"]: r for r in store.catalogue()}
    row = rows[page]
    assert row["status"] == "ok" and row["changed_at"] is None
    assert (row["sha256"], row["extra"]["recorded_at"], row["extra"]["played"]) == (
        "b" * 64, 2000.0, [{"offset": 0.0, "title": "Cy - Three"}])           # the latest window
    assert row["last_seen"] == 3001.0
    assert "changed" not in store.status()["audio"]
    assert store.audio.cycle().get("changed", 0) == 0
    assert store.db.execute("SELECT count(*) FROM audio_history").fetchone()[0] == 0
    windows = list(store.export_recordings())
    assert [(w["page"], w["sha256"], w["recorded_at"], w["node"], w["played"]) for w in windows] == [
        (page, "a" * 64, 1000.0, "w1", played),
        (page, "b" * 64, 2000.0, "w2", [{"offset": 0.0, "title": "Cy - Three"}]),
        ("http://other.test/", "d" * 64, 2500.0, "w1", None)]
    assert windows[0]["title"] == "Radio One" and windows[0]["duration"] == STATION_SECONDS
    assert windows[0]["format"] == "icy" and windows[0]["stored_at"] == 1001.0
    assert store.recordings_stored() == 3


def test_a_file_with_new_bytes_is_still_a_change(store):
    item = AudioItem(url="http://a/x.mp3", page="http://a/", sha256="1" * 64, size=1, path="audio/x.mp3")
    store.add_audio([_row(item, 1.0)])
    store.add_audio([_row(item.replace(sha256="2" * 64), 2.0)])
    store.commit()
    (row,) = store.catalogue()
    assert row["status"] == "changed" and row["changed_at"] == 2.0
    assert list(store.export_recordings()) == [] and store.recordings_stored() == 0


def test_a_window_that_ends_a_pending_download_is_kept(store):
    url, page = "http://tv.test/live.m3u8", "http://tv.test/"
    pending = AudioItem(url=url, page=page, status="pending")
    store.add_audio([_row(pending, 1.0)])
    done = _live(url, page, "e" * 64, 5.0, 0, title=None)
    (settled,) = store.settle_audio([(pending.catalogue_row(), _row(done, 70.0))])
    assert settled is not None and settled["status"] == "ok"
    # The next visit's window comes as a repeat.
    store.add_audio([_row(_live(url, page, "f" * 64, 605.0, 0, title=None), 670.0)])
    store.commit()
    assert [w["sha256"] for w in store.export_recordings()] == ["e" * 64, "f" * 64]
    assert store.status()["audio"] == {"ok": 1}


# -- matches per window, with the time played --------------------------------------------------------------

async def _drain(m: Matcher, now: float) -> list[dict]:
    rows = []
    while True:
        n, fresh = await m.step(now)
        rows += fresh
        if not n:
            return rows


def test_a_station_recording_is_matched_per_window_with_when_each_work_was_played(store, station):
    url, page = "http://radio.test/stream", "http://radio.test/"
    store.add_references([Reference(n, fp, f"Work {n}") for n, fp in station["works"].items()], 1.0)
    one = _live(url, page, "a" * 64, RECORDED_AT, 0, fingerprint=station["recording"])
    two = _live(url, page, "b" * 64, RECORDED_AT + 600, 0)
    store.add_audio([_row(one, RECORDED_AT + 100), _row(two, RECORDED_AT + 700)])
    # The fingerprints come with the items (the second one late, after its outcome): each to its own window.
    store.add_window_fingerprints([(url, "a" * 64, station["recording"])])
    store.add_window_fingerprints([(url, "b" * 64, station["other"])])
    # A file's fingerprint keeps to the fingerprints table, matched as before.
    store.add_audio([_row(AudioItem(url="http://up.test/b.mp3", page="http://up.test/", sha256="9" * 64,
                                    size=1), RECORDED_AT)])
    store.add_fingerprints([("http://up.test/b.mp3", station["other"])], RECORDED_AT)
    matcher = Matcher(store, ReferenceIndex, alert=True)

    async def go() -> list[dict]:
        await matcher.load()
        return await _drain(matcher, RECORDED_AT + 800)

    try:
        fresh = asyncio.run(go())
    finally:
        matcher.close()
    store.commit()
    assert len(fresh) == 5 and store.match_count() == 5
    live = [r for r in store.export_matches() if r["live"]]
    windows = {w["sha256"]: w["window"] for w in store.export_recordings()}
    first = {r["work"]: r for r in live if r["window"] == windows["a" * 64]}
    assert set(first) == {"A", "B", "C"}
    for name, (at, length, offset) in HEARD.items():
        r = first[name]
        assert abs(r["played_at"] - (RECORDED_AT + at)) <= SPAN_TOLERANCE, r
        assert r["window_offset"] == round(r["played_at"] - RECORDED_AT, 3), r      # where in the recording
        assert abs(r["played_seconds"] - length) <= 2 * SPAN_TOLERANCE, r
        assert abs(r["offset"] - offset) <= SPAN_TOLERANCE, r          # into the work, where the heard part starts
        assert (r["url"], r["page"], r["station"], r["title"]) == (url, page, "Radio One", f"Work {name}")
        assert r["recording"] is None                                   # windows join no group of copies
    (second,) = [r for r in live if r["window"] == windows["b" * 64]]
    assert second["work"] == "B" and abs(second["played_at"] - (RECORDED_AT + 610)) <= SPAN_TOLERANCE
    # The file's match is as it was: no time played, not live, a recording group of its own.
    (file_match,) = [r for r in store.export_matches() if not r["live"]]
    assert (file_match["url"], file_match["work"], file_match["played_at"], file_match["played_seconds"],
            file_match["station"], file_match["window"], file_match["window_offset"]) == (
        "http://up.test/b.mp3", "B", None, None, None, None, None)
    assert file_match["recording"] is not None
    # The catalogue row of a stream has no single match (its windows each have theirs); the file's has.
    rows = {r["url"]: r for r in store.catalogue()}
    assert "match" not in rows[url] and rows["http://up.test/b.mp3"]["match"]["work"] == "B"
    # The alert and the status show the export's row, times in ISO-8601 UTC.
    bodies = [json.loads(body) for _, body, _ in store.due_alerts(RECORDED_AT + 900, 10)]
    played = {b["work"]: b for b in bodies if b["live"] and b["window"] == windows["a" * 64]}
    assert set(played) == {"A", "B", "C"} and set(bodies[0]) == set(MATCH_COLUMNS)
    assert played["A"]["played_at"].startswith("2025-12-06T05:46:4")
    latest = store.status()["matches"]["latest"]
    assert any(m["live"] and m["played_at"] is not None for m in latest)
    assert alert_row(first["A"])["played_at"].endswith("Z")


def test_a_window_matched_again_after_a_new_reference_adds_only_the_new_work(store, station):
    url, page = "http://radio.test/stream", "http://radio.test/"
    store.add_references([Reference("A", station["works"]["A"])], 1.0)
    store.add_audio([_row(_live(url, page, "a" * 64, RECORDED_AT, 0), RECORDED_AT + 100)])
    store.add_window_fingerprints([(url, "a" * 64, station["recording"])])
    matcher = Matcher(store, ReferenceIndex)

    async def go() -> tuple[list[dict], list[dict]]:
        await matcher.load()
        first = await _drain(matcher, 10.0)
        store.add_references([Reference("C", station["works"]["C"])], 11.0)
        return first, await _drain(matcher, 12.0)

    try:
        first, later = asyncio.run(go())
    finally:
        matcher.close()
    assert [r["work"] for r in first] == ["A"] and [r["work"] for r in later] == ["C"]
    assert abs(later[0]["played_at"] - (RECORDED_AT + HEARD["C"][0])) <= SPAN_TOLERANCE


# -- stores made before: migrated on opening ----------------------------------------------------------------

OLD_MATCHES = """CREATE TABLE matches (
    url         TEXT NOT NULL,
    work        TEXT NOT NULL,
    score       {REAL} NOT NULL,
    work_offset {REAL} NOT NULL,
    matched_at  {REAL} NOT NULL,
    PRIMARY KEY (url, work)
)"""


def _make_old(location) -> None:
    """A store as the layout before live windows left it: matches keyed (url, work), no live_recordings."""
    s = MasterStore(location)
    s.add_references([Reference("w1", b"a b c", "One")], 1.0)
    s.add_audio([_row(AudioItem(url="http://a/1.mp3", page="http://a/", sha256="1" * 64, size=1), 1.0)])
    s.commit()
    s.close()
    db = open_backend(location, readonly=False)
    try:
        db.begin()
        db.execute("DROP TABLE live_recordings")
        db.execute("DROP TABLE matches")
        db.execute(db.ddl(OLD_MATCHES))
        db.execute("CREATE INDEX matches_time ON matches(matched_at)")
        db.execute("INSERT INTO matches(url, work, score, work_offset, matched_at) VALUES (?, ?, ?, ?, ?)",
                   ("http://a/1.mp3", "w1", 3.0, 1.5, 2.0))
        db.execute("COMMIT")
    finally:
        db.close()


def test_a_store_from_before_live_windows_is_migrated_with_its_matches(store_location):
    _make_old(store_location)
    if isinstance(store_location, Path):
        # A reader beside it, before any master opened it, sees the matches as files' and no windows.
        with MasterStore.open_readonly(store_location) as reader:
            (old,) = reader.export_matches()
            assert (old["url"], old["work"], old["live"], old["played_at"]) == ("http://a/1.mp3", "w1", False, None)
            assert list(reader.export_recordings()) == []
    with MasterStore(store_location) as s:
        (row,) = s.export_matches()
        assert (row["url"], row["work"], row["offset"], row["matched_at"], row["live"], row["window"]) == (
            "http://a/1.mp3", "w1", 1.5, 2.0, False, None)
        assert s.match_count() == 1
        # The new layout works: a window and its match.
        s.add_audio([_row(_live("http://r/s", "http://r/", "a" * 64, 100.0, 0), 101.0)])
        s.add_window_fingerprints([("http://r/s", "a" * 64, b"fp")])
        ((window, fp, checked),) = s.windows_to_match(1, 10)
        assert (fp, checked) == (b"fp", -1)
        s.record_checked([Checked("", 1, None, (("w1", 20.0, -3.0, 4.0, 30.0),), window=window)], 200.0)
        s.record_checked([Checked("http://a/1.mp3", 1, None, (("w1", 3.0, 1.5),))], 201.0)   # known: no new row
        s.commit()
        assert s.match_count() == 2 and s.windows_to_match(1, 10) == []
    with MasterStore(store_location) as again:     # opened again: nothing to migrate, nothing lost
        live = [r for r in again.export_matches() if r["live"]]
        assert [(r["played_at"], r["played_seconds"], r["offset"], r["station"]) for r in live] == [
            (104.0, 30.0, 1.0, "Radio One")]


def test_played_seconds_stop_at_the_end_of_the_window(store):
    store.add_references([Reference("w1", b"x")], 1.0)
    store.add_audio([_row(_live("http://r/s", "http://r/", "a" * 64, 100.0, 0), 101.0)])
    store.add_window_fingerprints([("http://r/s", "a" * 64, b"fp")])
    ((window, _, _),) = store.windows_to_match(1, 10)
    (row,) = store.record_checked([Checked("", 1, None, (("w1", 20.0, 0.0, 90.0, 15.0),), window=window)], 2.0)
    assert (row["played_at"], row["played_seconds"]) == (190.0, STATION_SECONDS - 90.0)


# -- the exports as the operator runs them -------------------------------------------------------------------

def test_export_recordings_and_matches_from_the_command_line(tmp_path):
    from tests.test_operator_cli import master_yaml
    from tests.test_references_cli import run

    cfg = master_yaml(tmp_path)
    url, page = "http://radio.test/stream", "http://radio.test/"
    played = [{"offset": 0.0, "title": "Ann - One"}, {"offset": 31.5, "title": "Bob, \"Two\""}]
    with MasterStore(tmp_path / "state" / "master.db") as s:
        s.add_references([Reference("w1", b"x", "One")], 1.0)
        s.add_audio([_row(_live(url, page, "a" * 64, RECORDED_AT, 0, played=played), RECORDED_AT + 100)])
        s.add_audio([_row(_live(url, page, "b" * 64, RECORDED_AT + 600, 0), RECORDED_AT + 700)])
        s.add_window_fingerprints([(url, "a" * 64, b"fp")])
        ((window, _, _),) = s.windows_to_match(1, 10)
        s.record_checked([Checked("", 1, None, (("w1", 20.0, -10.0, 12.4, 60.0),), window=window)],
                         RECORDED_AT + 800)
    r = run(["export", "--recordings", "--config", str(Path(cfg))], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["window"], x["url"], x["page"], x["title"], x["recorded_at"], x["duration"], x["sha256"], x["node"])
            for x in lines] == [
        (1, url, page, "Radio One", "2025-12-06T05:46:40Z", STATION_SECONDS, "a" * 64, "w1"),
        (2, url, page, "Radio One", "2025-12-06T05:56:40Z", STATION_SECONDS, "b" * 64, "w1")]
    assert lines[0]["played"] == played and lines[1]["played"] is None
    r = run(["export", "--recordings", "--format", "csv", "--config", str(cfg)], tmp_path)
    assert r.returncode == 0, r.stderr
    table = list(csv.DictReader(io.StringIO(r.stdout)))
    assert r.stdout.splitlines()[0] == ("window,url,page,title,recorded_at,duration,sha256,size,path,node,format,"
                                         "played,stored_at")
    assert json.loads(table[0]["played"]) == played and table[1]["played"] == ""
    r = run(["export", "--matches", "--config", str(cfg)], tmp_path)
    (m,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert (m["work"], m["played_at"], m["played_seconds"], m["live"], m["station"], m["window"], m["offset"]) == (
        "w1", "2025-12-06T05:46:52Z", 60.0, True, "Radio One", 1, 2.4)
    r = run(["export", "--matches", "--format", "csv", "--config", str(cfg)], tmp_path)
    header, line = r.stdout.splitlines()
    assert header == ("url,work,title,artist,score,offset,page,first_seen,last_seen,matched_at,recording,"
                      "played_at,played_seconds,live,station,window,window_offset")
    assert line.endswith(",2025-12-06T05:46:52Z,60.0,True,Radio One,1,12.4")
    r = run(["export", "--recordings", "--matches", "--config", str(cfg)], tmp_path)
    assert r.returncode == 2 and "choose one" in r.stderr
    r = run(["export", "--recordings", "--changes-since", "0", "--config", str(cfg)], tmp_path)
    assert r.returncode == 2 and "--recordings" in r.stderr
    # The catalogue export is as it was: the row shows the latest window, its live fields in extra.
    r = run(["export", "--config", str(cfg)], tmp_path)
    (row,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert (row["sha256"], row["status"], row["extra"]["live"], row["extra"]["recorded_at"]) == (
        "b" * 64, "ok", True, RECORDED_AT + 600)


def test_a_reader_of_a_store_without_identification_sees_no_windows(tmp_path):
    path = tmp_path / "m.db"
    MasterStore(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE live_recordings;")
    db.close()
    with MasterStore.open_readonly(path) as reader:
        assert list(reader.export_recordings()) == []
