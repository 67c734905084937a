"""The store's records of finished downloads: looked up on the event loop, written in batches from a thread.

A look-up must never wait for a batch being written, and a key never finished here (nearly every download's)
is answered from the filter of known keys without asking SQLite at all.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from crawler.worker.audiostore import AudioStore, Finished


def _record(i: int) -> Finished:
    return Finished(url=f"http://cdn.test/{i}.mp3", sha256=f"{i:064x}", size=100 + i, path=f"audio/00/{i:064x}.mp3")


def test_a_look_up_does_not_wait_for_records_being_written(tmp_path: Path) -> None:
    store = AudioStore(tmp_path)
    store.save_finished_many([("k1", _record(1))])
    found: list[Finished | None] = []
    # A batch of records being written (in a worker thread) holds the writer for as long as it takes.
    with store._db_lock:
        reader = threading.Thread(target=lambda: found.extend([store.load_finished("k1"),
                                                              store.load_finished("k2")]))
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive(), "the look-up waited for the writer"
    assert found == [_record(1), None]
    store.close()


def test_known_keys_answer_for_records_saved_before_and_after_they_were_read(tmp_path: Path) -> None:
    before = AudioStore(tmp_path)
    before.save_finished_many([(f"k{i}", _record(i)) for i in range(3)])
    before.close()

    store = AudioStore(tmp_path)
    store.load_known_keys()
    store.save_finished_many([("k9", _record(9))])
    assert [store.load_finished(f"k{i}") for i in (0, 1, 2, 9)] == [_record(i) for i in (0, 1, 2, 9)]
    assert store.load_finished("never") is None
    store.close()


def test_a_key_never_finished_is_answered_without_asking_sqlite(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = AudioStore(tmp_path)
    store.save_finished_many([("k1", _record(1))])
    store.load_known_keys()

    def no_sqlite() -> None:
        raise AssertionError("SQLite was asked")

    monkeypatch.setattr(store, "_lookups", no_sqlite)
    assert all(store.load_finished(f"new{i}") is None for i in range(1000))
    store.close()


def test_records_kept_as_files_by_earlier_versions_are_still_found_after_the_keys_are_read(tmp_path: Path) -> None:
    old = AudioStore(tmp_path)
    legacy = old.finished_path("old-key")
    legacy.parent.mkdir(parents=True)
    legacy.write_text(_record(5).to_json())

    store = AudioStore(tmp_path)
    store.load_known_keys()
    assert store.load_finished("old-key") == _record(5)
    store.close()


def test_a_database_made_with_without_rowid_tables_is_read_and_written_as_it_is(tmp_path: Path) -> None:
    """Earlier versions made both tables WITHOUT ROWID; new stores make rowid tables. The same statements serve
    both, so an old store keeps working (and keeps its tables)."""
    import sqlite3

    (tmp_path / "audio").mkdir()
    db = sqlite3.connect(tmp_path / "audio" / "finished.sqlite3")
    db.execute("CREATE TABLE finished (key TEXT PRIMARY KEY, record TEXT NOT NULL) WITHOUT ROWID")
    db.execute("CREATE TABLE stored (sha256 TEXT PRIMARY KEY, path TEXT NOT NULL) WITHOUT ROWID")
    db.execute("INSERT INTO finished VALUES (?, ?)", ("old", _record(1).to_json()))
    db.execute("INSERT INTO stored VALUES (?, ?)", (_record(1).sha256, _record(1).path))
    db.commit()
    db.close()

    store = AudioStore(tmp_path)
    store.load_known_keys()
    store.save_finished_many([("new", _record(2)), ("old", _record(3))])
    assert [store.load_finished(k) for k in ("old", "new")] == [_record(3), _record(2)]
    assert store._stored_names([_record(1).sha256, _record(2).sha256]) == {
        _record(1).sha256: _record(1).path, _record(2).sha256: _record(2).path}
    store.close()
    db = sqlite3.connect(tmp_path / "audio" / "finished.sqlite3")
    assert all("WITHOUT ROWID" in sql for sql, in db.execute("SELECT sql FROM sqlite_master WHERE type = 'table'"))
    db.close()
