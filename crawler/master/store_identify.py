"""Identification in the master store: the rights holder's reference works, the fingerprints of the audio the
workers stored, and the matches between them. A part of MasterStore (crawler/master/store.py), writing into the
transaction it shares with the other parts (crawler/master/store_core.py).

- ``ref_works``: one row per work (its id, title, artist, the file it was read from, its fingerprint, when added).
  A work added again replaces its row under a new id, so the fingerprints are matched against it again.
- ``fingerprints``: one row per audio address, the fingerprint of the bytes last stored from it. ``checked`` is
  the highest ``ref_works.id`` it was matched against (-1: never matched, not even against the other recordings):
  the fingerprints to match are those below the newest reference, found through an index, so a new fingerprint
  and a reference added later are the same work for the matcher (crawler/master/identify.py). ``recording``
  groups the addresses whose fingerprints match each other.
- ``matches``: one row per (audio address, work, window), first found at ``matched_at``; never for anything else.
  A file's matches are window 0. A live stream's window (live_recordings, crawler/master/store_audio.py) has its
  own fingerprint there, matched against the works only (each window is new audio: it joins no group of copies,
  whose index would grow by a window a visit), and its matches say when the work was played: ``played_at`` (the
  wall clock: the window's start plus where in it the work was heard) and ``played_seconds`` (how long it was
  heard); ``work_offset`` is then where in the work the heard part starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from crawler.logs import iso_utc
from crawler.master.store_core import CHUNK, StoreCore, chunks

REFERENCES_TABLE = """CREATE TABLE ref_works (
    id          {AUTO_ID},
    work        TEXT NOT NULL UNIQUE,
    title       TEXT,
    artist      TEXT,
    source      TEXT,                  -- the file the operator added it from
    fingerprint {BLOB} NOT NULL,
    added_at    {REAL} NOT NULL
)"""
FINGERPRINTS_TABLE = """CREATE TABLE fingerprints (
    url         TEXT PRIMARY KEY,      -- the audio address (audio.url)
    fingerprint {BLOB} NOT NULL,
    added_at    {REAL} NOT NULL,
    checked     {INT} NOT NULL,        -- the newest ref_works.id it was matched against (-1: never matched)
    recording   {INT},                 -- the group of addresses whose fingerprints match each other
    lead        {INT} NOT NULL         -- 1: the address whose fingerprint stands for its recording in the index
);
CREATE INDEX fingerprints_due ON fingerprints(checked, url);
CREATE INDEX fingerprints_leads ON fingerprints(url) WHERE lead = 1"""
MATCHES_TIME_INDEX = "CREATE INDEX matches_time ON matches(matched_at)"
MATCHES_TABLE = """CREATE TABLE matches (
    url            TEXT NOT NULL,      -- the audio address
    work           TEXT NOT NULL,      -- ref_works.work
    live_id        {INT} NOT NULL,     -- live_recordings.id of a live stream's window, 0 for a file
    score          {REAL} NOT NULL,
    work_offset    {REAL} NOT NULL,    -- seconds into the work where the copy starts
    matched_at     {REAL} NOT NULL,
    played_at      {REAL},             -- a window's: wall clock when the work was heard in it
    played_seconds {REAL},             -- a window's: for how long
    PRIMARY KEY (url, work, live_id)
);
""" + MATCHES_TIME_INDEX
# Alerts to deliver (alerts.webhook): one row per new match, written in the transaction that found it and removed
# once the webhook answered 2xx, so each is POSTed at least once, across restarts.
OUTBOX_TABLE = """CREATE TABLE alert_outbox (
    id          {AUTO_ID},
    body        TEXT NOT NULL,         -- the JSON object POSTed (the matches export's row)
    attempts    {INT} NOT NULL,
    next_try    {REAL} NOT NULL
);
CREATE INDEX alert_outbox_due ON alert_outbox(next_try)"""
# The catalogue rows of an address, for the matches' export and the rows' match.
AUDIO_URL_INDEX = "CREATE INDEX IF NOT EXISTS audio_url ON audio(url)"
IDENTIFY_TABLES = (("ref_works", REFERENCES_TABLE), ("fingerprints", FINGERPRINTS_TABLE),
                   ("matches", MATCHES_TABLE), ("alert_outbox", OUTBOX_TABLE))
SCHEMA = ";\n".join(ddl for _, ddl in IDENTIFY_TABLES) + ";\n" + AUDIO_URL_INDEX
NEVER_MATCHED = -1

# The matches' export, one row per (audio address, work, window), in this column order. For a live stream's
# window: played_at and played_seconds say when and how long the work was played, live is true, station is its
# row's title, window its live_recordings id (export --recordings) and window_offset the seconds into that
# recording where the work was heard (played_at is the window's start plus this); for a file they are null,
# false, null, null, null.
MATCH_COLUMNS = ("url", "work", "title", "artist", "score", "offset", "page", "first_seen", "last_seen",
                 "matched_at", "recording", "played_at", "played_seconds", "live", "station", "window",
                 "window_offset")
# The times of a matches export row, ISO-8601 UTC in exports and alerts.
_MATCH_TIMES = ("first_seen", "last_seen", "matched_at", "played_at")
# A work found in a fingerprint: (work, score, offset into the work) and, for a window, where in the window it was
# heard: (work, score, offset, at, length) (crawler.identify.Match).
Found = tuple[str, float, float] | tuple[str, float, float, float, float]


@dataclass(frozen=True, slots=True)
class Reference:
    work: str
    fingerprint: bytes
    title: str | None = None
    artist: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Checked:
    """What the matcher found for one stored fingerprint: the works it is a copy of (work, score, offset), the
    recording it belongs to, and the newest reference it was matched against."""

    url: str
    upto: int
    recording: int | None
    works: tuple[Found, ...] = ()
    lead: bool = False        # it started its recording: it stands for it in the recordings index
    window: int = 0           # a live stream's window (live_recordings.id): its matches say when it played


class Identification:
    """The references, fingerprints and matches tables; the match count kept in memory in the master."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        # A reader of a store from before identification (its tables are made when a master opens it) sees none.
        self.present = bool(core.db.columns("matches"))
        # A reader of a store from before the matches had windows sees every match as a file's.
        self.has_live = "live_id" in core.db.columns("matches")
        self._matches = 0
        self._next_recording = 1
        if not core.readonly and self.present:
            self._matches = int(core.db.execute("SELECT count(*) FROM matches").fetchone()[0])
            self._next_recording = int(core.db.execute(
                "SELECT coalesce(max(recording), 0) FROM fingerprints").fetchone()[0]) + 1
        core.parts.append(self)

    # -- the figures in the shared transaction (store_core.Part) --------------------------------------

    def stage(self) -> None:
        pass

    def save(self) -> object:
        return self._matches, self._next_recording

    def restore(self, saved: object) -> None:
        self._matches, self._next_recording = saved  # type: ignore[misc]

    # -- references ------------------------------------------------------------------------------------

    def add_references(self, refs: Sequence[Reference], now: float) -> int:
        """Add works, replacing those of the same id (under a new id, so every fingerprint is matched against
        them again). Returns how many were added or replaced."""
        self.core.begin()
        db = self.core.db
        for ref in refs:
            db.execute("DELETE FROM ref_works WHERE work = ?", (ref.work,))
            db.execute("INSERT INTO ref_works(work, title, artist, source, fingerprint, added_at) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (ref.work, ref.title, ref.artist, ref.source, ref.fingerprint, now))
        return len(refs)

    def remove_reference(self, work: str) -> bool:
        """Remove a work and its matches. False when there is no such work."""
        self.core.begin()
        cur = self.core.db.execute("DELETE FROM ref_works WHERE work = ?", (work,))
        if cur.rowcount < 1:
            return False
        gone = self.core.db.execute("DELETE FROM matches WHERE work = ?", (work,))
        self._matches -= max(0, gone.rowcount)
        return True

    def references(self) -> list[dict[str, Any]]:
        """Every work, without its fingerprint (for `references list`), in the order added."""
        if not self.present:
            return []
        names = ("work", "title", "artist", "source", "added_at", "fingerprint_bytes")
        return [dict(zip(names, row)) for row in self.core.db.fetchall(
            "SELECT work, title, artist, source, added_at, length(fingerprint) FROM ref_works ORDER BY id")]

    def reference_fingerprints(self, after: int = 0, limit: int = CHUNK) -> list[tuple[int, str, bytes]]:
        """(id, work, fingerprint) of the works added after `after`, oldest first, at most `limit`."""
        return [(int(i), str(w), bytes(f)) for i, w, f in self.core.db.fetchall(
            "SELECT id, work, fingerprint FROM ref_works WHERE id > ? ORDER BY id LIMIT ?", (after, limit))]

    def reference_state(self) -> tuple[int, int]:
        """(the newest reference's id, how many there are): whether the matcher's index is current."""
        top, n = self.core.db.execute("SELECT coalesce(max(id), 0), count(*) FROM ref_works").fetchone()
        return int(top), int(n)

    def reference_works(self) -> set[str]:
        return {str(w) for (w,) in self.core.db.fetchall("SELECT work FROM ref_works")}

    # -- fingerprints ----------------------------------------------------------------------------------

    def add_fingerprints(self, rows: Sequence[tuple[str, bytes]], now: float) -> None:
        """Keep the fingerprints reported with stored audio ((address, fingerprint)); an address whose bytes
        changed takes the new one, to be matched again."""
        if not rows:
            return
        self.core.begin()
        self.core.db.executemany(
            "INSERT INTO fingerprints(url, fingerprint, added_at, checked, recording, lead) VALUES (?, ?, ?, ?, NULL, 0) "
            "ON CONFLICT(url) DO UPDATE SET fingerprint = excluded.fingerprint, added_at = excluded.added_at, "
            "checked = excluded.checked, recording = NULL, lead = 0 "
            "WHERE fingerprints.fingerprint != excluded.fingerprint",
            [(url.replace("\x00", ""), fp, now, NEVER_MATCHED) for url, fp in rows if url])

    def add_window_fingerprints(self, rows: Sequence[tuple[str, str, bytes]]) -> None:
        """Keep the fingerprints reported with live streams' windows ((address, the window's sha256,
        fingerprint)): each goes to its window, to be matched (a window fingerprinted already keeps its own)."""
        if not rows:
            return
        self.core.begin()
        self.core.db.executemany(
            "UPDATE live_recordings SET fingerprint = ?, checked = ? WHERE sha256 = ? AND url = ? "
            "AND fingerprint IS NULL",
            [(fp, NEVER_MATCHED, sha, url.replace("\x00", "")) for url, sha, fp in rows if url and sha])

    def windows_to_match(self, upto: int, limit: int) -> list[tuple[int, bytes, int]]:
        """Live streams' windows not yet matched against the references up to id `upto` (or never matched):
        (window, fingerprint, checked), at most `limit`, the never matched first."""
        return [(int(i), bytes(f), int(c)) for i, f, c in self.core.db.fetchall(
            "SELECT id, fingerprint, checked FROM live_recordings WHERE checked < ? ORDER BY checked, id LIMIT ?",
            (max(upto, 0), limit))]

    def to_match(self, upto: int, limit: int) -> list[tuple[str, bytes, int | None, int]]:
        """Fingerprints not yet matched against the references up to id `upto` (or never matched at all):
        (address, fingerprint, recording, checked), at most `limit`, the never matched first."""
        return [(str(u), bytes(f), None if r is None else int(r), int(c)) for u, f, r, c in self.core.db.fetchall(
            "SELECT url, fingerprint, recording, checked FROM fingerprints WHERE checked < ? "
            "ORDER BY checked, url LIMIT ?", (max(upto, 0), limit))]

    def recordings(self, after: str = "", limit: int = CHUNK) -> list[tuple[str, int, bytes]]:
        """(address, recording, fingerprint) of the address that stands for each recording (the one that started
        it), from address `after` on: what the matcher's index of recordings is built from at start."""
        return [(str(u), int(r), bytes(f)) for u, r, f in self.core.db.fetchall(
            "SELECT url, recording, fingerprint FROM fingerprints WHERE lead = 1 AND url > ? ORDER BY url LIMIT ?",
            (after, limit))]

    def new_recording(self) -> int:
        n = self._next_recording
        self._next_recording += 1
        return n

    def record_checked(self, checked: Sequence[Checked], now: float, *, alert: bool = False) -> list[dict[str, Any]]:
        """Write what the matcher found; returns the new (address, work) matches as export rows. alert: each new
        match also goes to the alerts' outbox, as its export row (times in ISO-8601 UTC), in this transaction."""
        self.core.begin()
        db = self.core.db
        # A lead stays one when matched again (its recording known, it starts none then).
        db.executemany("UPDATE fingerprints SET checked = ?, recording = ?, "
                       "lead = CASE WHEN ? = 1 THEN 1 ELSE lead END WHERE url = ?",
                       [(c.upto, c.recording, int(c.lead), c.url) for c in checked if not c.window])
        windows = [c for c in checked if c.window]
        db.executemany("UPDATE live_recordings SET checked = ? WHERE id = ?", [(c.upto, c.window) for c in windows])
        heard = self._windows([c.window for c in windows])
        fresh: list[tuple[str, str, int]] = []
        for c in checked:
            url = c.url
            if c.window:
                if c.window not in heard:
                    continue                  # a window gone meanwhile
                url, recorded_at, duration = heard[c.window]
            for found in c.works:
                work, score, offset = found[0], found[1], found[2]
                played_at = played_seconds = None
                if c.window:
                    at, length = (found[3], found[4]) if len(found) == 5 else (0.0, 0.0)
                    at = min(max(0.0, at), duration) if duration is not None else max(0.0, at)
                    # Heard from `at`: the work's own second there (scale 1 within the matcher's 6%).
                    offset = round(offset + at, 3)
                    played_at = round(recorded_at + at, 3)
                    played_seconds = round(min(length, duration - at) if duration is not None else length, 3)
                # Only for a work still there (one removed while the matcher worked is no match).
                cur = db.execute("INSERT INTO matches(url, work, live_id, score, work_offset, matched_at, played_at, "
                                 "played_seconds) SELECT ?, work, ?, ?, ?, ?, ?, ? FROM ref_works WHERE work = ? "
                                 "ON CONFLICT(url, work, live_id) DO NOTHING",
                                 (url, c.window, float(score), float(offset), now, played_at, played_seconds, work))
                if cur.rowcount == 1:
                    fresh.append((url, work, c.window))
        self._matches += len(fresh)
        out: list[dict[str, Any]] = []
        for part in chunks(fresh, CHUNK):
            out.extend(self._export_rows(part))
        if alert and out:
            db.executemany("INSERT INTO alert_outbox(body, attempts, next_try) VALUES (?, 0, ?)",
                           [(json.dumps(alert_row(row), ensure_ascii=False, sort_keys=True), now) for row in out])
        return out

    def _windows(self, ids: Sequence[int]) -> dict[int, tuple[str, float, float | None]]:
        """window -> (its address, when it began, its duration), of those that exist."""
        out: dict[int, tuple[str, float, float | None]] = {}
        db = self.core.db
        for part in chunks(sorted(set(ids)), CHUNK):
            for i, url, recorded_at, duration in db.fetchall(
                    f"SELECT id, url, recorded_at, duration FROM live_recordings WHERE {db.in_list('id')}",
                    (db.list_arg(part),)):
                out[int(i)] = (str(url), float(recorded_at), None if duration is None else float(duration))
        return out

    # -- the alerts' outbox ----------------------------------------------------------------------------

    def due_alerts(self, now: float, limit: int) -> list[tuple[int, str, int]]:
        """(id, body, attempts) of the alerts due for delivery, oldest first."""
        return [(int(i), str(b), int(a)) for i, b, a in self.core.db.fetchall(
            "SELECT id, body, attempts FROM alert_outbox WHERE next_try <= ? ORDER BY next_try, id LIMIT ?",
            (now, limit))]

    def alert_delivered(self, ids: Sequence[int]) -> None:
        self.core.begin()
        self.core.db.executemany("DELETE FROM alert_outbox WHERE id = ?", [(i,) for i in ids])

    def alert_failed(self, retries: Sequence[tuple[int, float]]) -> None:
        """(id, next try) of alerts the webhook did not take: tried again then."""
        self.core.begin()
        self.core.db.executemany("UPDATE alert_outbox SET attempts = attempts + 1, next_try = ? WHERE id = ?",
                                 [(at, i) for i, at in retries])

    def alerts_waiting(self) -> int:
        if not self.present:
            return 0
        return int(self.core.db.execute("SELECT count(*) FROM alert_outbox").fetchone()[0])

    # -- reads -----------------------------------------------------------------------------------------

    def match_count(self) -> int:
        if not self.present:
            return 0
        if self.core.readonly:
            return int(self.core.db.execute("SELECT count(*) FROM matches").fetchone()[0])
        return self._matches

    def latest_matches(self, limit: int = 20) -> list[dict[str, Any]]:
        if not self.present:
            return []
        keys = [(str(u), str(w), int(i)) for u, w, i in self.core.db.fetchall(
            f"SELECT url, work, {self._live_id} FROM matches ORDER BY matched_at DESC, url, work{self._by_live} "
            "LIMIT ?", (limit,))]
        return self._export_rows(keys)

    @property
    def _live_id(self) -> str:
        return "live_id" if self.has_live else "0"

    @property
    def _by_live(self) -> str:
        # (A literal in ORDER BY would name a column by its place.)
        return ", live_id" if self.has_live else ""

    def export_matches(self) -> Iterator[dict[str, Any]]:
        """Every match as an export row (MATCH_COLUMNS, times in epoch seconds), oldest first; streams."""
        if not self.present:
            return 
        after: tuple[float, str, str, int] = (-1.0, "", "", -1)
        live_id = self._live_id
        while True:
            keys = self.core.db.fetchall(
                f"SELECT matched_at, url, work, {live_id} FROM matches WHERE matched_at > ? OR (matched_at = ? AND "
                f"(url > ? OR (url = ? AND (work > ? OR (work = ? AND {live_id} > ?))))) "
                f"ORDER BY matched_at, url, work{self._by_live} LIMIT ?",
                (after[0], after[0], after[1], after[1], after[2], after[2], after[3], CHUNK))
            if not keys:
                return
            after = (float(keys[-1][0]), str(keys[-1][1]), str(keys[-1][2]), int(keys[-1][3]))
            rows = self._export_rows([(str(u), str(w), int(i)) for _, u, w, i in keys])
            rows.sort(key=lambda r: (r["matched_at"], r["url"], r["work"], r["window"] or 0))
            yield from rows

    def _export_rows(self, keys: Sequence[tuple[str, str, int]]) -> list[dict[str, Any]]:
        """The export rows of matches (address, work, window). A file's row is its address's first catalogue
        row's; a window's, its own item's (its station: the row's title)."""
        out = []
        for url, work, window in keys:
            if window:
                row = self.core.db.execute(
                    "SELECT m.url, m.work, r.title, r.artist, m.score, m.work_offset, a.page, a.found_at, "
                    "a.last_seen, m.matched_at, NULL, m.played_at, m.played_seconds, a.title, "
                    "m.played_at - l.recorded_at FROM matches m "
                    "LEFT JOIN ref_works r ON r.work = m.work LEFT JOIN live_recordings l ON l.id = m.live_id "
                    "LEFT JOIN audio a ON a.id = l.audio_id "
                    "WHERE m.url = ? AND m.work = ? AND m.live_id = ?", (url, work, window)).fetchone()
            else:
                row = self.core.db.execute(
                    "SELECT m.url, m.work, r.title, r.artist, m.score, m.work_offset, a.page, a.found_at, "
                    "a.last_seen, m.matched_at, f.recording, NULL, NULL, NULL, NULL FROM matches m "
                    "LEFT JOIN ref_works r ON r.work = m.work LEFT JOIN fingerprints f ON f.url = m.url "
                    "LEFT JOIN audio a ON a.id = (SELECT min(id) FROM audio WHERE url = m.url) "
                    f"WHERE m.url = ? AND m.work = ? AND {self._live_id} = 0", (url, work)).fetchone()
            if row is not None:
                at = row[14]
                d = dict(zip(MATCH_COLUMNS, (*row[:13], bool(window), row[13] if window else None,
                                             window or None, None if at is None else round(float(at), 3))))
                out.append(d)
        return out

    def identity_of(self, urls: Sequence[str]) -> dict[str, dict[str, Any]]:
        """For catalogue rows: per address, its best match ({"work", "score", "offset"}) and its recording."""
        if not self.present:
            return {}
        out: dict[str, dict[str, Any]] = {}
        db = self.core.db
        for part in chunks(sorted({u for u in urls if u}), CHUNK):
            arg = db.list_arg(part)
            for url, recording in db.fetchall(
                    f"SELECT url, recording FROM fingerprints WHERE {db.in_list('url')}", (arg,)):
                if recording is not None:
                    out.setdefault(url, {})["recording"] = int(recording)
            # A file's matches only: a live stream's windows each hold their own (export --matches).
            for url, work, score, offset in db.fetchall(
                    f"SELECT url, work, score, work_offset FROM matches WHERE {db.in_list('url')} "
                    f"AND {self._live_id} = 0 ORDER BY url, score DESC, work", (arg,)):
                out.setdefault(url, {}).setdefault("match", {"work": work, "score": score, "offset": offset})
        return out


def alert_row(row: dict[str, Any]) -> dict[str, Any]:
    """A matches export row as exports and alerts show it: times in ISO-8601 UTC."""
    return {**row, **{k: iso_utc(row[k]) for k in _MATCH_TIMES if row.get(k) is not None}}
