"""The master store: frontier order and routing, lease accounting, refresh, catalogue, and crash consistency."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from crawler.master.store import MasterStore, PageOutcome, ReadOnlyStoreError, StoreError
from tests.store_reads import audio_by_sha, audio_history, due_for_refresh, url_info


def to(node):
    return lambda urls: [node] * len(urls)


def fin(url, state="done", node="a", at=100.0, error=None):
    return PageOutcome(url, state, 200 if state == "done" else 500, None, "text/html", 10, error, node, at)


@pytest.fixture
def store(store_location):
    s = MasterStore(store_location, max_attempts=3)
    yield s
    s.close()


def truth(db) -> dict[tuple[int, str], int]:
    return {(s, n or ""): c for s, n, c in
            db.execute("SELECT state, node, count(*) FROM urls GROUP BY state, node")}


def check_invariants(location: Path | str):
    """What must hold in any committed state, whatever instant the writer died at. Returns a reading connection
    (`?` placeholders on either database)."""
    db = MasterStore.open_readonly(location).db
    counts = {(s, n): v for s, n, v in db.execute("SELECT state, node, n FROM counts") if v}
    assert counts == truth(db)
    assert db.execute("SELECT count(*) FROM url_state WHERE state NOT IN (0, 1, 2, 3)").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM url_state WHERE state = 1 AND node IS NULL").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM url_state WHERE node < 0").fetchone()[0] == 0     # none left parked
    assert db.execute("SELECT count(*) FROM frontier").fetchone()[0] == \
        db.execute("SELECT count(*) FROM urls WHERE state = 0").fetchone()[0]
    assert db.execute("SELECT count(*) FROM frontier f LEFT JOIN urls u ON u.id = f.url_id "
                      "WHERE u.id IS NULL OR u.state != 0").fetchone()[0] == 0
    assert db.execute("SELECT count(*) - count(DISTINCT url) FROM urls").fetchone()[0] == 0
    max_seq = db.execute("SELECT coalesce(max(seq), 0) FROM url_state").fetchone()[0]
    next_seq = db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()
    assert max_seq <= (json.loads(next_seq[0]) if next_seq else 0)
    return db


# -- frontier order and routing ------------------------------------------------------------------------


def test_pop_serves_each_node_its_own_entries_depth_first_then_priority_then_insertion(store):
    pushed = store.push([("http://s/d2", 2, 5, "a", None), ("http://s/d1-low", 1, 0, "a", "http://s/"),
                         ("http://s/d1-high", 1, 3, "a", "http://s/"), ("http://s/d0", 0, 0, "a", None),
                         ("http://t/b-only", 0, 9, "b", None), ("http://s/d1-low-later", 1, 0, "a", None),
                         ("http://s/d0", 0, 0, "b", None)])               # a repeat inside the batch
    assert pushed == 6
    assert store.push([("http://s/d0", 0, 0, "b", None), ("http://s/new", 3, 0, "a", None)]) == 1
    first = store.pop("a", 2, now=1.0)
    assert first == [("http://s/d0", 0, None), ("http://s/d1-high", 1, "http://s/")]
    rest = store.pop("a", 10, now=1.0)
    assert [u for u, _, _ in rest] == ["http://s/d1-low", "http://s/d1-low-later", "http://s/d2", "http://s/new"]
    assert store.pop("a", 10, now=1.0) == []
    assert store.frontier_size() == 1 and store.frontier_size("b") == 1 and store.frontier_size("a") == 0
    assert url_info(store, "http://s/d0")["state"] == "leased"
    assert store.status()["states"] == {"queued": 1, "leased": 6, "done": 0, "error": 0, "robots": 0}


def test_urls_sharing_a_lookup_key_stay_distinct(store, monkeypatch):
    # Force every URL onto one hash: the table must still tell them apart by their text.
    monkeypatch.setattr("crawler.master.urlindex.url_hash", lambda url: 7)
    assert store.push([("http://h/1", 0, 0, "a", None), ("http://h/2", 0, 0, "a", None)]) == 2
    assert store.push([("http://h/1", 0, 0, "a", None), ("http://h/3", 0, 0, "a", None)]) == 1
    assert store.known(["http://h/2", "http://h/4"]) == {"http://h/2"}
    assert store.url_count() == 3


def test_rows_take_ids_in_arrival_order(store):
    # New rows are appended at the table's end, whatever their hosts: ids follow the order URLs arrive in.
    store.push([("http://z/1", 0, 0, "a", None), ("http://a/2", 0, 0, "a", None)])
    store.push([("http://m/3", 0, 0, "a", None), ("http://z/1", 0, 0, "a", None)])
    ids = [store.db.execute("SELECT id FROM urls WHERE url = ?", (u,)).fetchone()[0]
           for u in ("http://z/1", "http://a/2", "http://m/3")]
    assert ids == [1, 2, 3]


def test_reroute_moves_only_the_named_nodes_entries(store):
    store.push([(f"http://s/{i}", 0, 0, ["a", "b", "c"][i % 3], None) for i in range(30)]
               + [("http://s/orphan", 0, 0, None, None)])
    # Half of a's entries route back to a: they did not move.
    moved = store.reroute(["a", None], lambda urls: ["a" if i % 2 else "d" for i in range(len(urls))])
    assert store.frontier_size("b") == 10 and store.frontier_size("c") == 10
    assert store.frontier_size("a") + store.frontier_size("d") == 11 and store.frontier_size(None) == 0
    assert moved == store.frontier_size("d")
    assert store.pop("b", 100, now=0.0) and all(url_info(store, f"http://s/{i}")["node"] == "b"
                                                 for i in range(1, 30, 3))
    assert store.reroute([], to("x")) == 0


def test_reroute_slots_uses_the_slot_recorded_at_push(store_location):
    slot_of = lambda url: int(url.rsplit("/", 1)[1]) % 4
    with MasterStore(store_location, slot_of=slot_of) as s:
        s.push([(f"http://s/{i}", 0, 0, "a", None) for i in range(40)])
        assert s.reroute_slots([1, 3], to("b")) == 20
        assert sorted(int(u.rsplit("/", 1)[1]) % 4 for u, _, _ in s.pop("b", 100, 0.0)) == [1] * 10 + [3] * 10
        assert s.frontier_size("a") == 20


def test_release_keeps_depth_parent_and_place_and_gives_up_on_a_url_that_keeps_losing_its_lease(store_location):
    with MasterStore(store_location, max_attempts=1) as s:   # lost-lease limit: 1 * 3
        s.push([("http://s/x", 3, 0, "a", "http://s/"), ("http://s/y", 3, 0, "b", None)])
        s.pop("a", 1, now=1.0)
        assert s.release(["http://s/x", "http://s/y", "http://s/unknown"], to("b")) == 1   # y was not leased
        assert s.pop("b", 1, now=2.0) == [("http://s/x", 3, "http://s/")]                  # x kept its place
        assert s.release(["http://s/x"], to("a")) == 1
        s.pop("a", 1, now=3.0)
        assert s.release(["http://s/x"], to("a")) == 0
        info = url_info(s, "http://s/x")
        assert info["state"] == "error" and info["attempts"] == 3 and "lease lost" in info["error"]


def test_requeue_leased_at_start_up_returns_every_lease(store_location):
    with MasterStore(store_location) as s:
        s.push([(f"http://s/{i}", 1, 0, "a", None) for i in range(5000)])
        s.pop("a", 4500, now=1.0)
    with MasterStore(store_location) as s:
        assert s.status()["states"]["leased"] == 4500
        assert s.requeue_leased(to("b")) == 4500
        assert s.frontier_size("b") == 4500 and s.frontier_size("a") == 500
        assert url_info(s, "http://s/0")["attempts"] == 0            # the master died, not the fetch


# -- results -------------------------------------------------------------------------------------------


def test_finish_counts_the_first_result_only(store):
    store.push([("http://s/ok", 0, 0, "a", None), ("http://s/late", 0, 0, "a", None)])
    store.pop("a", 2, now=1.0)
    assert store.finish([fin("http://s/ok"), fin("http://s/ok", node="b")]) == [True, False]
    assert store.finish([fin("http://s/ok", "error")]) == [False]
    assert url_info(store, "http://s/ok")["state"] == "done"
    # The lease of "late" was given up, but its result still arrives: it is taken once, not fetched again.
    store.release(["http://s/late"], to("b"))
    assert store.finish([fin("http://s/late", node="a")]) == [True]
    assert store.pop("b", 5, now=2.0) == []
    assert store.finish([fin("http://s/never-pushed")]) == [False]
    assert store.status()["states"] == {"queued": 0, "leased": 0, "done": 2, "error": 0, "robots": 0}
    assert store.status()["nodes"]["a"] == {"done": 2}


def test_finish_reads_handed_out_urls_by_key_and_the_others_by_text_alike(store, monkeypatch):
    # finish() reads the rows of URLs pop() handed out by their keys, kept for a bounded number of them; a URL
    # whose key was dropped (or never kept) is found by its text: the same row either way.
    from crawler.master import store_frontier

    monkeypatch.setattr(store_frontier, "LEASED_KEYS", 3)
    urls = [f"http://s/music/{i}" for i in range(6)]
    store.push([(u, 0, 0, "a", None) for u in urls])
    store.commit()
    store.pop("a", 6, now=1.0)
    frontier = store.frontier
    assert list(frontier._leased_keys) == urls[3:]           # the oldest dropped
    by_key = frontier._current(urls[3:] + urls[3:4])
    assert frontier._leased_keys == {}
    assert by_key == frontier._current(urls[3:]) == {
        u: [r[1], 1, "a", 0, None, None] for u, r in store.core.lookup(urls[3:], "url, id").items()}
    assert store.finish([fin(u) for u in urls]) == [True] * 6
    assert store.status()["states"]["done"] == 6


def test_retry_goes_back_to_the_same_node_until_max_attempts(store):
    store.push([("http://s/flaky", 2, 0, "a", "http://s/")])
    for attempt in (1, 2):
        assert store.pop("a", 5, now=float(attempt)) == [("http://s/flaky", 2, "http://s/")]
        assert store.finish([fin("http://s/flaky", "retry", error="timeout")]) == [True]
        assert url_info(store, "http://s/flaky")["attempts"] == attempt
    store.pop("a", 5, now=3.0)
    # A retry from a node that does not hold the lease changes nothing.
    assert store.finish([fin("http://s/flaky", "retry", node="z")]) == [False]
    assert store.finish([fin("http://s/flaky", "retry", error="timeout")]) == [True]
    info = url_info(store, "http://s/flaky")
    assert info["state"] == "error" and info["attempts"] == 3 and info["error"] == "timeout"
    assert store.frontier_empty()


def test_a_report_moves_each_url_as_its_results_say_in_order(store):
    urls = [f"http://s/{k}" for k in "abcde"]
    store.push([(u, 1, 0, "a", None) for u in urls])
    assert len(store.pop("a", 5, now=1.0)) == 5
    # One statement for the report's URLs: each ends as its results, in order, say.
    results = [fin(urls[0], "retry"), fin(urls[0], "retry"), fin(urls[1], "throttled"), fin(urls[2]),
               fin(urls[3], "error", error="gone"), fin(urls[2], "error"), fin(urls[4], "retry", node="z")]
    assert store.finish(results) == [True, False, True, True, True, False, False]
    info = {u: url_info(store, u) for u in urls}
    assert [(i["state"], i["attempts"], i["node"]) for i in info.values()] == [
        ("queued", 1, "a"), ("queued", 0, "a"), ("done", 0, "a"), ("error", 0, "a"), ("leased", 0, "a")]
    assert info[urls[3]]["error"] == "gone"
    # Back in line in the order their results came; the links of a finished page name it as their parent.
    assert [u for u, _, _ in store.pop("a", 5, now=2.0)] == urls[:2]
    store.push([("http://s/c/1", 2, 0, "a", urls[2]), ("http://s/c/2", 2, 0, "a", "http://elsewhere/")])
    assert store.pop("a", 5, now=3.0) == [("http://s/c/1", 2, urls[2]), ("http://s/c/2", 2, "http://elsewhere/")]
    assert store.status()["states"] == {"queued": 0, "leased": 5, "done": 1, "error": 1, "robots": 0}


def test_counts_survive_reopen_and_match_the_rows(store_location):
    path = store_location
    with MasterStore(path) as s:
        s.push([(f"http://s/{i}", i % 3, 0, "ab"[i % 2], None) for i in range(300)])
        got = s.pop("a", 100, now=1.0)
        s.finish([fin(u) for u, _, _ in got[:40]] + [fin(u, "error") for u, _, _ in got[40:50]])
        s.release([u for u, _, _ in got[50:60]], to("b"))
        s.reroute(["b"], to(None))
        status = s.status()
    check_invariants(path).close()
    with MasterStore(path) as s:
        assert s.status() == status
        # b's 150 entries and the 10 released to b lost their node; a keeps its 50 unpopped.
        assert status["frontier"] == 210 and status["frontier_by_node"] == {"None": 160, "a": 50}
        assert s.frontier_size(None) == 160 and s.url_count() == 300


def test_a_failed_write_rolls_back_with_its_counters(store):
    store.push([("http://s/1", 0, 0, "a", None)])
    store.commit()
    with pytest.raises(RuntimeError), store.atomic():
        store.push([("http://s/2", 0, 0, "a", None)])
        raise RuntimeError("a failed write")
    assert store.frontier_size() == 1 and store.known(["http://s/2"]) == set()


def test_a_units_savepoint_journal_stays_in_memory_and_still_undoes_it(tmp_path):
    # The writer keeps temporary storage in memory, so that a report's savepoint journal is no file written page
    # by page (SqliteBackend.start_writing); a unit that fails is undone all the same, over many pages.
    with MasterStore(tmp_path / "m.db") as s:
        assert s.db.execute("PRAGMA temp_store").fetchone()[0] == 2
        s.push([(f"http://s/{i}", 0, 0, "a", None) for i in range(2000)])
        s.commit()
        with pytest.raises(RuntimeError), s.atomic():
            s.finish([fin(u) for u, _, _ in s.pop("a", 1500, now=1.0)])
            s.add_audio([{"url": f"http://s/{i}.mp3", "page": f"http://s/{i}", "status": "ok", "node": "a",
                          "found_at": 1.0} for i in range(1500)])
            raise RuntimeError("a failed report")
        assert s.frontier_size() == 2000 and s.status()["audio"] == {}
        assert s.db.execute("SELECT count(*) FROM audio").fetchone()[0] == 0


# -- refresh -------------------------------------------------------------------------------------------


def test_due_for_refresh_oldest_first_and_requeue_puts_them_back(store):
    store.push([(f"http://s/{i}", 1, 0, "a", None) for i in range(5)])
    store.pop("a", 5, now=0.0)
    store.finish([fin("http://s/0", at=30.0), fin("http://s/1", at=10.0), fin("http://s/2", at=90.0),
                  fin("http://s/3", "error", at=1.0)])
    due = due_for_refresh(store, now=100.0, older_than=60.0, limit=10)
    assert due == [("http://s/1", 1), ("http://s/0", 1)]
    assert due_for_refresh(store, now=100.0, older_than=60.0, limit=1) == [("http://s/1", 1)]
    assert store.requeue_refresh(due + [("http://s/4", 1)], to("b")) == 2       # s/4 is leased, not done
    # Back in line in the order asked: the oldest crawl first.
    assert store.pop("b", 5, now=101.0) == [("http://s/1", 1, None), ("http://s/0", 1, None)]
    assert due_for_refresh(store, now=100.0, older_than=60.0, limit=10) == []


# -- catalogue, figures, meta ------------------------------------------------------------------------


def audio(**kw):
    row = {"url": "http://cdn/a.mp3", "page": "http://s/p", "title": "T", "status": "ok", "resolver": "generic",
           "source_id": None, "sha256": None, "size": None, "extra": {}, "node": "a", "found_at": 5.0}
    row.update(kw)
    return row


def test_add_audio_is_unique_per_item_and_page_and_fills_gaps_later(store):
    assert store.add_audio([audio(), audio(title="other")]) == [True, False]
    assert store.add_audio([audio(page="http://s/q")]) == [True]
    assert store.add_audio([audio(sha256="ab" * 32, size=123)]) == [False]
    assert store.add_audio([audio(sha256="ab" * 32, size=123, title="later")]) == [False]   # filled already
    rows = list(store.catalogue())
    assert [(r["page"], r["sha256"], r["size"], r["title"], r["status"]) for r in rows] == [
        ("http://s/p", "ab" * 32, 123, "T", "ok"), ("http://s/q", None, None, "T", "ok")]
    assert [r["page"] for r in audio_by_sha(store, "ab" * 32)] == ["http://s/p"]


def test_a_live_streams_row_describes_its_latest_recording_however_the_report_came(store):
    # The page's report lists the stream first (no recording yet); each recording comes as a repeat.
    store.add_audio([audio(extra={"format": "hls"})])
    live = {"format": "hls", "live": True}
    store.add_audio([audio(sha256="ab" * 32, size=1, duration=20.0, extra={**live, "recorded_at": 100.0})])
    (row,) = store.catalogue()
    assert (row["duration"], row["extra"]["live"], row["extra"]["recorded_at"]) == (20.0, True, 100.0)
    store.add_audio([audio(sha256="cd" * 32, size=2, duration=21.5, extra={**live, "recorded_at": 200.0},
                           found_at=20.0)])
    (row,) = store.catalogue()
    # A new window is no change of the item: it is kept beside the first as the item's history.
    assert (row["sha256"], row["status"], row["duration"], row["extra"]["recorded_at"]) == (
        "cd" * 32, "ok", 21.5, 200.0)
    assert audio_history(store, row["url"]) == []
    assert [w["sha256"] for w in store.export_recordings()] == ["ab" * 32, "cd" * 32]


def test_new_bytes_at_the_same_address_are_a_change_and_the_old_ones_are_kept(store):
    store.add_audio([audio(sha256="ab" * 32, size=123, found_at=10.0)])
    assert store.add_audio([audio(sha256="cd" * 32, size=9, found_at=20.0)]) == [False]
    (row,) = store.catalogue()
    assert (row["sha256"], row["size"], row["status"], row["found_at"], row["changed_at"], row["last_seen"]) == (
        "cd" * 32, 9, "changed", 10.0, 20.0, 20.0)
    assert [(h["sha256"], h["size"], h["replaced_at"]) for h in audio_history(store, row["url"])] == [
        ("ab" * 32, 123, 20.0)]
    assert store.status()["audio"] == {"changed": 1}
    assert store.add_audio([audio(sha256="cd" * 32, size=9, found_at=30.0)]) == [False]   # the same bytes again
    (row,) = store.catalogue()
    assert (row["status"], row["changed_at"], row["last_seen"]) == ("changed", 20.0, 30.0)
    assert [(r["change"], r["url"]) for r in store.changes_since(15.0)] == [("changed", row["url"])]
    assert [r["change"] for r in store.changes_since(5.0)] == ["changed"]
    assert list(store.changes_since(25.0)) == []


def test_a_site_id_identifies_an_item_whose_links_expire(store):
    first = audio(url="", status="failed", reason="link expired", resolver="kugou", source_id="H1",
                  extra={"hash": "H1"})
    assert store.add_audio([first]) == [True]
    assert store.add_audio([audio(url="http://cdn/1?sig=2", resolver="kugou", source_id="H1")]) == [False]
    (row,) = store.catalogue()
    assert row["url"] == "http://cdn/1?sig=2" and row["status"] == "ok" and row["reason"] is None
    assert row["extra"] == {"hash": "H1"}
    assert store.add_audio([audio(url="http://cdn/1?sig=3", resolver="kugou", source_id="H1",
                                  status="failed")]) == [False]
    assert next(store.catalogue())["status"] == "ok"
    assert store.status()["audio"] == {"ok": 1}


def test_search_audio_matches_title_artist_or_urls_literally_newest_first(store, tmp_path):
    store.add_audio([audio(url="http://cdn/1.mp3", page="http://s/1", title="Blue Moon", artist="Ann"),
                     audio(url="http://cdn/2.mp3", page="http://s/2", title="100% Red", artist="Bo_b"),
                     audio(url="http://cdn/moon.mp3", page="http://s/3", title="Other", artist="Cy",
                           status="failed")])
    assert [r["title"] for r in store.search_audio("moon")] == ["Other", "Blue Moon"]
    assert [r["title"] for r in store.search_audio("%")] == ["100% Red"]       # a literal %, not a wildcard
    assert [r["artist"] for r in store.search_audio("o_b")] == ["Bo_b"]
    assert [r["title"] for r in store.search_audio("", limit=2)] == ["Other", "100% Red"]
    assert store.search_audio("nothing like it") == []
    # The store counts catalogue rows by status in memory; a reader counts them in the table: the same.
    store.commit()
    reader = MasterStore.open_readonly(store.path)
    assert reader.status()["audio"] == store.status()["audio"] == {"ok": 2, "failed": 1}
    reader.close()


def test_catalogue_text_with_nul_is_kept_without_it_on_either_store(store):
    assert store.add_audio([audio(url="http://cdn/n.mp3", page="http://s/n", title="a\x00b")]) == [True]
    assert [r["title"] for r in store.catalogue()] == ["ab"]


def test_discards_node_figures_and_meta_accumulate(store):
    store.count_discards({"depth": 2, "out_of_scope": 1})
    store.count_discards({"depth": 3, "too_long": 0})
    store.note_node("a", pages=1, bytes=10)
    store.note_node("a", bytes=5)
    store.set_meta("bloom_url_count", "12")
    store.set_meta("bloom_url_count", "13")
    store.set_meta("snapshot", {"m": 8, "k": 2})
    st = store.status()
    assert st["discards"] == {"out_of_scope": 1, "depth": 5}
    assert st["nodes"]["a"] == {"pages": 1, "bytes": 15}
    assert store.get_meta("bloom_url_count") == "13" and store.get_meta("snapshot") == {"m": 8, "k": 2}
    assert store.get_meta("missing") is None and store.get_meta("missing", 0) == 0


def test_iter_urls_returns_every_url_once_in_batches(store):
    urls = [f"http://s/{i}" for i in range(250)]
    store.push([(u, 0, 0, None, None) for u in urls])
    batches = list(store.iter_urls(batch=100))
    assert [len(b) for b in batches] == [100, 100, 50]
    assert sorted(u for b in batches for u in b) == sorted(urls)


# -- opening -------------------------------------------------------------------------------------------


def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path):
    bad = tmp_path / "m.db"
    bad.write_bytes(b"this is not sqlite at all\n" * 100)
    with pytest.raises(StoreError, match="not a crawl database"):
        MasterStore(bad)
    with pytest.raises(StoreError, match="not a crawl database"):
        MasterStore.open_readonly(bad)
    assert bad.read_bytes() == b"this is not sqlite at all\n" * 100


def test_another_sqlite_database_or_a_newer_schema_is_refused(tmp_path):
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE photos (id INTEGER)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="not a crawl database"):
        MasterStore(other)
    ours = tmp_path / "m.db"
    MasterStore(ours).close()
    db = sqlite3.connect(ours)
    db.execute("PRAGMA user_version = 99")
    db.close()
    with pytest.raises(StoreError, match="newer"):
        MasterStore(ours)


def test_a_second_writer_is_refused_while_the_first_is_open(store_location):
    first = MasterStore(store_location)
    with pytest.raises(StoreError, match="in use"):
        MasterStore(store_location)
    first.close()
    MasterStore(store_location).close()


READONLY_WRITER = textwrap.dedent("""
    import sys
    from crawler.master.store import MasterStore
    s = MasterStore(sys.argv[1])
    i = 0
    while True:
        s.push([(f"http://s/{i}-{j}", 0, 0, "a", None) for j in range(100)])
        got = s.pop("a", 60, 1.0)
        s.commit()
        if i == 5:
            print("going", flush=True)
        i += 1
        if sys.stdin.closed:
            break
""")


def test_a_reader_in_this_process_sees_consistent_commits_of_a_writer_in_another(store_location):
    path = store_location
    writer = subprocess.Popen([sys.executable, "-c", READONLY_WRITER, str(path)], stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline() == b"going\n"
        reader = MasterStore.open_readonly(path)
        seen = [0]
        while seen[-1] < 2000:           # until twenty more commits went by under our eyes
            assert writer.poll() is None
            st = reader.status()
            # Each snapshot is one commit: whole batches of 100 pushed, 60 popped per batch.
            total = sum(st["states"].values())
            assert total % 100 == 0 and st["states"]["leased"] == 60 * total // 100
            seen.append(total)
        assert seen == sorted(seen)
        with pytest.raises(ReadOnlyStoreError):
            reader.push([("http://s/x", 0, 0, "a", None)])
        with pytest.raises(sqlite3.OperationalError):        # what callers written against sqlite catch
            reader.set_meta("k", 1)
        reader.close()
    finally:
        writer.kill()
        writer.wait()


# -- crash consistency -----------------------------------------------------------------------------------

CRASH_WRITER = textwrap.dedent("""
    import json, random, sys
    from crawler.master.store import PageOutcome, MasterStore
    path, seed = sys.argv[1], int(sys.argv[2])
    rnd = random.Random(seed)
    nodes = ["a", "b", "c", None]
    route = lambda urls: [rnd.choice(nodes) for _ in urls]
    s = MasterStore(path, max_attempts=2)
    s.requeue_leased(route)
    leased, settled, requeued = set(), [], []
    n = s.url_count()
    commits = 0
    print(json.dumps({"start": n}), flush=True)
    while True:
        op = rnd.random()
        if op < 0.35:
            rows = [(f"http://h{rnd.randrange(20)}.test/{seed}/{n + j}", rnd.randrange(4), rnd.randrange(3),
                     rnd.choice(nodes), None) for j in range(rnd.randrange(1, 300))]
            n += s.push(rows + rows[:5])
        elif op < 0.55:
            node = rnd.choice(nodes[:3])
            leased.update(u for u, _, _ in s.pop(node, rnd.randrange(1, 80), 1.0))
        elif op < 0.75 and leased:
            pick = rnd.sample(sorted(leased), min(len(leased), rnd.randrange(1, 40)))
            res = [PageOutcome(u, rnd.choice(["done", "done", "error", "retry"]), 200, None, None, 1, None,
                            url_info(s, u)["node"] or "a", 50.0) for u in pick]
            for r, ok in zip(res, s.finish(res + res[:3])):
                leased.discard(r.url)
                if ok and url_info(s, r.url)["state"] in ("done", "error"):
                    settled.append(r.url)
        elif op < 0.82 and leased:
            pick = rnd.sample(sorted(leased), min(len(leased), rnd.randrange(1, 20)))
            s.release(pick, route)
            leased.difference_update(pick)
        elif op < 0.87:
            s.reroute([rnd.choice(nodes)], route)
        elif op < 0.9:
            due = due_for_refresh(s, 100.0, 10.0, 30)
            s.requeue_refresh(due, route)
            requeued.extend(u for u, _ in due)
        else:
            s.count_discards({"depth": 1})
            s.commit()
            commits += 1
            print(json.dumps({"commit": commits, "urls": n, "settled": settled, "requeued": requeued}),
                  flush=True)
            settled, requeued = [], []
""")


def test_sigkill_at_any_instant_leaves_a_consistent_store_that_loses_no_commit(store_location):
    path = store_location
    state: dict[str, str] = {}          # what committed transactions say about settled pages
    for round_ in range(6):
        kill_after = 2 + 3 * round_
        proc = subprocess.Popen([sys.executable, "-c", CRASH_WRITER, str(path), str(round_)],
                                stdout=subprocess.PIPE, text=True)
        committed_urls = json.loads(proc.stdout.readline())["start"]
        for line in proc.stdout:
            msg = json.loads(line)
            committed_urls = msg["urls"]
            for u in msg["settled"]:
                state[u] = "settled"
            for u in msg["requeued"]:
                state[u] = "requeued"
            if msg["commit"] >= kill_after:
                break
        # Killed while it is already inside its next transaction.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        db = check_invariants(path)
        assert db.execute("SELECT count(*) FROM urls").fetchone()[0] >= committed_urls
        settled = [u for u, s in state.items() if s == "settled"]
        rows = dict(db.execute(f"SELECT url, state FROM urls WHERE url IN ({','.join('?' * len(settled))})",
                               settled)) if settled else {}
        assert all(rows.get(u) in (2, 3) for u in settled)
        in_flight = db.execute("SELECT count(*) FROM urls WHERE state = 1").fetchone()[0]
        db.close()
        # A restart hands out again exactly the leases in flight at the kill, nothing already settled.
        with MasterStore(path) as s:
            assert s.requeue_leased(to("a")) == in_flight
            assert s.status()["states"]["leased"] == 0
        check_invariants(path).close()


def test_a_search_cut_off_by_its_time_limit_is_a_store_error_whenever_it_is_cut(tmp_path):
    # SQLite may cut a query off when it starts (nothing matches: the whole scan runs there) or while its rows are
    # fetched (the first ones came at once): either way it is our StoreError, not sqlite3's.
    with MasterStore(tmp_path / "m.db") as s:
        s.add_audio([{"url": f"http://a/{i}.mp3", "page": f"http://p/{i}", "title": "song", "found_at": 1.0,
                      "node": "n"} for i in range(20_000)])
    reader = MasterStore.open_readonly(tmp_path / "m.db")
    try:
        reader.limit_time(0)
        for query, limit in (("no such text", 10), ("song", 20_000)):
            with pytest.raises(StoreError, match="interrupt"):
                reader.search_audio(query, limit)
    finally:
        reader.close()
