"""The master's durable state: URL table, on-disk frontier, audio catalogue and node figures, in one SQLite file.

One table holds every URL the crawl has seen. Its ``state`` column says where the URL is (queued in the
frontier, leased to a node, done, or failed for good), so "every URL is in exactly one place" holds by
construction, and the frontier is a partial index over the queued rows, ordered the way a node pops them:
``(node, depth, priority DESC, seq)``. The frontier is therefore as big as the disk, and a pop is one
index range read.

Writes happen inside an open transaction that ``commit()`` ends; the master commits every 100-200 ms, so a
kill -9 loses at most what happened since the last commit, and anything lost is consistent with itself:
a page whose result was not committed is still leased, and start-up (``requeue_leased``) hands it out
again. WAL mode lets the operator's status and export commands read while the master writes.

URLs are looked up through a 64-bit key, not a text index: the key is four times smaller, and its top
bits come from the host, so the links of one page (mostly one host) land on a few index pages instead of
one random page each. Equal keys are allowed and the URL text is always compared, so lookups stay exact.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType
from typing import Any, Self

import mmh3

from crawler.items import AUDIO_FIELD_KINDS
from crawler.master.revisit import RevisitPolicy
from crawler.master.revisit import changed as page_changed
from crawler.master.revisit import gone as page_gone

SCHEMA_VERSION = 1
# PRAGMA application_id marks the file as ours ("ACRW"), so a stray SQLite file is refused, not altered.
APPLICATION_ID = 0x41435257

QUEUED, LEASED, DONE, ERROR = 0, 1, 2, 3
STATE_NAMES = {QUEUED: "queued", LEASED: "leased", DONE: "done", ERROR: "error"}
# A URL whose lease keeps being lost (its worker dies on it) is given up after max_attempts times this many.
LOST_LEASE_FACTOR = 3

Route = Callable[[Sequence[str]], list[str | None]]

# Rows per statement when the store works through a large set (reroute, requeue, lookups).
_CHUNK = 2000
# The catalogue changes counted per refresh cycle.
_CHANGE_KINDS = ("new", "changed", "removed")
# Frontier entries being rerouted are parked under this prefix + their old node: a control character no
# configured node name starts with, and not NUL, which SQLite's string functions treat as an end.
_PARK, _PARK_END = "\x1f", "\x20"

# Catalogue columns in export order, from the one field list of AudioItem (its client identity is never
# stored: cookies are secrets), plus who found the item and when. Map fields are stored as JSON text.
AUDIO_COLUMNS = (tuple(k for k, kind in AUDIO_FIELD_KINDS.items() if kind != "identity")
                 + ("node", "found_at", "last_seen", "changed_at", "removed_at"))
# found_at is when the item first appeared (exports also call it first_seen); last_seen when a visit of its page
# last showed it; changed_at when new bytes were last found at its address; removed_at when its page stopped
# linking it or went away (status "removed"). Epoch seconds here, ISO-8601 UTC in exports.
AUDIO_TIMES = ("found_at", "last_seen", "changed_at", "removed_at")
CHANGED, REMOVED = "changed", "removed"
_JSON_COLUMNS = frozenset(k for k, kind in AUDIO_FIELD_KINDS.items() if kind == "map")
_SQL_TYPES = {"text": "TEXT", "map": "TEXT", "number": "REAL"}
_COLUMN_TYPES = {**{k: _SQL_TYPES[kind] for k, kind in AUDIO_FIELD_KINDS.items() if kind != "identity"},
                 "size": "INTEGER", "bitrate": "INTEGER", "node": "TEXT", "found_at": "REAL", "last_seen": "REAL",
                 "changed_at": "REAL", "removed_at": "REAL"}
_NOT_NULL = frozenset({"page", "url", "status"})
# A repeat report of a known row fills only what the first one lacked; these are decided otherwise.
_NOT_COALESCED = frozenset({"url", "page", "status", "reason", "node", "found_at", "extra", "last_seen", "changed_at",
                            "removed_at"})
_AUDIO_TABLE = ("CREATE TABLE audio (\n    id INTEGER PRIMARY KEY,\n    ukey TEXT NOT NULL,\n"
                + "".join(f"    {c} {_COLUMN_TYPES[c]}{' NOT NULL' if c in _NOT_NULL else ''},\n"
                          for c in AUDIO_COLUMNS)
                + "    UNIQUE (ukey, page)\n);")

_INSERT_AUDIO = (f"INSERT INTO audio(ukey, {', '.join(AUDIO_COLUMNS)}) VALUES (?{', ?' * len(AUDIO_COLUMNS)}) "
                 "ON CONFLICT(ukey, page) DO NOTHING")
_COALESCED = tuple(c for c in AUDIO_COLUMNS if c not in _NOT_COALESCED)
_UPDATE_AUDIO = ("UPDATE audio SET " + "".join(f"{c} = coalesce({c}, ?), " for c in _COALESCED)
                 + "url = CASE WHEN url = '' THEN ? ELSE url END, "
                 "reason = CASE WHEN ? = 'ok' AND status NOT IN ('ok', 'changed') THEN NULL ELSE reason END, "
                 # A removed item that is back takes the new report's status; "changed" stays until it changes.
                 "status = CASE WHEN status = 'removed' THEN ? WHEN ? = 'ok' AND status != 'changed' THEN 'ok' "
                 "ELSE status END, last_seen = ?, removed_at = NULL "
                 "WHERE id = ?")

# Revisits (crawler/master/revisit.py): urls.next_visit says when a fetched page is due again, found through a
# partial index over the done pages that have one (none while refresh is off); everything else a revisit needs
# lives in page_visits, one row per fetched page only (never for queued URLs), so the URL table grows by one
# REAL a fetched page, and by nothing while refresh is off.
_REVISIT_SCHEMA = f"""
CREATE INDEX IF NOT EXISTS refresh_due ON urls(next_visit) WHERE state = {DONE} AND next_visit IS NOT NULL;
CREATE TABLE IF NOT EXISTS page_visits (
    id            INTEGER PRIMARY KEY,   -- urls.id
    etag          TEXT,                  -- the validators of the last full answer, sent back as
    last_modified TEXT,                  --   If-None-Match / If-Modified-Since
    digest        INTEGER,               -- 64-bit hash of the last 2xx body: did the page change
    interval      REAL,                  -- the current wait between visits
    hub           INTEGER NOT NULL DEFAULT 0,   -- the last full visit found audio on it
    changed_at    REAL,                  -- when a visit last found it changed
    gone_at       REAL                   -- when it went (404/410 or a redirect away); NULL while it is there
);"""
# The catalogue's history: the bytes an address served before it changed, and the page index that finds a
# page's items when it is visited again.
_HISTORY_SCHEMA = """
CREATE TABLE IF NOT EXISTS audio_history (
    audio_id    INTEGER NOT NULL,        -- audio.id
    sha256      TEXT NOT NULL,
    size        INTEGER,
    path        TEXT,
    replaced_at REAL NOT NULL            -- when other bytes were found at the address
);
CREATE INDEX IF NOT EXISTS audio_history_item ON audio_history(audio_id);
CREATE INDEX IF NOT EXISTS audio_page ON audio(page);
CREATE INDEX IF NOT EXISTS audio_changes ON audio(coalesce(removed_at, changed_at, found_at));"""

_SCHEMA = f"""
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE urls (
    id           INTEGER PRIMARY KEY,
    key          INTEGER NOT NULL,
    url          TEXT NOT NULL,
    depth        INTEGER NOT NULL,
    priority     INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    slot         INTEGER,
    state        INTEGER NOT NULL,
    node         TEXT,
    parent       TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    leased_at    REAL,
    last_crawl   REAL,
    http_status  INTEGER,
    final_url    TEXT,
    content_type TEXT,
    size         INTEGER,
    error        TEXT,
    lastmod      REAL,
    next_visit   REAL
);
CREATE INDEX urls_key ON urls(key);
CREATE INDEX frontier_pop ON urls(node, depth, priority DESC, seq) WHERE state = {QUEUED};
CREATE INDEX frontier_slots ON urls(slot) WHERE state = {QUEUED};
CREATE INDEX leases ON urls(node) WHERE state = {LEASED};
CREATE INDEX refresh ON urls(last_crawl) WHERE state = {DONE};
{_REVISIT_SCHEMA}
-- The frontier as rows, for ad hoc SQL and for tools that expect a table of entries.
CREATE VIEW frontier AS
    SELECT seq, id AS url_id, node, depth, priority FROM urls WHERE state = {QUEUED};
-- Row counts by (state, node), kept in the same transactions as the rows they count, so status and
-- frontier_size never scan the URL table. node '' stands for "not routed".
CREATE TABLE counts (
    state INTEGER NOT NULL,
    node  TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (state, node)
) WITHOUT ROWID;
CREATE TABLE discards (
    reason TEXT PRIMARY KEY,
    n      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE node_stats (
    node  TEXT NOT NULL,
    name  TEXT NOT NULL,
    value INTEGER NOT NULL,
    PRIMARY KEY (node, name)
) WITHOUT ROWID;
{_AUDIO_TABLE}
CREATE INDEX audio_sha ON audio(sha256) WHERE sha256 IS NOT NULL;
{_HISTORY_SCHEMA}
"""


class StoreError(Exception):
    """The store cannot be used as asked: not our database, a newer schema, held by another master, read-only."""


class StoreBusy(StoreError):
    """Another master process holds the store."""


class ReadOnlyStoreError(StoreError, sqlite3.OperationalError):
    """A write through a store opened with open_readonly()."""


@dataclass(frozen=True)
class Finished:
    """A node's verdict on one leased URL."""

    url: str
    state: str                    # "done" | "error" | "retry" | "throttled" (a retry that costs no attempt)
    http_status: int | None
    final_url: str | None
    content_type: str | None
    size: int | None
    error: str | None
    node: str
    at: float
    # What a page visit brings for revisits and the catalogue's history (see finish()).
    etag: str | None = None
    last_modified: str | None = None
    digest: int | None = None           # 64-bit hash of a 2xx body
    audio_keys: frozenset[str] | None = None   # the catalogue keys of the audio the page itself showed


_MASK44 = (1 << 44) - 1


def url_key(url: str) -> int:
    """The 64-bit lookup key of a URL: 20 bits of host hash, then 44 bits of URL hash (as a signed int64)."""
    rest = url.partition("://")[2]
    host = rest.partition("/")[0]
    high = mmh3.hash(host, signed=False) >> 12
    low = mmh3.hash64(url, signed=False)[0] & _MASK44
    return ((high << 44) | low) - (1 << 63)


def _node_key(node: str | None) -> str:
    return "" if node is None else node


def _node_of(key: str) -> str | None:
    return None if key == "" else key


def _chunks(seq: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


def _audio_ukey(row: Mapping[str, Any]) -> str:
    # A site's own id outlives its download links (they expire and carry per-client tokens), so it
    # identifies the item better than the URL when the resolver knows it.
    source_id = row.get("source_id")
    if source_id:
        return f"{row.get('resolver') or ''}:{source_id}"
    return row.get("url") or ""


def page_keys(page: str, rows: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The catalogue keys of the audio a visit of `page` showed on the page itself (see _remove_unlisted)."""
    return frozenset(_audio_ukey(r) for r in rows if r.get("page") == page)


class MasterStore:
    """The master's SQLite store. Used from one thread; write methods join the open transaction."""

    def __init__(self, path: Path | str, *, max_attempts: int = 3, slot_of: Callable[[str], int] | None = None,
                 cache_mb: int = 64, checkpoint_pages: int = 10_000, _readonly: bool = False) -> None:
        """Open or create the store at `path`.

        max_attempts: failed tries ("retry" results) before a URL is given up as an error; a URL whose lease
        is lost max_attempts * LOST_LEASE_FACTOR times (its worker keeps dying on it) is given up too.
        slot_of: the scheduler's first hash (URL -> slot of the node table); recorded at push so that
        reroute_slots() finds a slot's entries through an index.
        """
        self.path = Path(path)
        self.max_attempts = max_attempts
        self._slot_of = slot_of
        self.readonly = _readonly
        self._lock_fd: int | None = None
        self._counts: dict[tuple[int, str], int] = {}
        self._audio_counts: dict[str, int] = {}     # catalogue rows by status, so status() never scans the table
        self._dirty_counts: set[tuple[int, str]] = set()
        self._next_seq = 0
        self._seq_dirty = False
        # This refresh cycle's catalogue changes: {"start": time, "new": n, "changed": n, "removed": n}, saved
        # under the meta key "cycle" with each commit that changed it.
        self._cycle: dict[str, Any] = {}
        self._cycle_dirty = False
        if _readonly:
            if not self.path.exists():
                raise StoreError(f"{self.path}: no such store")
            self._check_header()
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._check_header()
            self._take_lock()
            self.db = sqlite3.connect(self.path, isolation_level=None)
        try:
            self.db.execute("PRAGMA busy_timeout = 5000")
            self.db.execute(f"PRAGMA cache_size = {-cache_mb * 1024}")
            self._open_schema()
            if not _readonly:
                self.db.execute("PRAGMA journal_mode = WAL")
                self.db.execute("PRAGMA synchronous = NORMAL")
                self.db.execute(f"PRAGMA wal_autocheckpoint = {checkpoint_pages}")
                self._load_counts()
                self._load_audio_counts()
                self._next_seq = int(self.get_meta("next_seq", 0))
                self._cycle = dict(self.get_meta("cycle", {}))
        except sqlite3.DatabaseError as e:
            self.db.close()
            self._release_lock()
            raise StoreError(f"{self.path}: not a crawl database ({e})") from e
        except BaseException:
            self.db.close()
            self._release_lock()
            raise

    @classmethod
    def open_readonly(cls, path: Path | str) -> MasterStore:
        """A reader for the status/export commands; works beside a running master (WAL) and after it stopped."""
        return cls(path, _readonly=True)

    # -- opening -------------------------------------------------------------------------------------

    def _check_header(self) -> None:
        # sqlite3 opens anything lazily and only fails on the first query with a terse message; look first.
        try:
            with open(self.path, "rb") as f:
                head = f.read(16)
        except FileNotFoundError:
            return
        if head and head != b"SQLite format 3\x00":
            raise StoreError(f"{self.path}: not a crawl database (not an SQLite file)")

    def _take_lock(self) -> None:
        # Two masters on one store would each trust their own in-memory counters; refuse the second.
        # flock dies with the process, so a killed master never leaves a stale lock behind.
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusy(f"{self.path}: in use by another master process") from None
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _open_schema(self) -> None:
        self._audio_select = ", ".join(AUDIO_COLUMNS)
        self._lastmod_select = "lastmod"
        app_id = self.db.execute("PRAGMA application_id").fetchone()[0]
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        if app_id == 0 and version == 0:
            has_tables = self.db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if has_tables:
                raise StoreError(f"{self.path}: an SQLite database, but not a crawl database")
            if self.readonly:
                raise StoreError(f"{self.path}: empty database, not a crawl database")
            # One transaction, so a crash mid-creation leaves an empty file, not half a schema.
            self.db.executescript(f"BEGIN IMMEDIATE; {_SCHEMA}; PRAGMA application_id = {APPLICATION_ID}; "
                                  f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
            return
        if app_id != APPLICATION_ID:
            raise StoreError(f"{self.path}: an SQLite database, but not a crawl database")
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path}: schema version {version} is newer than this program's "
                             f"({SCHEMA_VERSION}); upgrade the crawler")
        present = {row[1] for row in self.db.execute("PRAGMA table_info(audio)")}
        missing = [c for c in AUDIO_COLUMNS if c not in present]
        url_columns = {row[1] for row in self.db.execute("PRAGMA table_info(urls)")}
        if (missing or "lastmod" not in url_columns or "next_visit" not in url_columns) and not self.readonly:
            # A file from before a field was added: the new columns start empty. ADD COLUMN only edits the
            # table's definition, so this is instant whatever the table's size. (Pages done before revisits
            # were tracked get their next visit from schedule_unscheduled() once refresh is on.)
            self.db.executescript(
                "BEGIN IMMEDIATE; "
                + "".join(f"ALTER TABLE audio ADD COLUMN {c} {_COLUMN_TYPES[c]}; " for c in missing)
                + ("ALTER TABLE urls ADD COLUMN lastmod REAL; " if "lastmod" not in url_columns else "")
                + ("ALTER TABLE urls ADD COLUMN next_visit REAL; " if "next_visit" not in url_columns else "")
                + f"{_REVISIT_SCHEMA} {_HISTORY_SCHEMA} COMMIT;")
            missing = []
        # A reader of an older file that it may not alter sees the missing columns as null.
        self._audio_select = ", ".join("NULL" if c in missing else c for c in AUDIO_COLUMNS)
        self._lastmod_select = "lastmod" if "lastmod" in url_columns or not self.readonly else "NULL AS lastmod"

    def _load_audio_counts(self) -> None:
        self._audio_counts = dict(self.db.execute("SELECT status, count(*) FROM audio GROUP BY status"))

    def _load_counts(self) -> None:
        self._counts = {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        self._dirty_counts.clear()

    # -- transactions --------------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"{self.path}: opened read-only")
        if not self.db.in_transaction:
            self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """End the open transaction: everything written since the last commit becomes durable at once."""
        if self.readonly or not self.db.in_transaction:
            return
        if self._dirty_counts:
            self.db.executemany(
                "INSERT INTO counts(state, node, n) VALUES (?, ?, ?) "
                "ON CONFLICT(state, node) DO UPDATE SET n = excluded.n",
                [(s, n, self._counts.get((s, n), 0)) for s, n in self._dirty_counts])
            self._dirty_counts.clear()
        if self._seq_dirty:
            self._write_meta("next_seq", self._next_seq)
            self._seq_dirty = False
        if self._cycle_dirty:
            self._write_meta("cycle", self._cycle)
            self._cycle_dirty = False
        self.db.execute("COMMIT")

    def rollback(self) -> None:
        """Drop everything since the last commit (after a failed write), and the counters with it."""
        if self.readonly:
            return
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self._load_counts()
        self._load_audio_counts()
        self._next_seq = int(self.get_meta("next_seq", 0))
        self._seq_dirty = False
        self._cycle = dict(self.get_meta("cycle", {}))
        self._cycle_dirty = False

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A unit inside the open transaction (one report): if it raises, everything it wrote is undone, the
        counters with it, and the rest of the transaction stays."""
        self._begin()
        saved = (dict(self._counts), set(self._dirty_counts), self._next_seq, self._seq_dirty,
                 dict(self._audio_counts), dict(self._cycle), self._cycle_dirty)
        self.db.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO unit")
            self.db.execute("RELEASE unit")
            (self._counts, self._dirty_counts, self._next_seq, self._seq_dirty, self._audio_counts, self._cycle,
             self._cycle_dirty) = saved
            raise
        self.db.execute("RELEASE unit")

    def close(self) -> None:
        """Commit what is open and close; a stopped master leaves nothing half-written."""
        try:
            self.commit()
        finally:
            self.db.close()
            self._release_lock()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _move(self, state_from: int | None, node_from: str | None, state_to: int, node_to: str | None,
              n: int = 1) -> None:
        if state_from is not None:
            k = (state_from, _node_key(node_from))
            self._counts[k] = self._counts.get(k, 0) - n
            self._dirty_counts.add(k)
        k = (state_to, _node_key(node_to))
        self._counts[k] = self._counts.get(k, 0) + n
        self._dirty_counts.add(k)

    def _take_seq(self) -> int:
        self._next_seq += 1
        self._seq_dirty = True
        return self._next_seq

    # -- URL table and frontier ----------------------------------------------------------------------

    def _lookup(self, urls: Iterable[str], columns: str) -> dict[str, tuple]:
        """Rows of the given URLs that exist, keyed by URL; `columns` must start with url."""
        out: dict[str, tuple] = {}
        wanted = set(urls)
        keys = list({url_key(u) for u in wanted})
        sql = f"SELECT {columns} FROM urls WHERE key IN (SELECT value FROM json_each(?))"
        for chunk in _chunks(keys):
            for row in self.db.execute(sql, (json.dumps(chunk),)):
                if row[0] in wanted:
                    out[row[0]] = row
        return out

    def known(self, urls: Sequence[str]) -> set[str]:
        """Which of these URLs the URL table holds, whatever their state (exact, not probabilistic)."""
        return set(self._lookup(urls, "url"))

    def push(self, rows: Sequence[tuple[str, int, int, str | None, str | None]]) -> int:
        """Queue (url, depth, priority, node, parent) rows; URLs the table already holds are ignored.

        Returns how many were new.
        """
        self._begin()
        fresh: dict[str, tuple[str, int, int, str | None, str | None]] = {}
        for row in rows:
            fresh.setdefault(row[0], row)
        for url in self.known(list(fresh)):
            del fresh[url]
        if not fresh:
            return 0
        slot_of = self._slot_of
        inserts = []
        for url, depth, priority, node, parent in fresh.values():
            slot = slot_of(url) if slot_of is not None else None
            inserts.append((url_key(url), url, depth, priority, self._take_seq(), slot, node, parent))
            self._move(None, None, QUEUED, node)
        self.db.executemany(
            f"INSERT INTO urls(key, url, depth, priority, seq, slot, state, node, parent) "
            f"VALUES (?, ?, ?, ?, ?, ?, {QUEUED}, ?, ?)", inserts)
        return len(inserts)

    def note_lastmod(self, pairs: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
        """Record when pages last changed, as their site's sitemap says. Returns (url, depth) of the done
        pages that changed after their last crawl: what a refreshing crawl should fetch again now.

        Only URLs the table holds are touched: a link the URL policy discarded has no row."""
        self._begin()
        latest: dict[str, float] = {}
        for u, t in pairs:
            latest[u] = max(t, latest.get(u, t))
        changed = [(u, depth) for u, depth, state, last_crawl in
                   self._lookup(latest, "url, depth, state, last_crawl").values()
                   if state == DONE and last_crawl is not None and latest[u] > last_crawl]
        items = list(latest.items())
        for i in range(0, len(items), _CHUNK):
            self.db.executemany("UPDATE urls SET lastmod = ? WHERE key = ? AND url = ?",
                                [(t, url_key(u), u) for u, t in items[i:i + _CHUNK]])
        return changed

    def pop(self, node: str | None, n: int, now: float, max_depth: int | None = None, *,
            validators: bool = False) -> list[tuple]:
        """Lease up to n of this node's frontier entries: lowest depth, then highest priority, then oldest;
        with max_depth, none deeper (the crawl's level barrier).

        Returns (url, depth, parent) rows; with validators, (url, depth, parent, (etag, last_modified) or None),
        the validators of the page's last full answer for a conditional fetch.
        """
        self._begin()
        where = "u.node IS NULL" if node is None else "u.node = ?"
        args: tuple = () if node is None else (node,)
        if max_depth is not None:
            where += " AND u.depth <= ?"
            args += (max_depth,)
        args += (n,)
        cols, join = "u.id, u.url, u.depth, u.parent", ""
        if validators:
            cols, join = cols + ", v.etag, v.last_modified", " LEFT JOIN page_visits v ON v.id = u.id"
        rows = self.db.execute(
            f"SELECT {cols} FROM urls u{join} WHERE u.state = {QUEUED} AND {where} "
            f"ORDER BY u.depth, u.priority DESC, u.seq LIMIT ?", args).fetchall()
        if not rows:
            return []
        self.db.executemany(f"UPDATE urls SET state = {LEASED}, leased_at = ? WHERE id = ?",
                             [(now, r[0]) for r in rows])
        self._move(QUEUED, node, LEASED, node, len(rows))
        if validators:
            return [(r[1], r[2], r[3], (r[4], r[5]) if r[4] is not None or r[5] is not None else None)
                    for r in rows]
        return [(url, depth, parent) for _, url, depth, parent in rows]

    def lowest_queued_depth(self) -> int | None:
        """The smallest depth in the frontier, over every node (None: the frontier is empty). One index seek a
        node (frontier_pop leads with node, depth); asked only when a level of the crawl may be done."""
        self._begin()
        nodes = [n for (state, n), c in self._current_counts().items() if state == QUEUED and c > 0]
        best: int | None = None
        for key in nodes:
            node = _node_of(key)
            if node is None:
                row = self.db.execute(f"SELECT min(depth) FROM urls WHERE state = {QUEUED} AND node IS NULL").fetchone()
            else:
                row = self.db.execute(f"SELECT min(depth) FROM urls WHERE state = {QUEUED} AND node = ?",
                                      (node,)).fetchone()
            if row[0] is not None and (best is None or row[0] < best):
                best = row[0]
        return best

    def frontier_size(self, node: str | None | EllipsisType = ...) -> int:
        """Queued URLs: all of them, or those routed to one node (None: not routed to any)."""
        counts = self._current_counts()
        if node is ...:
            return sum(c for (s, _), c in counts.items() if s == QUEUED)
        return counts.get((QUEUED, _node_key(node)), 0)

    def frontier_empty(self) -> bool:
        return self.frontier_size() == 0

    def reroute(self, nodes: Collection[str | None], route: Route) -> int:
        """Route again the frontier entries of these nodes (the live set changed). Returns how many moved."""
        names = [n for n in nodes if n is not None]
        conds = []
        if names:
            conds.append(f"node IN ({','.join('?' * len(names))})")
        if any(n is None for n in nodes):
            conds.append("node IS NULL")
        if not conds:
            return 0
        return self._reroute_where(" OR ".join(conds), names, route)

    def reset_routing(self) -> int:
        """The node table changed between runs: every queued entry forgets its node and its slot, so they are
        routed again as nodes join (entries without a slot are part of every reroute_slots)."""
        nodes = [_node_of(node) for (state, node), n in self._current_counts().items()
                 if state == QUEUED and n and node]
        moved = self.reroute(nodes, lambda urls: [None] * len(urls)) if nodes else 0
        self._begin()
        self.db.execute(f"UPDATE urls SET slot = NULL WHERE state = {QUEUED}")
        return moved

    def reroute_slots(self, slots: Collection[int], route: Route) -> int:
        """Route again the frontier entries whose URL hashes to one of these slots of the node table.

        Needs the store opened with slot_of. Entries pushed without a slot are included: they may be anywhere.
        """
        if self._slot_of is None:
            raise StoreError("reroute_slots needs the store opened with slot_of")
        wanted = sorted({int(s) for s in slots})
        if not wanted:
            return 0
        cond = f"slot IN ({','.join(map(str, wanted))}) OR slot IS NULL"
        return self._reroute_where(cond, [], route)

    def _reroute_where(self, cond: str, args: Sequence[Any], route: Route) -> int:
        self._begin()
        # Park the entries first (node = marker + old node), then drain the parking range in chunks: an
        # entry that routes back to its own node is not met again, and memory stays bounded however big
        # the frontier is. The parked names never outlive this call, so no commit can see them.
        self.db.execute(
            f"UPDATE urls SET node = ? || coalesce(node, '') WHERE state = {QUEUED} AND ({cond})", (_PARK, *args))
        moved = 0
        while True:
            rows = self.db.execute(
                f"SELECT id, url, node FROM urls WHERE state = {QUEUED} AND node >= ? AND node < ? LIMIT ?",
                (_PARK, _PARK_END, _CHUNK)).fetchall()
            if not rows:
                return moved
            targets = route([r[1] for r in rows])
            self.db.executemany("UPDATE urls SET node = ? WHERE id = ?",
                                [(t, r[0]) for r, t in zip(rows, targets, strict=True)])
            for (_, _, parked), target in zip(rows, targets):
                old = _node_of(parked[1:])
                if target != old:
                    self._move(QUEUED, old, QUEUED, target)
                    moved += 1

    def release(self, urls: Sequence[str], route: Route) -> int:
        """Leased URLs back to the frontier (lease expired, node died), counting an attempt; depth,
        priority, parent and place in line are kept. A URL whose lease was lost max_attempts *
        LOST_LEASE_FACTOR times becomes an error instead: a page that kills its worker must not kill them all.
        Returns how many went back to the frontier."""
        self._begin()
        rows = [r for r in self._lookup(urls, "url, id, node, state, attempts").values() if r[3] == LEASED]
        limit = self.max_attempts * LOST_LEASE_FACTOR
        doomed = [r for r in rows if r[4] + 1 >= limit]
        if doomed:
            self.db.executemany(
                f"UPDATE urls SET state = {ERROR}, attempts = attempts + 1, leased_at = NULL, error = ? WHERE id = ?",
                [("lease lost too often (a worker may be dying on it)", r[1]) for r in doomed])
            for r in doomed:
                self._move(LEASED, r[2], ERROR, r[2])
        return self._requeue_rows([r for r in rows if r[4] + 1 < limit], route, attempt=True)

    def unlease(self, urls: Sequence[str], route: Route) -> int:
        """Leased URLs that were never sent to a node back in line without counting an attempt (the node that
        popped them is not the one the double hash names any more). Returns how many went back."""
        self._begin()
        rows = [r for r in self._lookup(urls, "url, id, node, state").values() if r[3] == LEASED]
        return self._requeue_rows(rows, route, attempt=False)

    def requeue_leased(self, route: Route) -> int:
        """At start-up: every URL still leased (its result died with the old master) goes back in line."""
        self._begin()
        total = 0
        while True:
            rows = self.db.execute(
                f"SELECT url, id, node, state FROM urls WHERE state = {LEASED} LIMIT ?", (_CHUNK,)).fetchall()
            if not rows:
                return total
            total += self._requeue_rows(rows, route, attempt=False)

    def _requeue_rows(self, rows: Sequence[tuple], route: Route, *, attempt: bool) -> int:
        if not rows:
            return 0
        targets = route([r[0] for r in rows])
        bump = 1 if attempt else 0
        self.db.executemany(
            f"UPDATE urls SET state = {QUEUED}, node = ?, attempts = attempts + {bump}, leased_at = NULL "
            f"WHERE id = ?", [(t, r[1]) for r, t in zip(rows, targets, strict=True)])
        for r, t in zip(rows, targets):
            self._move(LEASED, r[2], QUEUED, t)
        return len(rows)

    def finish(self, results: Sequence[Finished], revisit: RevisitPolicy | None = None) -> list[bool]:
        """Record the nodes' results. True where the result was taken: the URL was leased (or back in line
        after its lease was given up); False for a repeat or late result of a URL already settled, or of
        a URL the store does not know. "retry" requeues on the same node until max_attempts, then "error";
        "throttled" (the site said 429/503) requeues on the same node without counting an attempt.

        With a revisit policy (refresh on), a done page also gets its next visit and its page_visits row, and
        a visit of a page seen before updates the catalogue: see _visited().
        """
        self._begin()
        current = {u: [i, st, node, att, status, last] for u, i, st, node, att, status, last in
                   self._lookup([r.url for r in results],
                                "url, id, state, node, attempts, http_status, last_crawl").values()}
        visits: list[tuple[Finished, int, int | None, float | None]] = []
        out: list[bool] = []
        for res in results:
            row = current.get(res.url)
            if row is None or row[1] in (DONE, ERROR):
                out.append(False)
                continue
            row_id, state, node, attempts = row[:4]
            if revisit is not None and res.state == "done":
                visits.append((res, row_id, row[4], row[5]))
            if res.state in ("retry", "throttled"):
                # A retry only counts from the node holding the lease; otherwise the URL is already in
                # line or out with another node, whose answer is still to come.
                if state != LEASED or node != res.node:
                    out.append(False)
                    continue
                if res.state == "retry":
                    attempts += 1
                new_state = ERROR if attempts >= self.max_attempts else QUEUED
            elif res.state in ("done", "error"):
                new_state = DONE if res.state == "done" else ERROR
            else:
                raise ValueError(f"unknown result state {res.state!r}")
            new_node = node if new_state == QUEUED else res.node
            seq_sql = ", seq = ?" if new_state == QUEUED else ""
            args: list[Any] = [new_state, new_node, attempts, res.at, res.http_status, res.final_url,
                               res.content_type, res.size, res.error]
            if new_state == QUEUED:
                args.append(self._take_seq())
            self.db.execute(
                f"UPDATE urls SET state = ?, node = ?, attempts = ?, leased_at = NULL, last_crawl = ?, "
                f"http_status = ?, final_url = ?, content_type = ?, size = ?, error = ?{seq_sql} WHERE id = ?",
                (*args, row_id))
            self._move(state, node, new_state, new_node)
            row[1], row[2], row[3] = new_state, new_node, attempts
            out.append(True)
        if visits:
            assert revisit is not None
            self._visited(visits, revisit)
        return out

    def _visited(self, visits: Sequence[tuple[Finished, int, int | None, float | None]],
                 policy: RevisitPolicy) -> None:
        """Done pages (result, url id, last HTTP status, last crawl): their next visit and page_visits row; on a
        revisit the catalogue follows the page: a 304 confirms its items, a gone page removes them, a full
        answer removes the items it no longer shows."""
        prev: dict[int, tuple] = {}
        ids = [v[1] for v in visits]
        for chunk in _chunks(ids):
            for row in self.db.execute(
                    "SELECT id, etag, last_modified, digest, interval, hub, changed_at, gone_at FROM page_visits "
                    "WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(list(chunk)),)):
                prev[row[0]] = row
        upserts, next_visits = [], []
        confirmed: list[str] = []
        listed: dict[str, frozenset[str]] = {}
        for res, row_id, last_status, last_crawl in visits:
            _, etag, lastmod, digest, interval, hub, changed_at, gone_at = prev.get(row_id, (None,) * 8)
            status, at = res.http_status, res.at
            seen_before = last_crawl is not None
            changed = seen_before and page_changed(status, res.digest, last_status, digest)
            if status == 304:   # the page as it was: keep what its full answer said
                etag, lastmod = res.etag or etag, res.last_modified or lastmod
                if seen_before:
                    confirmed.append(res.url)
            else:
                etag, lastmod, digest = res.etag, res.last_modified, res.digest
                hub = 1 if res.audio_keys else 0
                if seen_before and page_gone(status):
                    listed[res.url] = frozenset()
                elif seen_before and status is not None and 200 <= status < 300 and res.audio_keys is not None:
                    listed[res.url] = res.audio_keys
            if page_gone(status):
                gone_at = gone_at if gone_at is not None else at
            elif status is not None and status < 300 or status == 304:
                gone_at = None
            if changed:
                changed_at = at
            hub = hub or 0
            interval = policy.interval(interval, changed, bool(hub))
            upserts.append((row_id, etag, lastmod, digest, interval, hub, changed_at, gone_at))
            next_visits.append((at + interval, row_id))
        self.db.executemany(
            "INSERT OR REPLACE INTO page_visits(id, etag, last_modified, digest, interval, hub, changed_at, gone_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", upserts)
        self.db.executemany("UPDATE urls SET next_visit = ? WHERE id = ?", next_visits)
        at = visits[0][0].at
        if confirmed:
            self.db.execute(f"UPDATE audio SET last_seen = ? WHERE page IN (SELECT value FROM json_each(?)) "
                            f"AND status != '{REMOVED}'", (at, json.dumps(confirmed)))
        if listed:
            self._remove_unlisted(listed, at)

    def _remove_unlisted(self, listed: Mapping[str, frozenset[str]], at: float) -> None:
        """Catalogue items of these pages that their visit no longer showed become "removed". Items found at an
        address the page linked and that a task of its own showed to be audio (found_in "response") are not
        listed by the page's own visit, so they are left to that address."""
        gone: list[tuple[int, str]] = []
        for chunk in _chunks(list(listed)):
            for row_id, page, ukey, status in self.db.execute(
                    f"SELECT id, page, ukey, status FROM audio WHERE page IN (SELECT value FROM json_each(?)) "
                    f"AND status != '{REMOVED}' "
                    "AND coalesce(json_extract(extra, '$.found_in'), '') != 'response'", (json.dumps(list(chunk)),)):
                if ukey not in listed[page]:
                    gone.append((row_id, status))
        if not gone:
            return
        self.db.executemany(f"UPDATE audio SET status = '{REMOVED}', removed_at = ? WHERE id = ?",
                            [(at, i) for i, _ in gone])
        for _, status in gone:
            self._count_audio(status, REMOVED)
        self._note_change(REMOVED, len(gone))

    def retry_errors(self, route: Route, contains: str | None = None, after: int = 0,
                     limit: int = _CHUNK) -> tuple[int, int | None]:
        """Failed URLs (state error) back in line with their attempts reset, optionally only those whose error
        contains `contains`. Works through the table in id order, `limit` rows a call: returns how many went back
        and the id to continue after, or None when the table is done."""
        self._begin()
        cond, args = "", (after,)   # type: tuple[str, tuple[Any, ...]]
        if contains:
            cond, args = " AND instr(error, ?) > 0", (after, contains)
        rows = self.db.execute(
            f"SELECT url, id, node FROM urls WHERE id > ? AND state = {ERROR}{cond} ORDER BY id LIMIT ?",
            (*args, limit)).fetchall()
        if not rows:
            return 0, None
        targets = route([r[0] for r in rows])
        self.db.executemany(
            f"UPDATE urls SET state = {QUEUED}, node = ?, attempts = 0, leased_at = NULL, error = NULL, seq = ? "
            f"WHERE id = ?", [(t, self._take_seq(), r[1]) for r, t in zip(rows, targets, strict=True)])
        for r, t in zip(rows, targets):
            self._move(ERROR, r[2], QUEUED, t)
        return len(rows), rows[-1][1]

    def failed(self) -> Iterator[dict[str, Any]]:
        """The URLs given up as errors, with why, in the order they were found (streams)."""
        cols = ("url", "error", "http_status", "attempts", "node", "last_crawl", "depth", "parent")
        cur = self.db.execute(f"SELECT {', '.join(cols)} FROM urls WHERE state = {ERROR} ORDER BY id")
        while batch := cur.fetchmany(1000):
            for row in batch:
                yield dict(zip(cols, row))

    def due_for_refresh(self, now: float, older_than: float, limit: int) -> list[tuple[str, int]]:
        """Done pages last crawled before now - older_than, oldest first: (url, depth)."""
        return self.db.execute(
            f"SELECT url, depth FROM urls WHERE state = {DONE} AND last_crawl < ? ORDER BY last_crawl LIMIT ?",
            (now - older_than, limit)).fetchall()

    def lower_depths(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
        """Known URLs found on a shorter path: (url, depth) rows whose recorded depth is larger get this one.
        Returns (url, old depth, new depth) of the done pages lowered, which the crawl may fetch again."""
        self._begin()
        want: dict[str, int] = {}
        for u, d in pairs:
            want[u] = min(d, want.get(u, d))
        rows = [r for r in self._lookup(want, "url, id, depth, state").values() if want[r[0]] < r[2]]
        if not rows:
            return []
        self.db.executemany("UPDATE urls SET depth = ? WHERE id = ?", [(want[r[0]], r[1]) for r in rows])
        return [(r[0], r[2], want[r[0]]) for r in rows if r[3] == DONE]

    def requeue_refresh(self, rows: Sequence[tuple[str, int]], route: Route) -> int:
        """Put done pages back at the end of the line for a fresh crawl (past the Bloom filter)."""
        self._begin()
        depth_of = dict(rows)
        found = [r for r in self._lookup(depth_of, "url, id, node, state").values() if r[3] == DONE]
        if not found:
            return 0
        targets = route([r[0] for r in found])
        self.db.executemany(
            f"UPDATE urls SET state = {QUEUED}, node = ?, depth = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(t, depth_of[r[0]], self._take_seq(), r[1]) for r, t in zip(found, targets, strict=True)])
        for r, t in zip(found, targets):
            self._move(DONE, r[2], QUEUED, t)
        return len(found)

    def requeue_due(self, now: float, route: Route, limit: int = _CHUNK) -> list[float]:
        """Done pages whose next visit is due (next_visit <= now), most overdue first, back in line for a fresh
        crawl (past the Bloom filter), at most `limit` a call, through the next-visit index. Returns how late
        each one is (now - next_visit): the caller calls again while a full batch came back."""
        self._begin()
        rows = self.db.execute(
            f"SELECT id, url, node, next_visit FROM urls WHERE state = {DONE} AND next_visit <= ? "
            "ORDER BY next_visit LIMIT ?", (now, limit)).fetchall()
        if not rows:
            return []
        targets = route([r[1] for r in rows])
        self.db.executemany(
            f"UPDATE urls SET state = {QUEUED}, node = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(t, self._take_seq(), r[0]) for r, t in zip(rows, targets, strict=True)])
        for r, t in zip(rows, targets):
            self._move(DONE, r[2], QUEUED, t)
        return [now - r[3] for r in rows]

    def schedule_unscheduled(self, refresh: bool) -> int:
        """Call at start with whether refresh is on. Once it is switched on, done pages with no next visit
        (fetched while it was off) are due from their last crawl on: one pass over the table, only the first
        time after a run without refresh."""
        self._begin()
        scheduled = bool(self.get_meta("revisits_scheduled", False))
        if refresh == scheduled:
            return 0
        self._write_meta("revisits_scheduled", refresh)
        if not refresh:
            return 0
        return self.db.execute(f"UPDATE urls SET next_visit = coalesce(last_crawl, 0) "
                               f"WHERE state = {DONE} AND next_visit IS NULL").rowcount

    def page_visit(self, url: str) -> dict[str, Any] | None:
        """The revisit record of one fetched page (for the operator and for tests)."""
        cur = self.db.execute(
            "SELECT u.next_visit, v.etag, v.last_modified, v.digest, v.interval, v.hub, v.changed_at, v.gone_at "
            "FROM urls u JOIN page_visits v ON v.id = u.id WHERE u.key = ? AND u.url = ?", (url_key(url), url))
        row = cur.fetchone()
        return None if row is None else dict(zip([c[0] for c in cur.description], row))

    def url_count(self) -> int:
        return sum(self._current_counts().values())

    def iter_urls(self, batch: int = 100_000) -> Iterator[list[str]]:
        """Every URL, in batches, to rebuild the Bloom filter."""
        last = -1
        while True:
            rows = self.db.execute("SELECT id, url FROM urls WHERE id > ? ORDER BY id LIMIT ?",
                                    (last, batch)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield [r[1] for r in rows]

    def url_info(self, url: str) -> dict[str, Any] | None:
        """Everything the table holds about one URL (for the operator and for tests)."""
        cur = self.db.execute(
            "SELECT url, depth, priority, state, node, parent, attempts, leased_at, last_crawl, http_status, "
            f"final_url, content_type, size, error, {self._lastmod_select} FROM urls WHERE key = ? AND url = ?", (url_key(url), url))
        row = cur.fetchone()
        if row is None:
            return None
        d = dict(zip([c[0] for c in cur.description], row))
        d["state"] = STATE_NAMES[d["state"]]
        return d

    # -- catalogue -----------------------------------------------------------------------------------

    def add_audio(self, rows: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Add catalogue rows (AudioItem.catalogue_row() plus "node" and "found_at", the time of the visit).

        One row per (source id or URL, page). A repeat returns False, marks the item seen at found_at, and
        fills only what the first report lacked: the download's sha256/size/content type/path, metadata, the
        URL, and an "ok" status over a failure; a removed item that is back takes the new status. A repeat
        whose download has other bytes than the row holds is a change: the old sha256/size/path go to
        audio_history, the new ones replace them, and the status becomes "changed".
        """
        self._begin()
        out = []
        known = set(AUDIO_COLUMNS)
        for row in rows:
            values = {c: row.get(c) for c in AUDIO_COLUMNS}
            extra = dict(row.get("extra") or {})
            extra.update({k: v for k, v in row.items() if k not in known and k != "identity"})
            values["extra"] = extra
            for c in _JSON_COLUMNS:
                values[c] = json.dumps(values[c], sort_keys=True, ensure_ascii=False) if values[c] else None
            values["url"] = values["url"] or ""
            values["status"] = values["status"] or "ok"
            at = values["found_at"]
            values["last_seen"] = at
            values["changed_at"] = values["removed_at"] = None
            ukey = _audio_ukey(row)
            cur = self.db.execute(_INSERT_AUDIO, (ukey, *values.values()))
            if cur.rowcount == 1:
                self._count_audio(None, values["status"])
                self._note_change("new")
                out.append(True)
                continue
            out.append(False)
            old_id, old_status, old_sha = self.db.execute(
                "SELECT id, status, sha256 FROM audio WHERE ukey = ? AND page = ?", (ukey, values["page"])).fetchone()
            new_sha = values["sha256"]
            if old_sha and new_sha and new_sha != old_sha:
                self.db.execute("INSERT INTO audio_history(audio_id, sha256, size, path, replaced_at) "
                                "SELECT id, sha256, size, path, ? FROM audio WHERE id = ?", (at, old_id))
                self.db.execute(
                    f"UPDATE audio SET sha256 = ?, size = ?, path = ?, content_type = coalesce(?, content_type), "
                    f"status = '{CHANGED}', reason = NULL, changed_at = ?, last_seen = ?, removed_at = NULL "
                    "WHERE id = ?", (new_sha, values["size"], values["path"], values["content_type"], at, at, old_id))
                self._count_audio(old_status, CHANGED)
                self._note_change(CHANGED)
                continue
            status = values["status"]
            if old_status == REMOVED:
                new_status = status
                self._note_change("new")    # back on its page: it appeared again
            elif status == "ok" and old_status != CHANGED:
                new_status = "ok"
            else:
                new_status = old_status
            self._count_audio(old_status, new_status)
            self.db.execute(_UPDATE_AUDIO, (*(values[c] for c in _COALESCED), values["url"], status,
                                            status, status, at, old_id))
        return out

    def _count_audio(self, old: str | None, new: str) -> None:
        if old == new:
            return
        if old is not None:
            self._audio_counts[old] = self._audio_counts.get(old, 0) - 1
        self._audio_counts[new] = self._audio_counts.get(new, 0) + 1

    def _note_change(self, kind: str, n: int = 1) -> None:
        """Count a catalogue change (new, changed, removed) in this refresh cycle's figures (see roll_cycle)."""
        self._cycle[kind] = self._cycle.get(kind, 0) + n
        self._cycle_dirty = True

    def roll_cycle(self, now: float, length: float) -> bool:
        """Close the refresh cycle once it is `length` seconds old: its counts of new, changed and removed items
        become the last cycle's (the status command and the web page show them). True when it rolled."""
        start = self._cycle.get("start")
        if start is None:
            self._cycle["start"] = now
            self._cycle_dirty = True
            return False
        if now - start < length:
            return False
        self._begin()
        last = {"start": start, "end": now, **{k: self._cycle.get(k, 0) for k in _CHANGE_KINDS}}
        self._write_meta("last_cycle", last)
        self._cycle = {"start": now}
        self._cycle_dirty = True
        return True

    def changes_since(self, since: float) -> Iterator[dict[str, Any]]:
        """Catalogue items that appeared, changed or were removed at `since` or later, the latest event first
        named in "change" (new, changed, removed), in the order of that event (streams, through an index)."""
        cur = self.db.execute(
            f"SELECT {self._audio_select} FROM audio WHERE coalesce(removed_at, changed_at, found_at) >= ? "
            "ORDER BY coalesce(removed_at, changed_at, found_at), id", (since,))
        while batch := cur.fetchmany(1000):
            for values in batch:
                d = self._audio_dict(values)
                if d.get("removed_at") is not None and d["status"] == REMOVED:
                    d["change"] = REMOVED
                elif d.get("changed_at") is not None and d["changed_at"] >= since:
                    d["change"] = CHANGED
                else:
                    d["change"] = "new"
                yield d

    def audio_history(self, audio_url: str) -> list[dict[str, Any]]:
        """The bytes an address served before they changed, oldest first."""
        cur = self.db.execute(
            "SELECT a.page, h.sha256, h.size, h.path, h.replaced_at FROM audio_history h "
            "JOIN audio a ON a.id = h.audio_id WHERE a.url = ? ORDER BY h.rowid", (audio_url,))
        names = [c[0] for c in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def _audio_rows(self, where: str = "", args: tuple = ()) -> Iterator[dict[str, Any]]:
        cur = self.db.execute(f"SELECT {self._audio_select} FROM audio {where} ORDER BY id", args)
        while batch := cur.fetchmany(1000):
            for row in batch:
                yield self._audio_dict(row)

    @staticmethod
    def _audio_dict(row: Sequence[Any]) -> dict[str, Any]:
        d = dict(zip(AUDIO_COLUMNS, row))
        for c in _JSON_COLUMNS:
            d[c] = json.loads(d[c]) if d[c] else {}
        return d

    def catalogue(self) -> Iterator[dict[str, Any]]:
        """Every catalogue row in the order found, for export (streams; does not load the table)."""
        return self._audio_rows()

    def audio_by_sha(self, sha256: str) -> list[dict[str, Any]]:
        """Every place one content was found."""
        return list(self._audio_rows("WHERE sha256 = ?", (sha256,)))

    def search_audio(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        """Catalogue rows whose title, artist, audio URL or page contains `query` (case-insensitive for
        ASCII), newest first; an empty query gives the newest rows. Bounded by `limit`; a query that matches
        little may read the whole table, so callers run it off the event loop (see master/web.py)."""
        cols = "url, page, title, artist, album, status, node, found_at"
        if not query:
            sql, args = f"SELECT {cols} FROM audio ORDER BY id DESC LIMIT ?", (limit,)
        else:
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            cond = " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in ("title", "artist", "url", "page"))
            sql, args = f"SELECT {cols} FROM audio WHERE {cond} ORDER BY id DESC LIMIT ?", (like,) * 4 + (limit,)
        cur = self.db.execute(sql, args)
        names = [c[0] for c in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    # -- figures -------------------------------------------------------------------------------------

    def count_discards(self, reasons: Mapping[str, int]) -> None:
        """Add to the discard counters (URLs dropped by policy, by reason)."""
        self._begin()
        self.db.executemany(
            "INSERT INTO discards(reason, n) VALUES (?, ?) ON CONFLICT(reason) DO UPDATE SET n = n + excluded.n",
            [(r, n) for r, n in reasons.items() if n])

    def note_node(self, node: str, **counters: int) -> None:
        """Add to one node's figures (pages, errors, bytes ...)."""
        self._begin()
        self.db.executemany(
            "INSERT INTO node_stats(node, name, value) VALUES (?, ?, ?) "
            "ON CONFLICT(node, name) DO UPDATE SET value = value + excluded.value",
            [(node, k, v) for k, v in counters.items()])

    def _current_counts(self) -> dict[tuple[int, str], int]:
        if self.readonly:
            return {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        return self._counts

    def status(self) -> dict[str, Any]:
        """The operator's figures, read in one snapshot (a reader beside a running master sees one commit):

        states: URLs by state; frontier: queued URLs; frontier_by_node: queued URLs by routed node ("None":
        not routed); nodes: per node, its URLs by state plus the note_node() counters; discards: by reason;
        audio: catalogue rows by status; figures: what the master saved under the meta key "figures" (HTTP
        status and error reason counts). Cheap in the master: counts come from memory, the rest are small tables.
        """
        snapshot = self.readonly and not self.db.in_transaction
        if snapshot:
            self.db.execute("BEGIN")
        try:
            counts = self._current_counts()
            by_state = {name: 0 for name in STATE_NAMES.values()}
            frontier_by_node: dict[str, int] = {}
            nodes: dict[str, dict[str, int]] = {}
            for (state, node), n in sorted(counts.items()):
                if not n:
                    continue
                by_state[STATE_NAMES[state]] += n
                if state == QUEUED:
                    frontier_by_node[str(_node_of(node))] = n
                if node:
                    nodes.setdefault(node, {})[STATE_NAMES[state]] = n
            for node, name, value in self.db.execute("SELECT node, name, value FROM node_stats"):
                nodes.setdefault(node, {})[name] = value
            discards = dict(self.db.execute("SELECT reason, n FROM discards ORDER BY reason"))
            if self.readonly:
                audio = dict(self.db.execute("SELECT status, count(*) FROM audio GROUP BY status"))
            else:
                audio = {k: v for k, v in self._audio_counts.items() if v}
            figures = self.get_meta("figures", {})
            cycle = self.get_meta("cycle", {}) if self.readonly else self._cycle
            changes = {"this_cycle": {"start": cycle.get("start"), **{k: cycle.get(k, 0) for k in _CHANGE_KINDS}},
                       "last_cycle": self.get_meta("last_cycle")}
        finally:
            if snapshot:
                self.db.execute("COMMIT")
        return {
            "states": by_state,
            "frontier": by_state["queued"],
            "frontier_by_node": frontier_by_node,
            "nodes": nodes,
            "discards": discards,
            "audio": audio,
            "figures": figures,
            "changes": changes,
        }

    # -- small key/value table -----------------------------------------------------------------------

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        """Store a small JSON-able value in the open transaction."""
        self._begin()
        self._write_meta(key, value)

    def _write_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                         "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))
