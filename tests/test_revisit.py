"""Revisits and the catalogue's history: the adaptive interval, what counts as changed or gone, and how the store
records a revisit (validators, next visit, items confirmed, removed or gone), finds due pages and counts cycles."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crawler.config import ConfigError
from crawler.master.config import MasterConfig
from crawler.master.revisit import RevisitPolicy, changed, gone, revisit_policy
from crawler.master.store import MasterStore, PageOutcome, page_keys
from scripts.cluster import write_secret

POLICY = RevisitPolicy(base=100.0, min=30.0, max=400.0)
PAGE = "http://s/p"


def to(node):
    return lambda urls: [node] * len(urls)


def visit(url=PAGE, status=200, at=1000.0, digest=1, etag=None, last_modified=None, keys=frozenset()):
    return PageOutcome(url, "done", status, url, "text/html", 10, None, "a", at, etag, last_modified, digest, keys)


def item(name, page=PAGE, at=1000.0, sha="aa", **kw):
    return {"url": f"http://cdn/{name}.mp3", "page": page, "status": "ok", "resolver": "generic", "sha256": sha * 32,
            "size": 10, "node": "a", "found_at": at, **kw}


def keys(*names, page=PAGE):
    return page_keys(page, [item(n, page) for n in names])


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
    v = store.page_visit(PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["next_visit"], v["gone_at"]) == ('"e1"', 7, 100.0, 1100.0, None)
    assert store.requeue_due(1099.0, to("b")) == []
    assert store.requeue_due(1130.0, to("b")) == [30.0]       # 30 s late
    # Handed out with its validators, for a conditional fetch.
    assert store.pop("b", 5, 1130.0, validators=True) == [
        (PAGE, 1, None, ('"e1"', "Tue, 01 Dec 2026 00:00:00 GMT"))]
    store.finish([visit(status=304, at=1200.0, digest=None)], POLICY)     # unchanged: waits longer
    v = store.page_visit(PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["next_visit"]) == ('"e1"', 7, 150.0, 1350.0)
    store.requeue_due(1400.0, to("b"))
    store.pop("b", 5, 1400.0)
    store.finish([visit(at=1400.0, digest=8)], POLICY)                     # changed, and no validators now
    v = store.page_visit(PAGE)
    assert (v["etag"], v["digest"], v["interval"], v["changed_at"]) == (None, 8, 100.0, 1400.0)
    store.requeue_due(2000.0, to("b"))
    assert store.pop("b", 5, 2000.0, validators=True) == [(PAGE, 1, None, None)]


def test_without_refresh_a_page_gets_no_visit_record(store):
    lease(store)
    store.finish([visit()])
    assert store.page_visit(PAGE) is None and store.requeue_due(1e12, to("a")) == []
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
    lease(store)
    store.finish([visit(keys=keys("x", "y"))], POLICY)
    assert store.add_audio([item("x"), item("y")]) == [True, True]
    # A revisit that no longer shows y: y is removed, x is seen.
    store.requeue_due(2000.0, to("a"))
    lease(store)
    store.finish([visit(at=2000.0, digest=2, keys=keys("x", "z"))], POLICY)
    assert store.add_audio([item("x", at=2000.0), item("z", at=2000.0)]) == [False, True]
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
    assert store.page_visit(PAGE)["gone_at"] == 4000.0
    assert store.status()["audio"] == {"removed": 3}
    assert [(r["url"][11:12], r["change"]) for r in store.changes_since(1500.0)] == [
        ("y", "removed"), ("x", "removed"), ("z", "removed")]
    # Back on its page: it appeared again.
    store.requeue_due(5000.0, to("a"))
    lease(store)
    store.finish([visit(at=5000.0, digest=9, keys=keys("x"))], POLICY)
    store.add_audio([item("x", at=5000.0)])
    assert store.page_visit(PAGE)["gone_at"] is None
    assert {r["url"][11:12]: r["status"] for r in store.catalogue()} == {"x": "ok", "y": "removed", "z": "removed"}
    assert store.status()["audio"] == {"ok": 1, "removed": 2}


def test_audio_found_by_its_own_address_is_not_removed_by_the_page_that_links_it(store):
    lease(store)
    store.finish([visit(keys=frozenset())], POLICY)
    store.add_audio([item("r", extra={"found_in": "response"})])
    store.requeue_due(2000.0, to("a"))
    lease(store)
    store.finish([visit(at=2000.0, keys=frozenset())], POLICY)
    assert [r["status"] for r in store.catalogue()] == ["ok"]


def test_cycles_count_new_changed_and_removed(store_location):
    s = MasterStore(store_location)
    assert not s.roll_cycle(0.0, 60.0)
    s.add_audio([item("a", at=1.0), item("b", at=1.0)])
    s.add_audio([item("a", at=2.0, sha="bb")])
    assert s.status()["changes"]["this_cycle"] == {"start": 0.0, "new": 2, "changed": 1, "removed": 0}
    assert not s.roll_cycle(59.0, 60.0) and s.roll_cycle(61.0, 60.0)
    s.commit()
    st = s.status()["changes"]
    assert st["last_cycle"] == {"start": 0.0, "end": 61.0, "new": 2, "changed": 1, "removed": 0}
    assert st["this_cycle"] == {"start": 61.0, "new": 0, "changed": 0, "removed": 0}
    s.close()
    reader = MasterStore.open_readonly(store_location)
    assert reader.status()["changes"]["last_cycle"]["changed"] == 1
    reader.close()


def test_an_older_store_gains_the_revisit_columns_and_its_done_pages_are_due(store_location):
    # Pages fetched while refresh was off have no next visit; a catalogue from before the history columns lacks
    # them. (A store of the previous URL layout goes through `crawler-master upgrade-store` first.)
    s = MasterStore(store_location)
    s.push([(PAGE, 1, 0, "a", None)])
    s.pop("a", 1, 0.0)
    s.finish([visit(at=50.0)])
    s.db.execute("DROP INDEX audio_changes")
    s.db.execute("ALTER TABLE audio DROP COLUMN removed_at")
    s.close()
    s = MasterStore(store_location)
    assert s.schedule_unscheduled(True) == 1
    assert s.requeue_due(60.0, to("a")) == [10.0]
    assert s.add_audio([item("x")]) == [True]
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
