"""The catalogue's add_audio, set-wise (a statement per kind of write for a batch), against the row-at-a-time
version it replaced, kept here as the reference: the same rows, history, figures and answers on varied batches."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from crawler.master import store_audio as sa
from crawler.master.store import MasterStore


# The row-at-a-time insert the set-wise add_audio replaced: the database gives the id, a key met is no insert.
_REFERENCE_INSERT = (f"INSERT INTO audio(ukey, {', '.join(sa.AUDIO_COLUMNS)}) "
                     f"VALUES (?{', ?' * len(sa.AUDIO_COLUMNS)}) ON CONFLICT(ukey, page) DO NOTHING")


def reference_add_audio(cat: sa.AudioCatalogue, rows: Sequence[Mapping[str, Any]]) -> list[bool]:
    """add_audio as it was written before it went set-wise: one INSERT a row, then a SELECT and an UPDATE for a
    repeat."""
    cat.core.begin()
    out = []
    for row in rows:
        values = sa._audio_values(row)
        at = values["found_at"]
        values["last_seen"] = at
        values["changed_at"] = values["removed_at"] = values["returned_at"] = None
        ukey = sa._audio_ukey(row).replace("\x00", "")
        cur = cat.core.db.execute(_REFERENCE_INSERT, (ukey, *values.values()))
        if cur.rowcount == 1:
            cat._count_audio(None, values["status"])
            cat._note_change("new")
            out.append(True)
            continue
        out.append(False)
        old_id, old_status, old_sha = cat.core.db.execute(
            "SELECT id, status, sha256 FROM audio WHERE ukey = ? AND page = ?", (ukey, values["page"])).fetchone()
        new_sha = values["sha256"]
        if old_sha and new_sha and new_sha != old_sha:
            cat.core.db.execute("INSERT INTO audio_history(audio_id, sha256, size, path, replaced_at) "
                                "SELECT id, sha256, size, path, ? FROM audio WHERE id = ?", (at, old_id))
            cat.core.db.execute(
                f"UPDATE audio SET sha256 = ?, size = ?, path = ?, content_type = coalesce(?, content_type), "
                f"status = '{sa.CHANGED}', reason = NULL, changed_at = ?, last_seen = ?, removed_at = NULL, "
                "returned_at = NULL "
                "WHERE id = ?", (new_sha, values["size"], values["path"], values["content_type"], at, at, old_id))
            cat._count_audio(old_status, sa.CHANGED)
            cat._note_change(sa.CHANGED)
            continue
        status = values["status"]
        if old_status == sa.REMOVED:
            new_status = status
            cat._note_change("new")
        elif status == "ok" and old_status != sa.CHANGED:
            new_status = "ok"
        else:
            new_status = old_status
        cat._count_audio(old_status, new_status)
        cat.core.db.execute(sa._UPDATE_AUDIO, (*(values[c] for c in sa._COALESCED), values["url"], status,
                                               status, status, at, at, old_id))
    return out


def random_row(rnd: random.Random, at: float) -> dict[str, Any]:
    n = rnd.randrange(12)
    row: dict[str, Any] = {
        "url": rnd.choice(["", f"http://a.test/{n}.mp3", f"http://a.test/{n}.mp3?t={rnd.randrange(3)}"]),
        "page": rnd.choice(["http://a.test/p1", "http://a.test/p2", "http://a.test/p\x003"]),
        "status": rnd.choice(["ok", "ok", "error", "pending", None]),
        "node": rnd.choice(["n1", "n2"]), "found_at": at}
    if rnd.random() < 0.5:
        row["source_id"], row["resolver"] = str(n % 5), rnd.choice(["generic", "kugou"])
    if rnd.random() < 0.6:
        row["sha256"] = rnd.choice(["aa", "bb", "cc"])
        row["size"], row["path"] = rnd.randrange(1, 9999), f"files/{rnd.randrange(5)}"
    for key in ("title", "artist", "content_type", "reason"):
        if rnd.random() < 0.4:
            row[key] = rnd.choice(["x", "y\x00z", "日本", None])
    if rnd.random() < 0.4:
        row["extra"] = {"found_in": rnd.choice(["audio", "playlist"]), "n": rnd.randrange(3)}
    if rnd.random() < 0.3:
        row["file_tags"] = {"title": rnd.choice(["t", "ü"])}
    if rnd.random() < 0.2:
        row["unknown_field"] = rnd.randrange(5)        # kept in extra
    return row


def catalogue_state(store: MasterStore) -> tuple[Any, ...]:
    """The catalogue, its history and figures, row ids by rank: PostgreSQL's sequence gave an id to each repeat
    the row-at-a-time INSERT met (and threw it away), so only the ids' order is the same."""
    db = store.db
    audio = db.execute("SELECT * FROM audio ORDER BY id").fetchall()
    rank = {r[0]: k for k, r in enumerate(audio)}
    history = db.execute("SELECT * FROM audio_history").fetchall()
    return ([(rank[r[0]], *r[1:]) for r in audio], sorted(((rank[r[1]], *r[2:]) for r in history), key=repr),
            store.audio.counts_by_status(), dict(store.audio._cycle))


@pytest.mark.parametrize("guesses", ["as_set", "always", "never"])
def test_set_wise_add_audio_writes_what_row_at_a_time_wrote(request, tmp_path, store_location, monkeypatch, guesses):
    """Whether add_audio guesses that a run is new (inserting it, and deleting it again on a miss) or reads its
    keys first, it writes the same: as the store is set (backing off after misses), at every run, at none."""
    if guesses == "always":
        monkeypatch.setattr(sa, "GUESS_BACKOFF", 0)
    if isinstance(store_location, str):
        ref_location: Any = request.getfixturevalue("pg").create_database(f"r{uuid.uuid4().hex[:12]}")
    else:
        ref_location = tmp_path / "ref.db"
    new, ref = MasterStore(store_location), MasterStore(ref_location)
    try:
        for s in (new, ref):
            s.audio._cycle = {"start": 0.0, "first": False}    # count "new" too
        rnd = random.Random(11)
        if guesses == "never":
            new.audio._guess_in = 1 << 60
        for step in range(150):
            at = 1000.0 + step
            batch = [random_row(rnd, at) for _ in range(rnd.randrange(1, 14))]
            if rnd.random() < 0.3 and batch:
                batch.append(dict(batch[0], sha256=rnd.choice(["dd", None]), found_at=at))  # a key twice
            with new.atomic():
                got = new.add_audio(batch)
            with ref.atomic():
                want = reference_add_audio(ref.audio, batch)
            assert got == want, step
            if step % 10 == 9:
                # Some items leave every page (removed), so a later report brings them back.
                for s in (new, ref):
                    ids = [r[0] for r in s.db.execute("SELECT id FROM audio ORDER BY id").fetchall()][::4]
                    for i in ids:
                        status = s.db.execute("SELECT status FROM audio WHERE id = ?", (i,)).fetchone()[0]
                        if status != sa.REMOVED:
                            s.db.execute(f"UPDATE audio SET status = '{sa.REMOVED}', removed_at = ? WHERE id = ?",
                                         (at, i))
                            s.audio._count_audio(status, sa.REMOVED)
                new.commit()
                ref.commit()
        assert catalogue_state(new) == catalogue_state(ref)
        assert len(catalogue_state(new)[1]) > 5 and sa.REMOVED in new.audio.counts_by_status()
        ids = [r[0] for r in new.db.execute("SELECT id FROM audio ORDER BY id")]
        assert ids == list(range(1, len(ids) + 1))         # a guess that missed gave its ids back
    finally:
        new.close()
        ref.close()


def test_rows_are_found_by_their_exact_pairs_whatever_their_text(store_location):
    texts = ["http://a.test/it's", 'say "hi"', "back\\slash", "日本/🎵", "100%?x=1&y=%20", "[1, 2]", "null", ""]
    with MasterStore(store_location) as s:
        rows = [{"url": u, "page": f"http://p.test/{p}", "status": "ok", "node": "n", "found_at": 1.0}
                for u in texts[:-1] for p in texts]
        with s.atomic():
            assert all(s.add_audio(rows))
        keys = [(u, f"http://p.test/{p}") for u in texts for p in texts] + [("http://a.test/it's", "other")]
        found = s.audio._audio_state(keys)
        assert set(found) == {(r["url"], r["page"]) for r in rows}
        with s.atomic():
            assert not any(s.add_audio(rows))        # every one a repeat: met by its own pair


def test_the_store_gives_new_rows_their_ids_and_a_failed_unit_gives_them_back(store_location):
    # add_audio gives a new row its id (no read back), and a report's refs name the rows it made from those ids;
    # a unit that fails takes its ids back with its rows, so the next report's rows and refs are the right ones.
    from crawler.master.store import PageOutcome

    def row(i: int, page: str) -> dict[str, Any]:
        return {"url": f"http://a.test/{i}.mp3", "page": page, "status": "ok", "node": "n", "found_at": 2.0}

    def visit(url: str, rows: list[dict[str, Any]]) -> PageOutcome:
        return PageOutcome(url, "done", 200, None, "text/html", 10, None, "n", 2.0,
                           audio_keys=sa.listed_keys(rows))

    pages = [f"http://a.test/p{i}" for i in range(3)]
    with MasterStore(store_location) as s:
        s.push([(u, 0, 0, "n", None) for u in pages])
        s.pop("n", 3, now=1.0)
        with s.atomic():
            first = [row(0, pages[0]), row(1, pages[0])]
            s.add_audio(first)
            s.finish([visit(pages[0], first)])
        s.commit()
        with pytest.raises(RuntimeError), s.atomic():
            lost = [row(2, pages[1]), row(3, pages[1])]
            s.add_audio(lost)
            s.finish([visit(pages[1], lost)])
            raise RuntimeError("a failed report")
        with s.atomic():
            again = [row(4, pages[2]), row(0, pages[0])]        # a new item and one met again
            assert s.add_audio(again) == [True, False]
            s.finish([visit(pages[2], again)])
        s.commit()
        ids = dict(s.db.execute("SELECT url, id FROM audio").fetchall())
        assert sorted(ids.values()) == [1, 2, 3]            # the failed unit's ids were given again
        assert set(ids) == {f"http://a.test/{i}.mp3" for i in (0, 1, 4)}
        refs = s.db.execute("SELECT o.origin || u.path, a.url FROM audio_refs r JOIN url_state u ON u.id = r.referrer "
                            "JOIN origins o ON o.id = u.origin JOIN audio a ON a.id = r.audio_id").fetchall()
        assert sorted(refs) == sorted([(pages[0], "http://a.test/0.mp3"), (pages[0], "http://a.test/1.mp3"),
                                       (pages[2], "http://a.test/4.mp3"), (pages[2], "http://a.test/0.mp3")])
        assert s.audio.next_id == 4
    with MasterStore(store_location) as s:       # a restart takes the next id from the table
        assert s.audio.next_id == 4
