"""The identification part of the master store (crawler/master/store_identify.py), on SQLite and PostgreSQL:
references, fingerprints kept from items, matches, the catalogue rows' match and recording."""

from __future__ import annotations

import json
import sqlite3

import pytest

from crawler.items import AudioItem
from crawler.master.store import Checked, MasterStore, Reference
from crawler.master.store_identify import NEVER_MATCHED


@pytest.fixture
def store(store_location):
    s = MasterStore(store_location)
    yield s
    s.close()


def _row(url: str, page: str, at: float) -> dict:
    row = AudioItem(url=url, page=page, fingerprint=b"never in the row").catalogue_row()
    return {**row, "node": "n1", "found_at": at}


def test_fingerprint_travels_on_the_item_but_not_into_the_catalogue_row():
    item = AudioItem(url="http://a/x.mp3", page="http://a/", fingerprint=b"\x00\x01")
    assert "fingerprint" not in item.catalogue_row()
    assert AudioItem.from_wire(item.to_wire()) == item


def test_references_added_replaced_listed_removed(store):
    assert store.add_references([Reference("w1", b"a b c", "One", "Ann", "/refs/w1.wav"),
                                 Reference("w2", b"d e f")], 10.0) == 2
    top, n = store.reference_state()
    assert n == 2
    store.add_references([Reference("w1", b"a b c d", "One again")], 11.0)
    top2, n2 = store.reference_state()
    assert n2 == 2 and top2 > top     # a work added again is matched again: its id is new
    assert [(r["work"], r["title"]) for r in store.references()] == [("w2", None), ("w1", "One again")]
    assert [w for _, w, _ in store.reference_fingerprints(after=top)] == ["w1"]
    assert store.remove_reference("w2") and not store.remove_reference("w2")
    store.commit()
    assert store.reference_works() == {"w1"}


def test_fingerprints_wait_for_matching_until_checked_against_the_newest_reference(store):
    store.add_audio([_row("http://a/1.mp3", "http://a/", 1.0), _row("http://a/2.mp3", "http://a/", 1.0)])
    store.add_fingerprints([("http://a/1.mp3", b"x a b c y"), ("http://a/2.mp3", b"q r s")], 1.0)
    assert [u for u, *_ in store.to_match(0, 10)] == ["http://a/1.mp3", "http://a/2.mp3"]
    r1, r2 = store.new_recording(), store.new_recording()
    fresh = store.record_checked([Checked("http://a/1.mp3", 0, r1), Checked("http://a/2.mp3", 0, r2)], 2.0)
    assert fresh == [] and store.to_match(0, 10) == []
    # A work added later: every stored fingerprint is due again (retroactive), never matched ones first.
    store.add_references([Reference("w1", b"a b c")], 3.0)
    top, _ = store.reference_state()
    due = store.to_match(top, 10)
    assert [(u, rec) for u, _, rec, _ in due] == [("http://a/1.mp3", r1), ("http://a/2.mp3", r2)]
    fresh = store.record_checked([Checked("http://a/1.mp3", top, r1, (("w1", 3.0, 1.0),)),
                                  Checked("http://a/2.mp3", top, r2)], 4.0)
    assert [(f["url"], f["work"], f["page"], f["offset"], f["first_seen"], f["matched_at"]) for f in fresh] == [
        ("http://a/1.mp3", "w1", "http://a/", 1.0, 1.0, 4.0)]
    # Found again: not a new match.
    assert store.record_checked([Checked("http://a/1.mp3", top, r1, (("w1", 3.0, 1.0),))], 5.0) == []
    store.commit()
    assert store.match_count() == 1
    assert [m["work"] for m in store.latest_matches()] == ["w1"]
    assert [(m["url"], m["work"], m["recording"]) for m in store.export_matches()] == [("http://a/1.mp3", "w1", r1)]
    rows = {r["url"]: r for r in store.catalogue()}
    assert rows["http://a/1.mp3"]["match"] == {"work": "w1", "score": 3.0, "offset": 1.0}
    assert rows["http://a/1.mp3"]["recording"] == r1 and "match" not in rows["http://a/2.mp3"]
    assert "fingerprint" not in rows["http://a/1.mp3"]["extra"]
    st = store.status()["matches"]
    assert st["count"] == 1 and st["latest"][0]["url"] == "http://a/1.mp3"
    # Changed bytes at an address: the new fingerprint is matched again from scratch.
    store.add_fingerprints([("http://a/1.mp3", b"other")], 6.0)
    assert [(u, rec, c) for u, _, rec, c in store.to_match(top, 10)] == [("http://a/1.mp3", None, NEVER_MATCHED)]
    # The same bytes reported again change nothing.
    store.add_fingerprints([("http://a/2.mp3", b"q r s")], 7.0)
    assert [u for u, *_ in store.to_match(top, 10)] == ["http://a/1.mp3"]


def test_a_removed_work_takes_its_matches_and_is_never_matched_after(store):
    store.add_references([Reference("w1", b"a b c")], 1.0)
    store.add_fingerprints([("http://a/1.mp3", b"a b c")], 1.0)
    store.remove_reference("w1")
    assert store.record_checked([Checked("http://a/1.mp3", 1, 1, (("w1", 3.0, 0.0),))], 2.0) == []
    store.add_references([Reference("w2", b"a b c")], 3.0)
    store.record_checked([Checked("http://a/1.mp3", 2, 1, (("w2", 3.0, 0.0),))], 4.0)
    assert store.match_count() == 1
    store.remove_reference("w2")
    assert store.match_count() == 0 and list(store.export_matches()) == []


def test_recordings_index_sources_are_one_address_per_recording(store_location):
    store = MasterStore(store_location)
    store.add_fingerprints([("http://a/1.mp3", b"a"), ("http://b/1.mp3", b"a2"), ("http://c/1.mp3", b"z")], 1.0)
    store.record_checked([Checked("http://a/1.mp3", 0, 7, lead=True), Checked("http://b/1.mp3", 0, 7),
                          Checked("http://c/1.mp3", 0, 8, lead=True)], 2.0)
    assert store.recordings() == [("http://a/1.mp3", 7, b"a"), ("http://c/1.mp3", 8, b"z")]
    store.commit()
    store.close()
    again = MasterStore(store.location)
    try:
        assert again.new_recording() == 9    # ids are never given twice across restarts
    finally:
        again.close()


def test_reader_sees_committed_matches(store_location):
    writer = MasterStore(store_location)
    writer.add_references([Reference("w1", b"a b c", "T")], 1.0)
    writer.add_fingerprints([("http://a/1.mp3", b"a b c")], 1.0)
    writer.record_checked([Checked("http://a/1.mp3", 1, 1, (("w1", 3.0, 0.0),))], 2.0)
    writer.commit()
    reader = MasterStore.open_readonly(store_location)
    try:
        assert reader.match_count() == 1
        assert [r["work"] for r in reader.references()] == ["w1"]
    finally:
        reader.close()
        writer.close()


def test_a_store_from_before_identification_gets_its_tables(tmp_path):
    path = tmp_path / "m.db"
    MasterStore(path).close()
    db = sqlite3.connect(path)
    db.executescript("DROP TABLE matches; DROP TABLE fingerprints; DROP TABLE ref_works; DROP INDEX audio_url;")
    db.close()
    reader = MasterStore.open_readonly(path)
    try:
        assert reader.match_count() == 0 and reader.references() == [] and reader.status()["matches"]["count"] == 0
    finally:
        reader.close()
    with MasterStore(path) as s:
        s.add_references([Reference("w1", b"a b c")], 1.0)
        assert s.reference_state()[1] == 1


def test_the_fingerprint_crosses_the_wire_within_its_limit():
    from crawler import protocol as p
    from crawler.identify import MAX_FINGERPRINT_BYTES

    item = AudioItem(url="http://a/x.mp3", page="http://a/", fingerprint=b"\x00\xff" * 10)
    msg = p.Report((p.Result(1, "http://a/", p.DONE, 200, audio=(item,)),))
    frame = p.encode(msg, max_frame=8 << 20)
    (back,) = p.decode_payload(frame[p.HEADER_SIZE:]).results
    assert back.audio[0].fingerprint == item.fingerprint
    big = AudioItem(url="http://a/x.mp3", page="http://a/", fingerprint=b"x" * (MAX_FINGERPRINT_BYTES + 1))
    frame = p.encode(p.Report((p.Result(1, "http://a/", p.DONE, 200, audio=(big,)),)), max_frame=8 << 20)
    with pytest.raises(p.ProtocolError, match="fingerprint"):
        p.decode_payload(frame[p.HEADER_SIZE:])


def test_the_alerts_outbox_keeps_new_matches_until_delivered(store):
    store.add_references([Reference("w1", b"a b c")], 1.0)
    store.add_fingerprints([("http://a/1.mp3", b"a b c"), ("http://a/2.mp3", b"a b c")], 1.0)
    store.record_checked([Checked("http://a/1.mp3", 1, 1, (("w1", 3.0, 0.0),))], 2.0)       # alerts off
    store.record_checked([Checked("http://a/2.mp3", 1, 1, (("w1", 3.0, 0.0),))], 3.0, alert=True)
    store.record_checked([Checked("http://a/2.mp3", 1, 1, (("w1", 3.0, 0.0),))], 4.0, alert=True)  # not new
    (due,) = store.due_alerts(3.0, 10)
    alert_id, body, attempts = due
    assert attempts == 0 and json.loads(body)["url"] == "http://a/2.mp3"
    assert json.loads(body)["matched_at"] == "1970-01-01T00:00:03Z"
    store.alert_failed([(alert_id, 10.0)])
    assert store.due_alerts(9.0, 10) == [] and store.due_alerts(10.0, 10)[0][2] == 1
    store.alert_delivered([alert_id])
    assert store.due_alerts(100.0, 10) == [] and store.identify.alerts_waiting() == 0
