import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from crawler.master.store import MasterStore, PageOutcome, StoreError
from tests.store_reads import audio_by_sha, due_for_refresh, url_info


def route_to(node):
    return lambda urls: [node] * len(urls)


@pytest.fixture
def store(store_location):
    s = MasterStore(store_location, max_attempts=2)
    yield s
    s.close()


def fin(url, state="done", node="a", at=100.0):
    return PageOutcome(url, state, 200 if state == "done" else None, url, "text/html", 10, None, node, at)


def test_pop_serves_one_node_breadth_first_then_priority_then_insertion(store):
    store.push([("u/d2", 2, 0, "a", None), ("u/d1-low", 1, 0, "a", "p"), ("u/d1-high", 1, 1, "a", "p"),
                ("u/d0", 0, 0, "a", None), ("u/other", 0, 0, "b", None), ("u/d1-low2", 1, 0, "a", None)])
    assert store.push([("u/d0", 0, 0, "a", None)]) == 0            # already known: ignored
    got = store.pop("a", 10, now=1.0)
    assert [u for u, _, _ in got] == ["u/d0", "u/d1-high", "u/d1-low", "u/d1-low2", "u/d2"]
    assert got[2] == ("u/d1-low", 1, "p")
    assert store.pop("a", 10, now=1.0) == []
    assert store.frontier_size() == 1 and store.frontier_size("b") == 1
    assert store.status()["states"] == {"queued": 1, "leased": 5, "done": 0, "error": 0, "robots": 0}


def test_reroute_moves_only_the_named_nodes_entries(store):
    store.push([(f"u{i}", 0, 0, "a" if i % 2 else "b", None) for i in range(10)] + [("orphan", 0, 0, None, None)])
    moved = store.reroute(["a", None], route_to("c"))
    assert moved == 6
    assert store.frontier_size("c") == 6 and store.frontier_size("b") == 5 and store.frontier_size("a") == 0


def test_release_and_lease_recovery_keep_depth_and_parent(store):
    store.push([("x", 3, 0, "a", "parent")])
    store.pop("a", 1, now=1.0)
    assert store.release(["x", "never-leased"], route_to("b")) == 1
    assert store.pop("b", 5, now=2.0) == [("x", 3, "parent")]
    assert store.requeue_leased(route_to(None)) == 1
    assert store.frontier_size() == 1 and store.status()["states"]["leased"] == 0


def test_finish_is_idempotent_and_retries_are_bounded(store):
    store.push([("ok", 0, 0, "a", None), ("flaky", 0, 0, "a", None)])
    store.pop("a", 2, now=1.0)
    assert store.finish([fin("ok"), fin("ok")]) == [True, False]        # a late duplicate counts once
    assert store.finish([fin("flaky", "retry")]) == [True]
    assert store.pop("a", 5, now=2.0) == [("flaky", 0, None)]           # back in the frontier, same node
    assert store.finish([fin("flaky", "retry")]) == [True]             # max_attempts=2: now an error
    assert store.frontier_empty()
    assert store.status()["states"] == {"queued": 0, "leased": 0, "done": 1, "error": 1, "robots": 0}
    assert store.finish([fin("unknown")]) == [False]


def test_known_due_for_refresh_and_requeue(store):
    store.push([(f"p{i}", 1, 0, "a", None) for i in range(5)])
    store.pop("a", 5, now=0.0)
    store.finish([fin("p0", at=10.0), fin("p1", at=50.0)])
    assert store.known(["p0", "p3", "zz"]) == {"p0", "p3"}
    due = due_for_refresh(store, now=100.0, older_than=60.0, limit=10)
    assert due == [("p0", 1)]
    assert store.requeue_refresh(due, route_to("b")) == 1
    assert store.pop("b", 5, now=101.0) == [("p0", 1, None)]


def test_catalogue_rows_unique_per_source_and_page_and_filled_in_later(store):
    row = {"url": "http://a/x.mp3", "page": "http://a/p", "title": "T", "status": "ok", "sha256": None}
    assert store.add_audio([row, dict(row)]) == [True, False]
    assert store.add_audio([dict(row, sha256="ab" * 32)]) == [False]
    assert [r["sha256"] for r in store.catalogue()] == ["ab" * 32]
    assert len(audio_by_sha(store, "ab" * 32)) == 1
    # One song from a resolver with a site id: a fresh signed URL is still the same item on that page.
    k = {"url": "http://cdn/1?sig=1", "page": "http://a/q", "resolver": "kugou", "source_id": "H1"}
    assert store.add_audio([k, dict(k, url="http://cdn/1?sig=2")]) == [True, False]
    assert store.add_audio([dict(k, page="http://a/other")]) == [True]


def test_statistics_and_meta(store):
    store.count_discards({"depth": 2, "out_of_scope": 1})
    store.count_discards({"depth": 3})
    store.note_node("a", bytes=10)
    store.note_node("a", bytes=5)
    store.set_meta("k", "1")
    store.set_meta("k", "2")
    st = store.status()
    assert st["discards"] == {"out_of_scope": 1, "depth": 5} and st["nodes"]["a"]["bytes"] == 15
    assert store.get_meta("k") == "2" and store.get_meta("missing") is None


def test_iter_urls_and_count(store):
    store.push([(f"u{i}", 0, 0, None, None) for i in range(250)])
    assert store.url_count() == 250
    assert sum(len(b) for b in store.iter_urls(batch=100)) == 250


def test_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "m.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a crawl database"):
        MasterStore(bad)


def test_readonly_reader_sees_committed_state_while_writer_is_open(store_location):
    writer = MasterStore(store_location)
    writer.push([("a", 0, 0, "n", None)])
    writer.commit()
    writer.push([("b", 0, 0, "n", None)])       # not committed yet
    reader = MasterStore.open_readonly(store_location)
    assert reader.status()["frontier"] == 1
    with pytest.raises(sqlite3.OperationalError):
        reader.push([("c", 0, 0, "n", None)])
    reader.close()
    writer.close()


CRASHER = textwrap.dedent("""
    import sys, random
    from crawler.master.store import MasterStore, PageOutcome
    s = MasterStore(sys.argv[1])
    rnd = random.Random(int(sys.argv[2]))
    route = lambda urls: ["a"] * len(urls)
    i = 0
    while True:
        s.push([(f"u{i}-{j}", 1, 0, "a", None) for j in range(50)])
        got = s.pop("a", 30, 1.0)
        s.finish([PageOutcome(u, "done", 200, u, None, 1, None, "a", 1.0) for u, _, _ in got[:20]])
        s.release([u for u, _, _ in got[20:25]], route)
        if i == 0 or rnd.random() < 0.5:
            s.commit()
        if i == 0:
            print("ready", flush=True)   # something is committed: a kill from now on has a state to check
        i += 1
""")


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_at_any_moment_leaves_frontier_and_url_table_consistent(store_location, seed):
    db = store_location
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, str(db), str(seed)], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    time.sleep(0.3 + 0.2 * seed)     # the behaviour under test: a kill at some moment of the writes, one per seed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    s = MasterStore(db)
    c = s.db
    total = c.execute("SELECT COUNT(*) FROM urls").fetchone()[0]
    assert total > 0
    # every queued URL has exactly one frontier entry; nothing else has one
    assert c.execute("SELECT COUNT(*) FROM urls WHERE state = 0").fetchone()[0] == s.frontier_size()
    assert c.execute("SELECT COUNT(*) FROM frontier f LEFT JOIN urls u ON u.id = f.url_id "
                     "WHERE u.id IS NULL OR u.state != 0").fetchone()[0] == 0
    assert c.execute("SELECT COUNT(*) FROM (SELECT url_id FROM frontier GROUP BY url_id HAVING COUNT(*) > 1) AS d"
                     ).fetchone()[0] == 0
    leased = s.requeue_leased(route_to("a"))
    assert c.execute("SELECT COUNT(*) FROM urls WHERE state = 0").fetchone()[0] == s.frontier_size()
    assert leased >= 0
    s.close()


def test_catalogue_keeps_meta_source_file_tags_and_new_fields_and_fills_gaps_on_repeat(store):
    row = {"url": "http://a/x.mp3", "page": "http://a/p", "title": "T", "meta_source": {"title": "class"},
           "file_tags": {"title": "Other"}, "published": "2024-01-01T00:00:00+00:00"}
    store.add_audio([row])
    store.add_audio([dict(row, title="ignored", album="From file", codec="mp3", meta_source={"x": "y"})])
    [got] = list(store.catalogue())
    assert (got["title"], got["album"], got["codec"], got["published"]) == (
        "T", "From file", "mp3", "2024-01-01T00:00:00+00:00")
    assert got["meta_source"] == {"title": "class"} and got["file_tags"] == {"title": "Other"}
    assert got["extra"] == {}


def _as_made_before(s):
    """Give a store the catalogue key an earlier crawler made (item key first), its index on page apart, and the
    index on pages(last_crawl)."""
    from crawler.master.store_audio import AUDIO_COLUMNS, AUDIO_TABLE

    s.commit()
    db = s.db
    db.begin()
    if db.name == "postgresql":
        db.execute("ALTER TABLE audio DROP CONSTRAINT audio_page_ukey_key")
        db.execute("ALTER TABLE audio ADD UNIQUE (ukey, page)")
    else:
        names = ", ".join(("id", "ukey", *AUDIO_COLUMNS))
        db.execute(db.ddl(AUDIO_TABLE.replace("UNIQUE (page, ukey)", "UNIQUE (ukey, page)")
                          .replace("CREATE TABLE audio (", "CREATE TABLE old_audio (")))
        db.execute(f"INSERT INTO old_audio({names}) SELECT {names} FROM audio")
        db.execute("DROP TABLE audio")
        db.execute("ALTER TABLE old_audio RENAME TO audio")
        db.execute("CREATE INDEX audio_url ON audio(url)")
    db.execute("CREATE INDEX audio_page ON audio(page)")
    db.execute("CREATE INDEX refresh ON pages(last_crawl)")
    db.execute("COMMIT")


def test_a_store_from_before_gets_the_catalogue_key_page_first_and_loses_unread_indexes(store_location):
    """A store from before the catalogue key led with the page: a reader leaves it as it is; the master's next
    start makes the key again page first, with every item kept (ids, values) and the key as unique as before, and
    drops the indexes nothing reads (on page apart, on pages(last_crawl))."""
    with MasterStore(store_location) as s:
        s.add_audio([{"url": f"http://a/{i}.mp3", "page": f"http://a/p{i % 3}", "title": f"T{i}", "found_at": 1.0}
                     for i in range(7)])
        s.push([("http://a/p0", 0, 0, "w1", None)])
        s.pop("w1", 1, 1.0)
        s.finish([PageOutcome("http://a/p0", "done", 200, None, "text/html", 5, None, "w1", 2.0)])
        _as_made_before(s)
        assert s.db.unique_keys("audio") and ("page", "ukey") not in s.db.unique_keys("audio").values()
        before = sorted(map(tuple, s.db.execute("SELECT * FROM audio")))
    with MasterStore.open_readonly(store_location) as r:
        assert ("page", "ukey") not in r.db.unique_keys("audio").values()
        assert {"audio_page", "refresh"} <= r.db.indexes("audio") | r.db.indexes("pages")
        assert len(list(r.catalogue())) == 7
    with MasterStore(store_location) as s:
        assert list(s.db.unique_keys("audio").values()) == [("page", "ukey")]
        assert not {"audio_page", "refresh"} & (s.db.indexes("audio") | s.db.indexes("pages"))
        assert {"audio_sha", "audio_events", "audio_url"} <= s.db.indexes("audio")
        assert url_info(s, "http://a/p0")["last_crawl"] == 2.0
        assert sorted(map(tuple, s.db.execute("SELECT * FROM audio"))) == before
        assert s.add_audio([{"url": "http://a/3.mp3", "page": "http://a/p0", "found_at": 2.0},
                            {"url": "http://a/9.mp3", "page": "http://a/p0", "found_at": 2.0}]) == [False, True]
        assert s.chain_rows(["http://a/p0"])[0] == [(None, "http://a/p0", f"http://a/{i}.mp3") for i in (0, 3, 6, 9)]
        with pytest.raises(StoreError), s.atomic():
            s.db.execute("INSERT INTO audio(id, ukey, url, page, status) VALUES (99, 'http://a/9.mp3', 'x', "
                         "'http://a/p0', 'ok')")
    with MasterStore(store_location) as s:       # once
        assert list(s.db.unique_keys("audio").values()) == [("page", "ukey")]
        assert len(list(s.catalogue())) == 8


def test_a_store_from_before_the_new_fields_gains_their_columns(tmp_path):
    path = tmp_path / "m.db"
    old = MasterStore(path)
    old.add_audio([{"url": "http://a/x.mp3", "page": "http://a/p", "title": "T"}])
    old.push([("http://a/", 0, 0, "n", None)])
    old.commit()
    old.close()
    db = sqlite3.connect(path)
    for column in ("meta_source", "file_tags", "codec", "published", "lyrics"):
        db.execute(f"ALTER TABLE audio DROP COLUMN {column}")
    db.commit()
    db.close()
    reader = MasterStore.open_readonly(path)   # may not alter the file: reads the missing columns as null
    try:
        [row] = list(reader.catalogue())
        assert row["title"] == "T" and row["meta_source"] == {} and row["codec"] is None
    finally:
        reader.close()
    store = MasterStore(path)
    try:
        store.add_audio([{"url": "http://a/y.mp3", "page": "http://a/p", "codec": "mp3", "meta_source": {"a": "b"}}])
        store.note_lastmod([("http://a/", 1700000000.0), ("http://a/unknown", 1.0)])
        assert [r["codec"] for r in store.catalogue()] == [None, "mp3"]
        assert url_info(store, "http://a/")["lastmod"] == 1700000000.0
    finally:
        store.close()
