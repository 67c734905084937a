"""A store written by an earlier crawler (layout 1: URL text per row, a key index; layout 2: rows keyed by a hash
of host and URL) is refused by the master with one line saying what to do, and `crawler-master upgrade-store`
rewrites it with nothing lost."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from crawler.master.store import AUDIO_COLUMNS, MasterStore, PageOutcome, StoreError
from testkit import cluster
from tests.store_reads import url_info

# The previous layout's tables, as that crawler created them.
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE urls (
    id INTEGER PRIMARY KEY, key INTEGER NOT NULL, url TEXT NOT NULL, depth INTEGER NOT NULL,
    priority INTEGER NOT NULL, seq INTEGER NOT NULL, slot INTEGER, state INTEGER NOT NULL, node TEXT, parent TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, leased_at REAL, last_crawl REAL, http_status INTEGER, final_url TEXT,
    content_type TEXT, size INTEGER, error TEXT, lastmod REAL);
CREATE INDEX urls_key ON urls(key);
CREATE TABLE counts (state INTEGER NOT NULL, node TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (state, node))
    WITHOUT ROWID;
CREATE TABLE discards (reason TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE node_stats (node TEXT NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (node, name))
    WITHOUT ROWID;
"""


def write_v1(path):
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("CREATE TABLE audio (id INTEGER PRIMARY KEY, ukey TEXT NOT NULL, "
               + ", ".join(AUDIO_COLUMNS) + ", UNIQUE (ukey, page))")
    rows = [
        (1, 0, "http://s/", 0, 1, 1, None, 2, "w1", None, 0, None, 50.0, 200, None, "text/html", 10, None, None),
        (2, 0, "http://s/a.html", 1, 1, 2, None, 0, "w1", "http://s/", 0, None, None, None, None, None, None, None,
         None),
        (3, 0, "http://s/b.html", 1, 0, 3, None, 3, "w1", "http://s/", 3, None, 60.0, 500, None, None, None,
         "HTTP 500", None),
        (4, 0, "http://s/c.html", 1, 0, 4, None, 1, "w1", "http://gone/", 1, 70.0, None, None, None, None, None,
         None, None),
    ]
    db.executemany("INSERT INTO urls(id, key, url, depth, priority, seq, slot, state, node, parent, attempts, "
                   "leased_at, last_crawl, http_status, final_url, content_type, size, error, lastmod) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.executemany("INSERT INTO counts VALUES (?, ?, ?)", [(0, "w1", 1), (1, "w1", 1), (2, "w1", 1), (3, "w1", 1)])
    db.execute("INSERT INTO meta VALUES ('next_seq', '4')")
    db.execute("INSERT INTO discards VALUES ('depth', 7)")
    db.execute("INSERT INTO audio(ukey, url, page, status, title) VALUES ('http://s/x.mp3', 'http://s/x.mp3', "
               "'http://s/a.html', 'ok', 'X')")
    db.execute("PRAGMA application_id = 1094931031")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


def refs_of(s):
    return [tuple(r) for r in s.db.execute(
        "SELECT u.url, a.url FROM audio_refs r JOIN urls u ON u.id = r.referrer JOIN audio a ON a.id = r.audio_id")]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "crawler.master", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_an_old_store_is_refused_in_one_line_then_upgraded_with_nothing_lost(tmp_path):
    config = cluster.master_config(tmp_path, ["http://s/"], ["w1"])
    db = tmp_path / "master" / "master.db"
    db.parent.mkdir()
    write_v1(db)
    before = db.read_bytes()

    run = cli("--config", str(config))
    assert run.returncode == 2     # a mistake to fix: systemd's RestartPreventExitStatus=2 does not loop on it
    [line] = run.stderr.strip().splitlines()
    assert "crawler-master upgrade-store" in line and "older crawler" in line, run.stderr
    assert db.read_bytes() == before, "a refused store must be left as it was"

    up = cli("upgrade-store", "--config", str(config))
    assert up.returncode == 0, up.stderr
    assert "4 URLs" in up.stdout and (db.parent / "master.db.layout1").exists()

    with MasterStore(db) as s:
        assert s.status()["states"] == {"queued": 1, "leased": 1, "done": 1, "error": 1, "robots": 0}
        assert s.status()["discards"] == {"depth": 7} and [r["title"] for r in s.catalogue()] == ["X"]
        # The item is listed by its page (the references a refresh follows), as if the page had said so.
        assert refs_of(s) == [("http://s/a.html", "http://s/x.mp3")]
        assert url_info(s, "http://s/")["http_status"] == 200
        info = url_info(s, "http://s/b.html")
        assert (info["state"], info["error"], info["attempts"], info["parent"]) == ("error", "HTTP 500", 3,
                                                                                     "http://s/")
        assert url_info(s, "http://s/c.html")["parent"] == "http://gone/"      # a parent never in the table
        assert s.pop("w1", 10, 1.0) == [("http://s/a.html", 1, "http://s/")]
        assert s.requeue_leased(lambda urls: ["w1"] * len(urls)) == 2           # a.html and c.html
        assert s.finish([PageOutcome("http://s/c.html", "done", 200, None, None, 1, None, "w1", 80.0)]) == [True]
        assert s.push([("http://s/a.html", 0, 0, "w1", None), ("http://s/new", 2, 0, "w1", "http://s/a.html")]) == 1
        assert s.core.next_seq > 4
    again = cli("upgrade-store", "--config", str(config))
    assert again.returncode == 0 and "nothing to upgrade" in again.stdout and again.stderr == "", again


def write_v2(db):
    """A store of layout 2 (rows keyed by a hash of host and URL, no URL index): rows written by this crawler, then
    given scattered keys the way layout 2 keyed them, every reference to a row following."""
    with MasterStore(db) as s:
        s.push([("http://s/", 0, 1, "w1", None)])
        assert s.pop("w1", 1, 1.0) == [("http://s/", 0, None)]
        s.push([("http://s/a.html", 1, 1, "w1", "http://s/"), ("http://s/b.html", 1, 0, "w1", "http://s/"),
                ("http://s/c.html", 1, 0, "w1", "http://gone/")])
        s.finish([PageOutcome("http://s/", "done", 200, None, "text/html", 10, None, "w1", 50.0)])
        s.add_audio([{"url": "http://s/x.mp3", "page": "http://s/a.html", "status": "ok", "title": "X"}])
    Path(f"{db}.urlidx").unlink()
    raw = sqlite3.connect(db)
    for table, column in (("url_state", "id"), ("url_state", "parent"), ("pages", "id")):
        raw.execute(f"UPDATE {table} SET {column} = {column} * 7919 + 1000000 WHERE {column} IS NOT NULL")
    raw.execute("DELETE FROM meta WHERE key = 'url_index'")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()


def test_a_layout_2_store_gets_ids_in_line_order_and_its_index(tmp_path):
    config = cluster.master_config(tmp_path, ["http://s/"], ["w1"])
    db = tmp_path / "master" / "master.db"
    db.parent.mkdir()
    write_v2(db)

    run = cli("--config", str(config))
    assert run.returncode == 2 and "crawler-master upgrade-store" in run.stderr, run.stderr
    up = cli("upgrade-store", "--config", str(config))
    assert up.returncode == 0, up.stderr
    assert "4 URLs" in up.stdout and "master.db.layout2" in up.stdout
    assert (db.parent / "master.db.layout2").exists() and Path(f"{db}.urlidx").exists()

    with MasterStore(db) as s:
        ids = s.db.execute("SELECT id FROM url_state ORDER BY seq").fetchall()
        assert [i for (i,) in ids] == [1, 2, 3, 4]              # in line order, from 1
        assert s.status()["states"] == {"queued": 3, "leased": 0, "done": 1, "error": 0, "robots": 0}
        assert url_info(s, "http://s/")["http_status"] == 200
        assert url_info(s, "http://s/a.html")["parent"] == "http://s/"
        assert url_info(s, "http://s/c.html")["parent"] == "http://gone/"
        assert [r["title"] for r in s.catalogue()] == ["X"]
        assert refs_of(s) == [("http://s/a.html", "http://s/x.mp3")]
        assert [u for u, *_ in s.pop("w1", 10, 2.0)] == ["http://s/a.html", "http://s/b.html", "http://s/c.html"]
        assert s.push([("http://s/a.html", 2, 0, "w1", None), ("http://s/d", 2, 0, "w1", "http://s/b.html")]) == 1
        assert url_info(s, "http://s/d")["parent"] == "http://s/b.html"
        assert s.db.execute("SELECT max(id) FROM url_state").fetchone()[0] == 5


def test_a_layout_2_postgresql_store_is_indexed_in_place(pg_dsn):
    from crawler.master.store import upgrade_postgres

    with MasterStore(pg_dsn) as s:
        s.push([(f"http://s/{i}", 0, 0, "w1", None) for i in range(50)])
        s.add_audio([{"url": "http://s/x.mp3", "page": "http://s/7", "status": "ok"}])
    with MasterStore(pg_dsn) as s:
        s.db.execute("BEGIN")
        s.db.execute("DROP TABLE url_hashes")
        s.db.execute("DROP TABLE audio_refs")
        s.db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        s.db.execute("COMMIT")
    with pytest.raises(StoreError, match="upgrade-store"):
        MasterStore(pg_dsn)
    assert upgrade_postgres(pg_dsn) == 50
    with MasterStore(pg_dsn) as s:
        assert len(s.known([f"http://s/{i}" for i in range(50)])) == 50
        assert refs_of(s) == [("http://s/7", "http://s/x.mp3")]
        assert s.push([("http://s/3", 0, 0, "w1", None), ("http://s/new", 0, 0, "w1", None)]) == 1
    with pytest.raises(StoreError, match="nothing to upgrade"):
        upgrade_postgres(pg_dsn)


def test_robots_refused_urls_of_an_older_store_move_to_their_own_state(store_location):
    """Before robots-refused URLs had a state of their own they were errors ("disallowed by robots.txt"), so
    counted both as failed and as discarded: the master's next start moves them, on SQLite and PostgreSQL."""
    from crawler.master.store import ROBOTS_REASON

    with MasterStore(store_location) as s:
        s.push([("http://s/private/x", 1, 0, "w1", None), ("http://s/broken", 1, 0, "w1", None),
                ("http://s/ok", 1, 0, "w1", None)])
        assert len(s.pop("w1", 3, 1.0)) == 3
        # As an older crawler recorded a refusal: an error with the reason.
        s.finish([PageOutcome("http://s/private/x", "error", None, None, None, None, ROBOTS_REASON, "w1", 2.0),
                  PageOutcome("http://s/broken", "error", 500, None, None, 5, "HTTP 500", "w1", 2.0),
                  PageOutcome("http://s/ok", "done", 200, None, "text/html", 5, None, "w1", 2.0)])
        s.db.execute("DELETE FROM meta WHERE key = 'robots_state'")
        s.commit()
    with MasterStore.open_readonly(store_location) as s:   # a reader never alters it
        assert s.status()["states"]["error"] == 2
    with MasterStore(store_location) as s:
        assert s.status()["states"] == {"queued": 0, "leased": 0, "done": 1, "error": 1, "robots": 1}
        assert url_info(s, "http://s/private/x")["state"] == "robots"
        assert [r["url"] for r in s.failed()] == ["http://s/broken"]
        assert s.retry_errors(lambda urls: ["w1"] * len(urls))[0] == 1     # the refused URL stays refused
    with MasterStore(store_location) as s:   # the step runs once
        assert s.status()["states"]["robots"] == 1 and s.status()["states"]["queued"] == 1
