"""Downloads reported apart from their pages, in the master: the store's pending rows (SQLite and PostgreSQL) and the
crawl state's rules (settling, handing a dead node's downloads on, the crawl not done while any is pending). No
sockets: a real store, a simulated clock."""

import json

from crawler import protocol as p
from crawler.items import FAILED, OK, PENDING, AudioItem, RequestIdentity
from crawler.master.crawl import Crawl
from crawler.master.store import MasterStore
from crawler.scheduler import NodeTable
from tests.test_crawl_state import SITE, make

SONG = SITE + "/song/1.html"


def _item(i: int = 1, **kw) -> AudioItem:
    return AudioItem(url=f"{SITE}/media/{i}.mp3", page=SONG, title=f"Song {i}", status=PENDING, **kw)


def _row(item: AudioItem, node: str, at: float) -> dict:
    return {**item.catalogue_row(), "node": node, "found_at": at}


def test_the_store_keeps_pending_downloads_with_their_holder_and_settles_their_rows(store_location):
    ident = RequestIdentity(user_agent="UA", cookies=(("sid", "1"),))
    items = [_item(1, identity=ident), _item(2)]
    with MasterStore(store_location) as store:
        store.add_audio([_row(a, "w1", 1.0) for a in items])
        store.add_pending([(a.page, a.url, "w1", json.dumps(a.to_wire()), 1.0) for a in items])
        store.commit()
    # Durable: another opening sees them, with their holder and the client identity a download needs.
    with MasterStore(store_location) as store:
        assert store.pending_count() == 2 and store.pending_nodes() == ["w1"]
        (first, _) = store.pending_of(["w1"])
        assert AudioItem.from_wire(json.loads(first[3])).identity == ident
        assert store.status()["audio"] == {"pending": 2} and store.status()["downloads_pending"] == 2
        # Pending rows are not in the catalogue file's view until they end; the export shows them.
        assert list(store.catalogue(settled=True)) == [] and len(list(store.catalogue())) == 2
        store.move_pending([(None, SONG, items[1].url)])
        assert [r[1] for r in store.pending_of(["w1"])] == [items[0].url]
        assert [r[1] for r in store.pending_of([], unheld=True)] == [items[1].url]
        ok = items[0].replace(status=OK, sha256="ab" * 32, size=10, path="audio/ab/x.mp3", codec="mp3")
        failed = items[1].replace(status=FAILED, reason="HTTP 404")
        rows = store.settle_audio([(_row(items[0], "w1", 1.0), _row(ok, "w2", 5.0)),
                                   (_row(items[1], "w1", 1.0), _row(failed, "w1", 5.0))])
        store.drop_pending([(SONG, a.url) for a in items])
        store.commit()
        assert [r["status"] for r in rows if r] == ["ok", "failed"]
        assert rows[0]["node"] == "w2" and rows[0]["sha256"] == "ab" * 32 and rows[0]["found_at"] == 1.0
        assert rows[1]["reason"] == "HTTP 404"
        assert store.status()["audio"] == {"ok": 1, "failed": 1} and store.pending_count() == 0
        # A row settled already (its page visited again meanwhile) takes a later outcome as a repeat report.
        assert store.settle_audio([(_row(items[1], "w1", 1.0), _row(ok.replace(url=items[1].url), "w1", 9.0))]) \
            == [None]
        assert store.status()["audio"] == {"ok": 2}


def _lease_song(c, node):
    """The song page leased to node (its home page reported first)."""
    for t in c.take(node, 5, 0.0):
        c.complete(node, (p.Result(t.lease, t.url, p.DONE, 200, t.url, "text/html", 10, None, (SONG,)),), 0.5)
    (task,) = c.take(node, 5, 1.0)
    assert task.url == SONG
    return task


def test_a_page_completes_at_once_and_its_download_settles_on_its_own(tmp_path):
    c = make(tmp_path, nodes=("a",))
    c.node_up("a")
    task = _lease_song(c, "a")
    rows = c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=(_item(1), _item(2))),), 2.0)
    assert [r["status"] for r in rows] == [PENDING, PENDING]
    assert c.in_flight() == 0                       # the lease is done: nothing waits for the downloads ...
    assert not c.done() and c.store.pending_count() == 2   # ... but the crawl is not over
    done = _item(1).replace(status=OK, sha256="cd" * 32, size=5, path="audio/cd/y.mp3")
    assert c.settle("b", ((done.url, done),), 3.0) == []   # not the holder: dropped
    assert c.totals.stale_downloads == 1
    (row,) = c.settle("a", ((done.url, done),), 3.0)
    assert row["status"] == OK and row["sha256"] == "cd" * 32
    failed = _item(2).replace(status=FAILED, reason="timeout")
    (row,) = c.settle("a", ((failed.url, failed),), 3.5)
    assert row["status"] == FAILED and row["reason"] == "timeout"
    assert c.store.pending_count() == 0 and c.done()


def test_a_dead_nodes_pending_downloads_go_to_a_live_node_and_a_returning_node_keeps_its_own(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    task = _lease_song(c, "a")
    items = tuple(_item(i) for i in range(6))
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=items),), 2.0)
    c.node_up("b")
    assert c.take_download_work() == {}
    # A short absence: its downloads stay its own, and are sent to it again when it is back.
    c.node_away("a", 3.0, grace=5.0)
    assert not c.done()
    c.node_up("a")
    assert [i.url for i in c.take_download_work()["a"]] == [i.url for i in items]
    # It died: every one of its downloads goes to the live node, as download-only work.
    c.node_away("a", 4.0, grace=5.0)
    c.expire_away(10.0)
    work = c.take_download_work()
    assert list(work) == ["b"] and sorted(i.url for i in work["b"]) == sorted(i.url for i in items)
    assert all(i.status == PENDING for i in work["b"])
    assert {r[2] for r in c.store.pending_of(["a", "b"])} == {"b"}
    # With no node live they wait, held by none, for the next node that joins.
    c.node_down("b", 11.0)
    assert c.take_download_work() == {} and len(c.store.pending_of([], unheld=True)) == 6
    c.node_up("a")
    assert len(c.take_download_work()["a"]) == 6


def test_after_a_restart_the_holders_have_a_grace_period_then_their_downloads_move(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    task = _lease_song(c, "a")
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=(_item(1),)),), 2.0)
    c.store.commit()
    again = Crawl(c.cfg, c.store, c.dedup, NodeTable(c.cfg.nodes), c.gate, None)   # the master started again
    assert again.recover_pending(100.0, grace=5.0) == 1
    again.node_up("b")
    again.expire_away(103.0)
    assert again.take_download_work() == {}            # a has not been given up yet
    again.expire_away(106.0)
    assert [i.url for i in again.take_download_work()["b"]] == [_item(1).url]



def test_a_node_that_cannot_store_past_the_bound_hands_its_pending_downloads_to_a_live_node(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    task = _lease_song(c, "a")
    ident = RequestIdentity(user_agent="UA-of-a", cookies=(("sid", "9"),))
    items = tuple(_item(i, identity=ident) for i in range(4))
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=items),), 2.0)
    c.node_up("b")
    # a's disk fills: its downloads stay its own while the fault is young (node_fault moves leases only) ...
    c.node_fault("a", [], 3.0)
    assert c.take_download_work() == {} and {r[2] for r in c.store.pending_of(["a", "b"])} == {"a"}
    assert not c.done()
    # ... and past the bound they go to the live node, with the client identity their addresses may need.
    assert c.fault_outlasted("a", 60.0) == 4
    work = c.take_download_work()
    assert list(work) == ["b"] and sorted(i.url for i in work["b"]) == sorted(i.url for i in items)
    assert all(i.identity == ident for i in work["b"])
    assert {r[2] for r in c.store.pending_of(["a", "b"])} == {"b"}
    assert c.fault_outlasted("a", 60.0) == 0 and c.take_download_work() == {}
    # a's late outcome is ignored; b's settles the row, and the crawl can end.
    ok = items[0].replace(status=OK, sha256="ef" * 32, size=7, path="audio/ef/z.mp3")
    assert c.settle("a", ((ok.url, ok),), 4.0) == []
    assert [r["node"] for r in c.settle("b", ((ok.url, ok),), 4.0)] == ["b"]
    for a in items[1:]:
        c.settle("b", ((a.url, a.replace(status=OK, sha256="ab" * 32, size=1, path="x")),), 5.0)
    assert c.store.pending_count() == 0 and c.done()


def test_past_the_bound_with_no_live_node_the_downloads_wait_for_the_next_node_that_can_store(tmp_path):
    c = make(tmp_path, nodes=("a", "b"))
    c.node_up("a")
    task = _lease_song(c, "a")
    c.complete("a", (p.Result(task.lease, SONG, p.DONE, 200, audio=(_item(1), _item(2))),), 2.0)
    c.node_fault("a", [], 3.0)
    assert c.fault_outlasted("a", 60.0) == 2 and c.take_download_work() == {}
    assert len(c.store.pending_of([], unheld=True)) == 2
    c.node_up("a")                               # its disk has room again: it takes them back
    assert len(c.take_download_work()["a"]) == 2


def test_a_store_from_before_pending_downloads_gets_the_table(tmp_path):
    import sqlite3

    path = tmp_path / "m.db"
    MasterStore(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE pending_downloads;")
    db.close()
    # The table's text is split into statements where it is made for an older store: no ";" inside a comment.
    with MasterStore(path) as store:
        store.add_pending([(SONG, _item().url, "w1", "{}", 1.0)])
        assert store.pending_count() == 1
