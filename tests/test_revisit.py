"""Revisits and the catalogue's history: the adaptive interval, what counts as changed or gone, and how the store
records a revisit (validators, next visit, items confirmed, removed or gone), finds due pages and counts cycles."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crawler.config import ConfigError
from crawler.master.config import MasterConfig
from crawler.master.revisit import RevisitPolicy, changed, gone, revisit_policy
from crawler.master.store import MasterStore, PageOutcome, listed_keys
from testkit.cluster import write_secret
from tests.store_reads import page_visit

POLICY = RevisitPolicy(base=100.0, min=30.0, max=400.0)
PAGE = "http://s/p"


def to(node):
    return lambda urls: [node] * len(urls)


def visit(url=PAGE, status=200, at=1000.0, digest=1, etag=None, last_modified=None, keys=frozenset(), error=None):
    return PageOutcome(url, "done", status, url, "text/html", 10, error, "a", at, etag, last_modified, digest, keys)


def item(name, page=PAGE, at=1000.0, sha="aa", **kw):
    return {"url": f"http://cdn/{name}.mp3", "page": page, "status": "ok", "resolver": "generic", "sha256": sha * 32,
            "size": 10, "node": "a", "found_at": at, **kw}


def keys(*names, page=PAGE):
    return listed_keys([item(n, page) for n in names])


@pytest.fixture
def store(store_location):
    s = MasterStore(store_location)
    s.push([(PAGE, 1, 0, "a", None)])
    yield s
    s.close()


def lease(store, url=PAGE):
    assert [r[0] for r in store.pop("a", 10, 0.0)] == [url]


def test_the_interval_shrinks_on_change_and_grows_when_unchanged_within_bounds():
    assert POLICY.interval(None, False, False) == 100.0
    assert POLICY.interval(100.0, True, False) == pytest.approx(66.67, abs=0.01)
    assert POLICY.interval(40.0, True, False) == 30.0                      # not below refresh_min
    assert POLICY.interval(100.0, False, False) == 150.0
    assert POLICY.interval(300.0, False, False) == 400.0                   # not above refresh_max
    hub = RevisitPolicy(100.0, 30.0, 400.0, hub=50.0)
    assert hub.interval(400.0, False, True) == 50.0 and hub.interval(100.0, False, False) == 150.0


def test_changed_and_gone():
    assert not changed(304, None, 200, 5)
    assert changed(200, 6, 200, 5) and not changed(200, 5, 200, 5)
    assert changed(404, None, 200, 5) and not changed(404, None, 404, None)
    assert changed(200, 5, 404, None)              # back from the dead: no digest to compare with
    assert gone(404) and gone(410) and gone(301) and not gone(304) and not gone(200) and not gone(None)


def test_a_policy_from_the_config_and_its_one_line_errors(tmp_path):
    base = {"listen": "127.0.0.1:0", "data_dir": "d", "secret_file": str(write_secret(tmp_path / "s")),
            "nodes": ["a"], "seeds": ["http://x/"]}
    cfg = MasterConfig.from_mapping({**base, "crawl": {"refresh_interval": 60}}, tmp_path)
    assert revisit_policy(cfg.crawl) == RevisitPolicy(60.0, 15.0, 240.0, None)
    assert revisit_policy(MasterConfig.from_mapping(base, tmp_path).crawl) is None
    for crawl, msg in (({"refresh_min": 5}, "crawl.refresh_min: needs crawl.refresh_interval"),
                       ({"refresh_interval": 60, "refresh_min": 90}, "crawl.refresh_min: must not be above"),
                       ({"refresh_interval": 60, "refresh_max": 30}, "crawl.refresh_max: must not be below"),
                       ({"refresh_interval": 60, "refresh_hub_interval": 0}, "crawl.refresh_hub_interval")):
        with pytest.raises(ConfigError, match=msg):
            MasterConfig.from_mapping({**base, "crawl": crawl}, tmp_path)


def test_a_revisit_records_validators_and_when_to_come_back(store):
    lease(store)
    store.finish([visit(etag='"e1"', last_modified="Tue, 01 Dec 2026 00:00:00 GMT", digest=7)], POLICY)
    v = page_visit(store, PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["next_visit"], v["gone_at"]) == ('"e1"', 7, 100.0, 1100.0, None)
    assert store.requeue_due(1099.0, to("b")) == []
    assert store.requeue_due(1130.0, to("b")) == [30.0]       # 30 s late
    # Handed out with its validators, for a conditional fetch.
    assert store.pop("b", 5, 1130.0, validators=True) == [
        (PAGE, 1, None, ('"e1"', "Tue, 01 Dec 2026 00:00:00 GMT"))]
    store.finish([visit(status=304, at=1200.0, digest=None)], POLICY)     # unchanged: waits longer
    v = page_visit(store, PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["next_visit"]) == ('"e1"', 7, 150.0, 1350.0)
    store.requeue_due(1400.0, to("b"))
    store.pop("b", 5, 1400.0)
    store.finish([visit(at=1400.0, digest=8)], POLICY)                     # changed, and no validators now
    v = page_visit(store, PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["changed_at"]) == (None, 8, 100.0, 1400.0)
    store.requeue_due(2000.0, to("b"))
    assert store.pop("b", 5, 2000.0, validators=True) == [(PAGE, 1, None, None)]


def test_without_refresh_a_page_gets_no_visit_record(store):
    lease(store)
    store.finish([visit()])
    assert page_visit(store, PAGE) is None and store.requeue_due(1e12, to("a")) == []
    assert store.schedule_unscheduled(False) == 0
    assert store.schedule_unscheduled(True) == 1              # refresh switched on later: due from its last crawl
    assert store.schedule_unscheduled(True) == 0              # once
    assert store.requeue_due(1000.0, to("a")) == [0.0]


def test_the_due_scan_goes_in_batches_most_overdue_first_with_no_cap(store_location):
    s = MasterStore(store_location)
    urls = [f"http://s/{i}" for i in range(5000)]
    s.push([(u, 1, 0, "a", None) for u in urls])
    s.pop("a", 5000, 0.0)
    s.finish([visit(u, at=float(i)) for i, u in enumerate(urls)], POLICY)
    lags: list[float] = []
    while batch := s.requeue_due(10_000.0, to("a"), limit=700):
        lags += batch
    assert len(lags) == 5000 and lags == sorted(lags, reverse=True) and lags[0] == 10_000.0 - 100.0
    assert s.frontier_size() == 5000
    s.close()


def test_the_catalogue_follows_its_pages(store):
    # As the master records a report: the rows first, then the visit that lists them.
    lease(store)
    assert store.add_audio([item("x"), item("y")]) == [True, True]
    store.finish([visit(keys=keys("x", "y"))], POLICY)
    # A revisit that no longer shows y: y is removed, x is seen.
    store.requeue_due(2000.0, to("a"))
    lease(store)
    assert store.add_audio([item("x", at=2000.0), item("z", at=2000.0)]) == [False, True]
    store.finish([visit(at=2000.0, digest=2, keys=keys("x", "z"))], POLICY)
    rows = {r["url"][11:12]: r for r in store.catalogue()}
    assert (rows["y"]["status"], rows["y"]["removed_at"], rows["y"]["last_seen"]) == ("removed", 2000.0, 1000.0)
    assert (rows["x"]["status"], rows["x"]["last_seen"], rows["x"]["found_at"]) == ("ok", 2000.0, 1000.0)
    # A 304: everything on it is confirmed seen; nothing is removed.
    store.requeue_due(3000.0, to("a"))
    lease(store)
    store.finish([visit(status=304, at=3000.0, digest=None, keys=frozenset())], POLICY)
    rows = {r["url"][11:12]: r for r in store.catalogue()}
    assert rows["x"]["last_seen"] == rows["z"]["last_seen"] == 3000.0 and rows["y"]["last_seen"] == 1000.0
    # The page is gone: all of its items are removed, and the page records when it went.
    store.requeue_due(4000.0, to("a"))
    lease(store)
    store.finish([visit(status=404, at=4000.0, digest=None)], POLICY)
    assert {r["status"] for r in store.catalogue()} == {"removed"}
    assert page_visit(store, PAGE)["gone_at"] == 4000.0
    assert store.status()["audio"] == {"removed": 3}
    assert [(r["url"][11:12], r["change"]) for r in store.changes_since(1500.0)] == [
        ("y", "removed"), ("x", "removed"), ("z", "removed")]
    # Back on its page: it appeared again.
    store.requeue_due(5000.0, to("a"))
    lease(store)
    store.add_audio([item("x", at=5000.0)])
    store.finish([visit(at=5000.0, digest=9, keys=keys("x"))], POLICY)
    assert page_visit(store, PAGE)["gone_at"] is None
    assert {r["url"][11:12]: r["status"] for r in store.catalogue()} == {"x": "ok", "y": "removed", "z": "removed"}
    assert store.status()["audio"] == {"ok": 1, "removed": 2}
    # An export of the changes since it went says it is there again.
    back = [(r["url"][11:12], r["change"], r["status"], r["returned_at"], r["removed_at"])
            for r in store.changes_since(4500.0)]
    assert back == [("x", "new", "ok", 5000.0, None)]
    assert [r["change"] for r in store.changes_since(5000.5)] == []
    # New bytes later: the latest event is the change.
    store.add_audio([item("x", at=6000.0, sha="cc")])
    assert [(r["change"], r["returned_at"]) for r in store.changes_since(5500.0)] == [("changed", None)]


def test_audio_found_by_its_own_address_is_not_removed_by_the_page_that_links_it(store):
    lease(store)
    store.finish([visit(keys=frozenset())], POLICY)
    store.add_audio([item("r", extra={"found_in": "response"})])
    store.requeue_due(2000.0, to("a"))
    lease(store)
    store.finish([visit(at=2000.0, keys=frozenset())], POLICY)
    assert [r["status"] for r in store.catalogue()] == ["ok"]


def test_cycles_count_new_changed_and_removed_from_the_first_revisit_on(store_location):
    s = MasterStore(store_location)
    assert not s.roll_cycle(0.0, 60.0)
    # The first cycle is the crawl's first visit: what it finds is not "new". It ends when pages come due again.
    s.add_audio([item("a", at=1.0), item("b", at=1.0)])
    assert s.status()["changes"]["this_cycle"] == {"start": 0.0, "first": True, "due": 0, "new": 0, "changed": 0,
                                                   "removed": 0}
    assert not s.roll_cycle(500.0, 60.0)
    # Pages come due again while a URL in line was never fetched: the first visit goes on (looked at again a
    # cycle's length later).
    s.push([("http://s/new", 1, 0, "a", None)])
    assert not s.roll_cycle(501.0, 60.0, due=2) and not s.roll_cycle(502.0, 60.0)
    s.pop("a", 1, 502.0)
    s.finish([visit("http://s/new", at=503.0)])
    assert not s.roll_cycle(560.0, 60.0) and s.roll_cycle(561.0, 60.0)
    assert s.get_meta("last_cycle") == {"start": 0.0, "end": 561.0, "first": True, "due": 2, "new": 0, "changed": 0,
                                        "removed": 0}
    assert not s.roll_cycle(561.0, 60.0)
    s.add_audio([item("a", at=562.0, sha="bb"), item("c", at=562.0)])
    assert not s.roll_cycle(580.0, 60.0, due=3)
    assert s.status()["changes"]["this_cycle"] == {"start": 561.0, "first": False, "due": 3, "new": 1, "changed": 1,
                                                   "removed": 0}
    assert not s.roll_cycle(620.0, 60.0) and s.roll_cycle(621.0, 60.0, due=4)
    s.commit()
    st = s.status()["changes"]
    assert st["last_cycle"] == {"start": 561.0, "end": 621.0, "first": False, "due": 3, "new": 1, "changed": 1,
                                "removed": 0}
    assert st["this_cycle"] == {"start": 621.0, "first": False, "due": 4, "new": 0, "changed": 0, "removed": 0}
    s.close()
    reader = MasterStore.open_readonly(store_location)
    assert reader.status()["changes"]["last_cycle"]["changed"] == 1
    reader.close()


def test_refresh_switched_on_for_a_crawl_already_made_has_no_first_cycle(store_location):
    s = MasterStore(store_location)
    assert not s.roll_cycle(0.0, 60.0, due=7)
    s.add_audio([item("a", at=1.0)])
    assert s.status()["changes"]["this_cycle"]["new"] == 1
    s.close()


def test_an_older_store_gains_the_revisit_columns_and_its_done_pages_are_due(store_location):
    # Pages fetched while refresh was off have no next visit; a catalogue from before the history columns lacks
    # them. (A store of the previous URL layout goes through `crawler-master upgrade-store` first.)
    s = MasterStore(store_location)
    s.push([(PAGE, 1, 0, "a", None)])
    s.pop("a", 1, 0.0)
    s.finish([visit(at=50.0)])
    s.db.execute("DROP INDEX audio_events")
    s.db.execute("ALTER TABLE audio DROP COLUMN returned_at")
    s.db.execute("ALTER TABLE audio DROP COLUMN removed_at")
    s.db.execute("CREATE INDEX audio_changes ON audio((coalesce(changed_at, found_at)), id)")   # the one it had
    s.close()
    s = MasterStore(store_location)
    assert s.schedule_unscheduled(True) == 1
    assert s.requeue_due(60.0, to("a")) == [10.0]
    assert s.add_audio([item("x")]) == [True]
    assert [r["change"] for r in s.changes_since(0.0)] == ["new"]
    s.close()


def test_export_changes_since_refuses_a_bad_time_in_one_line(tmp_path):
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"listen: 127.0.0.1:0\ndata_dir: state\nsecret_file: {write_secret(tmp_path / 's')}\n"
                   "nodes: [a]\nseeds: ['http://127.0.0.1:9/']\n")
    for args, words in ((["--changes-since", "yesterday"], "--changes-since: 'yesterday' is not an ISO-8601"),
                        (["--changes-since", "0", "--failed"], "does not go with --failed")):
        r = subprocess.run([sys.executable, "-m", "crawler.master", "export", "--config", str(cfg), *args],
                           capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr


PLAYLIST = "http://s/list.m3u"


def playlist_store(store_location):
    """A page linking a playlist, both fetched: the songs name the page, and the playlist's own task lists them."""
    s = MasterStore(store_location)
    s.push([(PAGE, 1, 0, "a", None), (PLAYLIST, 2, 0, "a", PAGE)])
    s.pop("a", 10, 0.0)
    s.finish([visit(keys=frozenset())], POLICY)
    songs = [item(n, extra={"found_in": "playlist", "playlist": PLAYLIST}) for n in ("x", "y")]
    assert s.add_audio(songs) == [True, True]
    s.finish([visit(PLAYLIST, keys=keys("x", "y"))], POLICY)
    return s


def revisit(s, url, at, **kw):
    assert s.requeue_refresh([(url, 1)], to("b")) == 1
    assert [r[0] for r in s.pop("b", 10, at)] == [url]
    rows = kw.pop("rows", [])
    if rows:
        s.add_audio(rows)
    s.finish([visit(url, at=at, **kw)], POLICY)


def statuses(s):
    return {r["url"][11:12]: r["status"] for r in s.catalogue()}


def test_a_revisit_of_a_page_takes_nothing_from_the_songs_its_playlist_lists(store_location):
    s = playlist_store(store_location)
    # The page again, on another node and with nothing of its own: its playlist's songs stay.
    revisit(s, PAGE, 2000.0, digest=2, keys=frozenset())
    assert statuses(s) == {"x": "ok", "y": "ok"} and s.status()["changes"]["this_cycle"].get("removed", 0) == 0
    # The playlist answers 304: its songs are seen then (they name the page, not the playlist).
    revisit(s, PLAYLIST, 3000.0, status=304, digest=None)
    assert {r["url"][11:12]: r["last_seen"] for r in s.catalogue()} == {"x": 3000.0, "y": 3000.0}
    # The playlist without y: y goes, x stays; then the playlist is gone: x goes too.
    revisit(s, PLAYLIST, 4000.0, digest=3, keys=keys("x"), rows=[item("x", at=4000.0)])
    assert statuses(s) == {"x": "ok", "y": "removed"}
    revisit(s, PLAYLIST, 5000.0, status=404, digest=None)
    assert statuses(s) == {"x": "removed", "y": "removed"}
    assert [(r["url"][11:12], r["change"]) for r in s.changes_since(4000.0)] == [("y", "removed"), ("x", "removed")]
    s.close()


def test_an_item_two_urls_list_is_removed_only_when_neither_does(store_location):
    s = playlist_store(store_location)
    # The page links x itself too (the same row: the same address on the same page).
    revisit(s, PAGE, 2000.0, digest=2, keys=keys("x"), rows=[item("x", at=2000.0)])
    revisit(s, PLAYLIST, 3000.0, digest=3, keys=keys("y"), rows=[item("y", at=3000.0)])
    assert statuses(s) == {"x": "ok", "y": "ok"}
    # A visit whose resolver failed may have missed items: it takes none off the page.
    revisit(s, PAGE, 4000.0, digest=4, keys=frozenset(), error="resolver generic: ValueError")
    assert statuses(s) == {"x": "ok", "y": "ok"}
    revisit(s, PAGE, 5000.0, digest=5, keys=frozenset())
    assert statuses(s) == {"x": "removed", "y": "ok"} and s.status()["audio"] == {"ok": 1, "removed": 1}
    s.close()


def test_a_store_from_before_references_gets_them_from_its_catalogue(store_location):
    s = playlist_store(store_location)
    s.push([("http://cdn/r.mp3", 2, 0, "a", PAGE)])                  # audio at an address of its own
    s.add_audio([item("r", extra={"found_in": "response"})])
    s.db.execute("DROP TABLE audio_refs")
    s.close()
    s = MasterStore(store_location)
    made = dict(s.db.execute("SELECT audio_id, referrer FROM audio_refs").fetchall())
    ids = {r[1][11:12]: r[0] for r in s.db.execute("SELECT id, url FROM audio")}
    assert made[ids["x"]] == made[ids["y"]] != made[ids["r"]]
    revisit(s, PAGE, 2000.0, digest=2, keys=frozenset())
    assert set(statuses(s).values()) == {"ok"}
    revisit(s, PLAYLIST, 3000.0, digest=3, keys=frozenset())
    assert statuses(s)["x"] == statuses(s)["y"] == "removed"
    s.close()


def test_a_download_that_ends_after_its_item_was_removed_does_not_bring_it_back(store):
    lease(store)
    pending = {**item("x"), "status": "pending", "sha256": None}
    store.add_audio([pending])
    store.finish([visit(keys=keys("x"))], POLICY)
    revisit(store, PAGE, 2000.0, digest=2, keys=frozenset())          # the page no longer lists it
    assert statuses(store) == {"x": "removed"}
    assert store.settle_audio([(pending, item("x", at=2100.0, sha="bb"))]) == [None]
    assert statuses(store) == {"x": "removed"} and store.status()["audio"] == {"removed": 1}
