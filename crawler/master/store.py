"""The master's durable state: URL table, on-disk frontier, audio catalogue and node figures.

SQLite (one file in the data dir) is the embedded default; PostgreSQL (``store: postgresql://...``) holds the same
tables when one machine's disk is not enough or the state must outlive the master's machine. Every query and all
the logic below are written once; crawler/master/backend.py spells the few differences.

**Compact URL state.** A crawl of a billion URLs must fit one master's disk and ingest at the same rate at the end
as at the start, so the URL table is kept small and its writes local:

- a URL's row id (SQLite's rowid itself) is given in arrival order, so new rows are appended at the table's end
  whatever its size, and the rows a node pops, in line order, lie close together. A URL's row is found from its
  text through the URL index (crawler/master/urlindex.py): its 64-bit hash -> ids, in hash tables in a file
  beside the database (on PostgreSQL, a table), not a B-tree keyed on random hashes, whose inserts each read and
  rewrite a random page once it outgrows the cache (what made ingest fall as the table grew, before). Two URLs
  on one hash (rare) are told apart by their text;
- the URL text is kept once: its prefix (scheme://host:port, and the first path segment when it is a word such as
  ``/music/``) once per host in ``origins``, the rest in the row;
- the parent is the parent's key (its text only when the parent is not in the table), the node a small id;
- the frontier is a partial index over the queued rows, ordered the way a node pops them:
  ``(node, depth, priority DESC, seq, slot)``; ``seq`` only grows, so entries are appended, never inserted in the
  middle, and the slot makes it cover the search for a slot's entries when a node joins (reroute_slots);
- what a fetch said (status, type, size, error, when; the revisit state) lives in ``pages`` and ``page_visits``,
  rows only for fetched URLs, so a queued URL carries no empty result columns.

Measured with scripts/bench_frontier.py: under 100 bytes per queued URL on disk, URL text and index included,
and the same cost per insert at 100M URLs as at the start (README, "The master store at scale").

``state`` says where a URL is (queued in the frontier, leased to a node, done, or failed for good), so "every URL
is in exactly one place" holds by construction. The view ``urls`` shows the rows with their text (for ad hoc SQL).

Writes happen inside an open transaction that ``commit()`` ends; the master commits every 100-200 ms, so a
kill -9 loses at most what happened since the last commit, and anything lost is consistent with itself:
a page whose result was not committed is still leased, and start-up (``requeue_leased``) hands it out
again. SQLite runs in WAL mode so the operator's status and export commands read while the master writes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Self

from crawler.items import AUDIO_FIELD_KINDS

if TYPE_CHECKING:
    from crawler.master.revisit import RevisitPolicy
from crawler.master.backend import (
    Backend,
    ReadOnlyStoreError,
    StoreBusy,
    StoreError,
    StoreValueError,
    describe,
    is_postgres,
    open_backend,
)
from crawler.master.limits import LIMIT_META
from crawler.master.urlindex import FileUrlIndex, SqlUrlIndex, UrlIndex, url_hash, url_hashes

__all__ = [
    "STATE_NAMES",
    "MasterStore",
    "PageOutcome",
    "ReadOnlyStoreError",
    "StoreBusy",
    "StoreError",
    "StoreValueError",
    "listed_keys",
    "url_hash",
]

log = logging.getLogger(__name__)

# 1: one row per URL with its text, a text index of keys. 2: compact rows keyed by a hash of host and URL.
# 3: the layout described above (row ids in arrival order, the URL index apart).
SCHEMA_VERSION = 3

QUEUED, LEASED, DONE, ERROR, ROBOTS = 0, 1, 2, 3, 4
# ROBOTS: refused by the site's robots.txt, never fetched. Apart from ERROR, so that such a URL is counted once
# (as discarded by "robots"), never as failed, and `retry` leaves it alone.
STATE_NAMES = {QUEUED: "queued", LEASED: "leased", DONE: "done", ERROR: "error", ROBOTS: "robots"}
ROBOTS_BLOCKED = "robots"                  # the PageOutcome state of a URL robots.txt refused
ROBOTS_REASON = "disallowed by robots.txt"
# The meta key set once a store's robots-refused URLs (state ERROR before ROBOTS existed) moved to ROBOTS.
_ROBOTS_STATE_META = "robots_state"
# A URL whose lease keeps being lost (its worker dies on it) is given up after max_attempts times this many.
LOST_LEASE_FACTOR = 3

Route = Callable[[Sequence[str]], list[str | None]]

# Rows per statement when the store works through a large set (reroute, requeue, lookups).
_CHUNK = 2000
# Origin ids the store keeps in memory (an LRU): enough for the hosts of a busy crawl, bounded whatever its size.
_ORIGIN_CACHE = 100_000

# The catalogue changes counted per refresh cycle.
_CHANGE_KINDS = ("new", "changed", "removed")

# Catalogue columns in export order, from the one field list of AudioItem (its client identity is never
# stored: cookies are secrets), plus who found the item and when. Map fields are stored as JSON text.
AUDIO_COLUMNS = (tuple(k for k, kind in AUDIO_FIELD_KINDS.items() if kind != "identity")
                 + ("node", "found_at", "last_seen", "changed_at", "removed_at", "returned_at"))
# found_at is when the item first appeared (exports also call it first_seen); last_seen when a visit of its page
# last showed it; changed_at when new bytes were last found at its address; removed_at when no page, playlist
# or feed listed it any more (status "removed"); returned_at when one listed it again after that (cleared by a
# later change). Epoch seconds here, ISO-8601 UTC in exports.
AUDIO_TIMES = ("found_at", "last_seen", "changed_at", "removed_at", "returned_at")
# The time of an item's latest event, for changes_since (and its index): every write keeps at most one of
# removed_at and returned_at set, and clears returned_at when the bytes change.
_EVENT_AT = "coalesce(removed_at, returned_at, changed_at, found_at)"
CHANGED, REMOVED = "changed", "removed"
_JSON_COLUMNS = frozenset(k for k, kind in AUDIO_FIELD_KINDS.items() if kind == "map")
_SQL_TYPES = {"text": "TEXT", "map": "TEXT", "number": "{REAL}"}
_COLUMN_TYPES = {**{k: _SQL_TYPES[kind] for k, kind in AUDIO_FIELD_KINDS.items() if kind != "identity"},
                 "size": "{INT}", "bitrate": "{INT}", "node": "TEXT", "found_at": "{REAL}", "last_seen": "{REAL}",
                 "changed_at": "{REAL}", "removed_at": "{REAL}", "returned_at": "{REAL}"}
_NOT_NULL = frozenset({"page", "url", "status"})
# A repeat report of a known row fills only what the first one lacked; these are decided otherwise.
_NOT_COALESCED = frozenset({"url", "page", "status", "reason", "node", "found_at", "extra", "last_seen", "changed_at",
                            "removed_at", "returned_at"})
_AUDIO_TABLE = ("CREATE TABLE audio (\n    id {AUTO_ID},\n    ukey TEXT NOT NULL,\n"
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
                 "ELSE status END, last_seen = ?, removed_at = NULL, "
                 "returned_at = CASE WHEN status = 'removed' THEN ? ELSE returned_at END "
                 "WHERE id = ?")

# Downloads a page reported as pending (its catalogue row's status is "pending" until the outcome comes), with
# the node that holds each: when that node dies they are handed to another, and the crawl is not over while
# any is left. One row per (page, address as reported); the item is its wire form as JSON, client identity
# included (a download may need the cookies that asked for its link): the row goes when the download ends.
_PENDING_TABLE = """CREATE TABLE pending_downloads (
    page  TEXT NOT NULL,
    url   TEXT NOT NULL,
    node  TEXT,                 -- NULL: no live node to hold it; handed out when one joins
    item  TEXT NOT NULL,
    since {REAL} NOT NULL,
    PRIMARY KEY (page, url)
);
CREATE INDEX pending_node ON pending_downloads(node)"""
PENDING = "pending"   # crawler.items.PENDING: the catalogue status of an item whose download is under way

# Who lists each catalogue item: one row per (referrer, item), the referrer being the URL whose visit reported it
# (its page, the playlist or feed that names it, or its own address when a task of its own found it to be
# audio). A visit of a referrer replaces that referrer's rows only, and an item is "removed" once no referrer
# lists it any more: a page revisited without its playlist's songs (they come in the playlist's own task) takes
# nothing from them.
_REFS_TABLE = """CREATE TABLE audio_refs (
    referrer {INT} NOT NULL,    -- url_state.id
    audio_id {INT} NOT NULL,    -- audio.id
    PRIMARY KEY (referrer, audio_id)
) {WITHOUT_ROWID};
CREATE INDEX audio_refs_item ON audio_refs(audio_id)"""

# What the page that linked a URL said about the link, for a link that may lead to audio without saying so (a
# playlist, a stream named like a page): crawler.items.LinkMeta as JSON, handed out with the URL's task so that
# the audio found there is named without fetching that page again. One row per such URL only, written when the URL
# enters the table (the first page to report it names it).
_LINK_META_TABLE = """CREATE TABLE link_meta (
    id   {INT} PRIMARY KEY,     -- url_state.id
    meta TEXT NOT NULL
)"""

# The parent's text: its own when it is not in the table, else the text of the row its key names.
_PARENT = ("coalesce(u.parent_url, (SELECT po.origin || p.path FROM url_state p JOIN origins po ON po.id = p.origin "
           "WHERE p.id = u.parent))")
# What a fetch said of a URL: the result columns of ``pages`` a finished fetch writes.
_FETCH_COLUMNS = ("last_crawl", "http_status", "final_url", "content_type", "size", "error")

_SCHEMA = f"""
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE origins (
    id     {{INT}} PRIMARY KEY,
    origin TEXT NOT NULL UNIQUE
);
CREATE TABLE nodes (
    id   {{INT}} PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE url_state (
    id           {{INT}} PRIMARY KEY,
    origin       {{INT}} NOT NULL,
    path         TEXT NOT NULL,
    state        {{INT}} NOT NULL,
    node         {{INT}},
    depth        {{INT}} NOT NULL,
    priority     {{INT}} NOT NULL,
    seq          {{INT}} NOT NULL,
    slot         {{INT}},
    parent       {{INT}},
    parent_url   TEXT,
    attempts     {{INT}} NOT NULL DEFAULT 0
);
-- What the last fetch of a URL said, and when its page last changed: only URLs that were fetched (or that a
-- sitemap dated) have a row, so a queued URL's row above carries no empty result columns.
CREATE TABLE pages (
    id           {{INT}} PRIMARY KEY,
    last_crawl   {{REAL}},
    http_status  {{INT}},
    final_url    TEXT,
    content_type TEXT,
    size         {{INT}},
    error        TEXT,
    lastmod      {{REAL}},
    next_visit   {{REAL}}
);
CREATE INDEX frontier_pop ON url_state(node, depth, priority DESC, seq, slot) WHERE state = {QUEUED};
CREATE INDEX leases ON url_state(node) WHERE state = {LEASED};
CREATE INDEX refresh ON pages(last_crawl);
-- Revisits (crawler/master/revisit.py): pages.next_visit says when a fetched page is due again, found through a
-- partial index over the pages that have one (none while refresh is off; cleared when a page goes back in line);
-- everything else a revisit needs lives in page_visits, one row per fetched page only (never for queued URLs).
CREATE INDEX refresh_due ON pages(next_visit) WHERE next_visit IS NOT NULL;
CREATE TABLE page_visits (
    id            {{INT}} PRIMARY KEY,   -- url_state.id
    etag          TEXT,                  -- the validators of the last full answer, sent back as
    last_modified TEXT,                  --   If-None-Match / If-Modified-Since
    digest        {{INT}},               -- 64-bit hash of the last 2xx body: did the page change
    interval      {{REAL}},              -- the current wait between visits
    hub           {{INT}} NOT NULL DEFAULT 0,   -- the last full visit found audio on it
    changed_at    {{REAL}},              -- when a visit last found it changed
    gone_at       {{REAL}}               -- when it went (404/410 or a redirect away); NULL while it is there
);
-- Every URL with its text, its node's name and its parent's text: for ad hoc SQL and for the store's reads.
CREATE VIEW urls AS
    SELECT o.origin || u.path AS url, u.id AS id, u.depth AS depth, u.priority AS priority, u.seq AS seq,
           u.slot AS slot, u.state AS state, n.name AS node, {_PARENT} AS parent, u.attempts AS attempts,
           p.last_crawl AS last_crawl, p.http_status AS http_status,
           p.final_url AS final_url, p.content_type AS content_type, p.size AS size, p.error AS error,
           p.lastmod AS lastmod
    FROM url_state u JOIN origins o ON o.id = u.origin LEFT JOIN nodes n ON n.id = u.node
    LEFT JOIN pages p ON p.id = u.id;
-- The frontier as rows, for ad hoc SQL and for tools that expect a table of entries.
CREATE VIEW frontier AS
    SELECT seq, id AS url_id, node, depth, priority FROM url_state WHERE state = {QUEUED};
-- Row counts by (state, node), kept in the same transactions as the rows they count, so status and
-- frontier_size never scan the URL table. node '' stands for "not routed".
CREATE TABLE counts (
    state {{INT}} NOT NULL,
    node  TEXT NOT NULL,
    n     {{INT}} NOT NULL,
    PRIMARY KEY (state, node)
) {{WITHOUT_ROWID}};
CREATE TABLE discards (
    reason TEXT PRIMARY KEY,
    n      {{INT}} NOT NULL
) {{WITHOUT_ROWID}};
CREATE TABLE node_stats (
    node  TEXT NOT NULL,
    name  TEXT NOT NULL,
    value {{INT}} NOT NULL,
    PRIMARY KEY (node, name)
) {{WITHOUT_ROWID}};
{_AUDIO_TABLE}
CREATE INDEX audio_sha ON audio(sha256) WHERE sha256 IS NOT NULL;
-- The catalogue's history: the bytes an address served before it changed, and the page index that finds a
-- page's items when it is visited again.
CREATE TABLE audio_history (
    id          {{AUTO_ID}},
    audio_id    {{INT}} NOT NULL,        -- audio.id
    sha256      TEXT NOT NULL,
    size        {{INT}},
    path        TEXT,
    replaced_at {{REAL}} NOT NULL        -- when other bytes were found at the address
);
CREATE INDEX audio_history_item ON audio_history(audio_id);
CREATE INDEX audio_page ON audio(page);
CREATE INDEX audio_events ON audio(({_EVENT_AT}), id);
{_PENDING_TABLE};
{_REFS_TABLE};
{_LINK_META_TABLE}
"""


@dataclass(frozen=True)
class PageOutcome:
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
    # The catalogue keys (listed_keys) of the audio the visit reported, whatever page each names: what this URL
    # lists now. All of it unless `error` is set (a resolver failed: the visit takes no item off the URL).
    audio_keys: frozenset[tuple[str, str]] | None = None

# A first path segment this short and made of letters only ("/music/", "/song/") names a part of the site, shared
# by many of its URLs: it is stored once with the origin. Segments with digits are ids: they stay in the row.
_SHARED_SEGMENT = re.compile(r"/[A-Za-z_.-]{1,24}/")


def split_url(url: str) -> tuple[str, str]:
    """(prefix, rest) with prefix + rest == url: the prefix (the origin, and the first path segment when it is a
    word) is stored once in ``origins``, the rest in the URL's row."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "", url
    cut = rest.find("/")
    if cut < 0:
        return url, ""
    n = len(scheme) + 3 + cut
    m = _SHARED_SEGMENT.match(url, n)
    if m:
        n = m.end()
    return url[:n], url[n:]


def _from(after: int | None) -> tuple[str, int]:
    """The condition on keys for "after this key" (None: from the first); keys span the whole int64 range."""
    return (">=", -(1 << 63)) if after is None else (">", after)


def _url_rows(db: Backend, after: int | None = None, batch: int = 100_000) -> Iterator[list[tuple[int, str]]]:
    """(id, url) of every URL with an id after ``after`` (None: all), in id order, a batch at a time."""
    while True:
        op, start = _from(after)
        rows = db.execute("SELECT u.id, o.origin || u.path FROM url_state u JOIN origins o ON o.id = u.origin "
                          f"WHERE u.id {op} ? ORDER BY u.id LIMIT ?", (start, batch)).fetchall()
        if not rows:
            return
        after = rows[-1][0]
        yield rows


def _next_id_of(db: Backend) -> int:
    """The id the next new URL takes: ids are given in arrival order."""
    return int(db.execute("SELECT coalesce(max(id), 0) FROM url_state").fetchone()[0]) + 1


def _node_key(node: str | None) -> str:
    return "" if node is None else node


def _node_of(key: str) -> str | None:
    return None if key == "" else key


def _chunks(seq: Sequence[Any], size: int = _CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


def listed_keys(rows: Iterable[Mapping[str, Any]]) -> frozenset[tuple[str, str]]:
    """The catalogue keys, (item key, page), of the audio a visit reported: what its URL lists (see _follow_refs)."""
    return frozenset(_row_key(r) for r in rows)


def _row_key(row: Mapping[str, Any]) -> tuple[str, str]:
    return _audio_ukey(row).replace("\x00", ""), str(row.get("page") or "").replace("\x00", "")


def _audio_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """A catalogue row's column values as stored: maps as JSON text, fields not in the table kept in extra."""
    values = {c: row.get(c) for c in AUDIO_COLUMNS}
    extra = dict(row.get("extra") or {})
    extra.update({k: v for k, v in row.items() if k not in _KNOWN_AUDIO and k != "identity"})
    values["extra"] = extra
    for c in _JSON_COLUMNS:
        values[c] = json.dumps(values[c], sort_keys=True, ensure_ascii=False) if values[c] else None
    values["url"] = values["url"] or ""
    values["status"] = values["status"] or "ok"
    for c, v in values.items():
        # Page text may hold NUL; PostgreSQL's text cannot, and no reader wants it: dropped on both stores.
        if isinstance(v, str) and "\x00" in v:
            values[c] = v.replace("\x00", "")
    return values


_KNOWN_AUDIO = frozenset(AUDIO_COLUMNS)


def _audio_ukey(row: Mapping[str, Any]) -> str:
    # A site's own id outlives its download links (they expire and carry per-client tokens), so it
    # identifies the item better than the URL when the resolver knows it.
    source_id = row.get("source_id")
    if source_id:
        return f"{row.get('resolver') or ''}:{source_id}"
    return row.get("url") or ""


class MasterStore:
    """The master's store. Used from one thread; write methods join the open transaction."""

    def __init__(self, location: Path | str, *, max_attempts: int = 3, slot_of: Callable[[str], int] | None = None,
                 cache_mb: int = 64, checkpoint_pages: int = 10_000, _readonly: bool = False) -> None:
        """Open or create the store: an SQLite file path, or a ``postgresql://`` address.

        max_attempts: failed tries ("retry" results) before a URL is given up as an error; a URL whose lease
        is lost max_attempts * LOST_LEASE_FACTOR times (its worker keeps dying on it) is given up too.
        slot_of: the scheduler's first hash (URL -> slot of the node table); recorded at push so that
        reroute_slots() finds a slot's entries in the frontier index without reading the rows.
        """
        self.location = location if is_postgres(location) else Path(location)
        self.path = self.location       # the name older callers use
        self.max_attempts = max_attempts
        self._slot_of = slot_of
        self.readonly = _readonly
        self._counts: dict[tuple[int, str], int] = {}
        self._audio_counts: dict[str, int] = {}     # catalogue rows by status, so status() never scans the table
        self._dirty_counts: set[tuple[int, str]] = set()
        self._next_seq = 0
        self._seq_dirty = False
        # This refresh cycle's catalogue changes: {"start": time, "new": n, "changed": n, "removed": n}, saved
        # under the meta key "cycle" with each commit that changed it.
        self._cycle: dict[str, Any] = {}
        self._cycle_dirty = False
        self._first_checked = -float("inf")    # when roll_cycle last looked for URLs never fetched
        self._origins: OrderedDict[str, int] = OrderedDict()
        self._next_origin = 0
        self._node_ids: dict[str, int] = {}
        self._node_names: dict[int, str] = {}
        self._next_id = 1
        self._index: UrlIndex | None = None
        self.db: Backend = open_backend(self.location, readonly=_readonly, cache_mb=cache_mb,
                                        checkpoint_pages=checkpoint_pages)
        try:
            self._open_schema()
            self._load_names()
            if not _readonly:
                self.db.start_writing()
                self._load_counts()
                self._load_audio_counts()
                self._next_seq = int(self.get_meta("next_seq", 0))
                self._cycle = dict(self.get_meta("cycle", {}))
            self._open_index()
            if self._refs_missing and not _readonly:
                self._fill_refs()
                self.commit()
        except StoreError:
            self._close_index()
            self.db.close()
            raise
        except Exception as e:
            self._close_index()
            self.db.close()
            if type(e).__module__.startswith(("sqlite3", "psycopg")):
                raise StoreError(f"{describe(self.location)}: not a crawl database ({e})") from e
            raise
        except BaseException:
            self._close_index()
            self.db.close()
            raise

    @classmethod
    def open_readonly(cls, location: Path | str) -> MasterStore:
        """A reader for the status/export commands; works beside a running master and after it stopped."""
        return cls(location, _readonly=True)

    @property
    def backend(self) -> str:
        """"sqlite" or "postgresql"."""
        return self.db.name

    # -- opening -------------------------------------------------------------------------------------

    def _open_schema(self) -> None:
        self._audio_select = ", ".join(AUDIO_COLUMNS)
        self._event_at = _EVENT_AT
        self._has_pending = True
        self._refs_missing = False
        where = describe(self.location)
        version = self.db.schema_version()
        if version is None:
            if self.readonly:
                raise StoreError(f"{where}: empty database, not a crawl database")
            self.db.create(_SCHEMA + (f";\n{SqlUrlIndex.DDL}" if is_postgres(self.location) else ""),
                           SCHEMA_VERSION)
            return
        if version > SCHEMA_VERSION:
            raise StoreError(f"{where}: schema version {version} is newer than this program's "
                             f"({SCHEMA_VERSION}); upgrade the crawler")
        if version < SCHEMA_VERSION:
            # The layout changed (URL text per row and a text index in 1; rows keyed by hash in 2): rewriting a big
            # crawl would hold the master for a long time, so say so rather than start on a state it cannot read.
            raise StoreError(f"{where}: crawl state from an older crawler (layout {version}, this one reads "
                             f"{SCHEMA_VERSION}): run `crawler-master upgrade-store` with this config once")
        self._has_pending = bool(self.db.columns("pending_downloads"))
        if not self._has_pending and not self.readonly:
            # A store from before downloads reported apart from their pages: the table starts empty.
            self.db.begin()
            for statement in self.db.ddl(_PENDING_TABLE).split(";"):
                self.db.execute(statement)
            self.db.execute("COMMIT")
            self._has_pending = True
        self._refs_missing = not self.db.columns("audio_refs")
        if self._refs_missing and not self.readonly:
            # A store from before items were tracked by referrer: the table is made here and filled from the
            # catalogue once the URL index is open (_fill_refs).
            self.db.begin()
            for statement in self.db.ddl(_REFS_TABLE).split(";"):
                self.db.execute(statement)
            self.db.execute("COMMIT")
        if not self.db.columns("link_meta") and not self.readonly:
            # A store from before links carried their page's words: the table starts empty.
            self.db.begin()
            self.db.execute(self.db.ddl(_LINK_META_TABLE))
            self.db.execute("COMMIT")
        if not self.readonly and self.get_meta(_ROBOTS_STATE_META) is None:
            self._robots_state()
        present = self.db.columns("audio")
        missing = [c for c in AUDIO_COLUMNS if c not in present]
        if missing and not self.readonly:
            # A store from before a field was added: the new columns start empty. ADD COLUMN only edits the
            # table's definition, so this is instant whatever the table's size.
            self.db.begin()
            for c in missing:
                self.db.execute(self.db.ddl(f"ALTER TABLE audio ADD COLUMN {c} {_COLUMN_TYPES[c]}"))
            self.db.execute("COMMIT")
            missing = []
        if "returned_at" not in present and not self.readonly:
            # The changes index is on an item's latest event, which a return after a removal now is too: made
            # again once (a pass over the catalogue, not the URL table).
            self.db.begin()
            self.db.execute("DROP INDEX IF EXISTS audio_changes")
            self.db.execute(f"CREATE INDEX IF NOT EXISTS audio_events ON audio(({_EVENT_AT}), id)")
            self.db.execute("COMMIT")
        self._event_at = _EVENT_AT if "returned_at" not in missing else "coalesce(removed_at, changed_at, found_at)"
        # A reader of an older store that it may not alter sees the missing columns as null.
        self._audio_select = ", ".join("NULL" if c in missing else c for c in AUDIO_COLUMNS)

    def _robots_state(self) -> None:
        """A store from before robots-refused URLs had a state of their own (they were errors, "disallowed by
        robots.txt"): they move to ROBOTS and the error and robots counts are made again, in one transaction."""
        self.db.begin()
        self.db.execute(f"UPDATE url_state SET state = {ROBOTS} WHERE state = {ERROR} AND id IN "
                        "(SELECT id FROM pages WHERE error = ?)", (ROBOTS_REASON,))
        self.db.execute(f"DELETE FROM counts WHERE state IN ({ERROR}, {ROBOTS})")
        self.db.execute(
            "INSERT INTO counts(state, node, n) SELECT u.state, coalesce(n.name, ''), count(*) FROM url_state u "
            f"LEFT JOIN nodes n ON n.id = u.node WHERE u.state IN ({ERROR}, {ROBOTS}) GROUP BY u.state, n.name")
        self._write_meta(_ROBOTS_STATE_META, True)
        self.db.execute("COMMIT")

    @property
    def index_path(self) -> Path | None:
        """The URL index file of an SQLite store (None on PostgreSQL, whose index is a table)."""
        return None if is_postgres(self.location) else Path(f"{self.location}.urlidx")

    def _open_index(self) -> None:
        self._next_id = _next_id_of(self.db)
        path = self.index_path
        if path is None:
            self._index = SqlUrlIndex(self.db)
            return
        token = self.get_meta("url_index")
        if self.readonly:
            try:
                self._index = FileUrlIndex(path, str(token), readonly=True) if token else None
            except OSError:
                self._index = None      # lookups by text say so; everything else reads on
            return
        if token is None:
            token = secrets.token_hex(16)
            self._begin()
            self._write_meta("url_index", token)
            self.commit()
        index = self._index = FileUrlIndex(path, str(token))
        since = 0 if index.fresh else index.synced_through
        if self._next_id - 1 > since:
            # Rows committed after the index was last made durable (a machine crash may have lost their entries),
            # or all of them for a new index: index them again; an entry already there is not added twice.
            t0, n = time.monotonic(), 0
            for rows in _url_rows(self.db, since):
                hashes = url_hashes(u for _, u in rows)
                have = set(index.find(hashes)) if not index.fresh else set()
                todo = [(h, r[0]) for k, (h, r) in enumerate(zip(hashes, rows)) if (k, r[0]) not in have]
                index.add([h for h, _ in todo], [i for _, i in todo])
                n += len(rows)
            index.sync(self._next_id - 1)
            if index.fresh or n > 1_000_000:
                log.warning("URL index %s: %d rows indexed in %.1f s", path, n, time.monotonic() - t0)

    def _close_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    def _load_names(self) -> None:
        self._node_ids = {name: i for i, name in self.db.execute("SELECT id, name FROM nodes")}
        self._node_names = {i: name for name, i in self._node_ids.items()}
        self._origins.clear()
        self._next_origin = int(self.db.execute("SELECT coalesce(max(id), 0) FROM origins").fetchone()[0])

    def _load_audio_counts(self) -> None:
        self._audio_counts = dict(self.db.execute("SELECT status, count(*) FROM audio GROUP BY status"))

    def _load_counts(self) -> None:
        self._counts = {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        self._dirty_counts.clear()

    # -- transactions --------------------------------------------------------------------------------

    def _begin(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"{describe(self.location)}: opened read-only")
        if not self.db.in_transaction:
            self.db.begin()

    def commit(self) -> None:
        """End the open transaction: everything written since the last commit becomes durable at once."""
        if self.prepare_commit():
            self.end_transaction()

    def prepare_commit(self) -> bool:
        """commit()'s first half, on the store's own thread: the counters this store keeps in memory are written
        into the open transaction. True when there is a transaction for end_transaction() to end."""
        if self.readonly or not self.db.in_transaction:
            return False
        if self._dirty_counts:
            self.db.executemany(
                "INSERT INTO counts(state, node, n) VALUES (?, ?, ?) "
                "ON CONFLICT(state, node) DO UPDATE SET n = excluded.n",
                [(s, n, self._counts.get((s, n), 0)) for s, n in sorted(self._dirty_counts)])
            self._dirty_counts.clear()
        if self._seq_dirty:
            self._write_meta("next_seq", self._next_seq)
            self._seq_dirty = False
        if self._cycle_dirty:
            self._write_meta("cycle", self._cycle)
            self._cycle_dirty = False
        return True

    def end_transaction(self) -> None:
        """commit()'s second half: COMMIT, the part that waits on the disk (on SQLite the WAL is written, and
        every few thousand pages checkpointed into the database file, with fsyncs), then the URL index's upkeep
        (now and then an fsync). It changes no state the loop reads, so it may run on another thread, provided
        nothing uses the store until it returns (the master closes its store gate for that time)."""
        self.db.execute("COMMIT")
        if self._index is not None:
            self._index.after_commit(self._next_id - 1, time.monotonic())

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A unit inside the open transaction (one report): if it raises, everything it wrote is undone, the
        counters with it, and the rest of the transaction stays."""
        self._begin()
        saved = (dict(self._counts), set(self._dirty_counts), self._next_seq, self._seq_dirty,
                 dict(self._audio_counts), dict(self._cycle), self._cycle_dirty, self._next_id)
        self.db.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO SAVEPOINT unit")
            self.db.execute("RELEASE SAVEPOINT unit")
            (self._counts, self._dirty_counts, self._next_seq, self._seq_dirty, self._audio_counts, self._cycle,
             self._cycle_dirty, self._next_id) = saved
            self._load_names()       # ids handed out inside the unit are gone with it
            raise
        self.db.execute("RELEASE SAVEPOINT unit")

    def close(self) -> None:
        """Commit what is open and close; a stopped master leaves nothing half-written."""
        try:
            self.commit()
            if self._index is not None and not self.readonly:
                self._index.sync(self._next_id - 1)          # a master that stops leaves its index durable
        finally:
            self._close_index()
            self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def limit_time(self, seconds: float) -> None:
        """Queries from now on are cut off after `seconds` with a StoreError."""
        self.db.limit_time(seconds)

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

    # -- names: nodes and origins --------------------------------------------------------------------

    def _node_id(self, name: str | None) -> int | None:
        """The small id a node's name is stored as (created on first use, in the open transaction)."""
        if name is None:
            return None
        i = self._node_ids.get(name)
        if i is None:
            i = max(self._node_names, default=0) + 1
            self.db.execute("INSERT INTO nodes(id, name) VALUES (?, ?)", (i, name))
            self._node_ids[name], self._node_names[i] = i, name
        return i

    def _origin_ids(self, origins: Iterable[str]) -> dict[str, int]:
        """Ids of these origins, creating the new ones in the open transaction. Remembers the recent ones."""
        out: dict[str, int] = {}
        missing = []
        for o in set(origins):
            i = self._origins.get(o)
            if i is None:
                missing.append(o)
            else:
                self._origins.move_to_end(o)
                out[o] = i
        for chunk in _chunks(missing):
            for i, o in self.db.execute(f"SELECT id, origin FROM origins WHERE {self.db.in_list('origin')}",
                                        (self.db.list_arg(chunk),)):
                out[o] = i
        new = [o for o in missing if o not in out]
        if new:
            rows = []
            for o in new:
                self._next_origin += 1
                out[o] = self._next_origin
                rows.append((self._next_origin, o))
            self.db.executemany("INSERT INTO origins(id, origin) VALUES (?, ?)", rows)
        for o in missing:
            self._origins[o] = out[o]
        while len(self._origins) > _ORIGIN_CACHE:
            self._origins.popitem(last=False)
        return out

    # -- URL table and frontier ----------------------------------------------------------------------

    def _lookup(self, urls: Iterable[str], columns: str) -> dict[str, tuple[Any, ...]]:
        """Rows of the given URLs that exist, keyed by URL, in the order asked; `columns` (of the urls view) must
        start with url."""
        if self._index is None:
            raise StoreError(f"{describe(self.location)}: the URL index is missing (the master rebuilds it when it "
                             "starts); finding URLs by their text needs it")
        wanted = list(dict.fromkeys(urls))
        hits = self._index.find(url_hashes(wanted))
        by_id: dict[int, tuple[Any, ...]] = {}
        ids = sorted({i for _, i in hits})
        sql = f"SELECT {columns}, id FROM urls WHERE {self.db.in_list('id')}"
        for chunk in _chunks(ids):
            for row in self.db.execute(sql, (self.db.list_arg(chunk),)):
                by_id[row[-1]] = row[:-1]
        found: dict[str, tuple[Any, ...]] = {}
        for pos, i in hits:
            row = by_id.get(i)
            if row is not None and row[0] == wanted[pos]:      # not another URL on the hash, nor a lost row
                found[wanted[pos]] = row
        return {u: found[u] for u in wanted if u in found}

    def known(self, urls: Sequence[str]) -> set[str]:
        """Which of these URLs the URL table holds, whatever their state (exact, not probabilistic)."""
        return set(self._lookup(urls, "url"))

    def push(self, rows: Sequence[tuple[str, int, int, str | None, str | None]], *, unseen: bool = False,
             link_meta: Mapping[str, str] | None = None) -> int:
        """Queue (url, depth, priority, node, parent) rows; URLs the table already holds are ignored.

        link_meta: url -> what its linking page said about it (JSON, see _LINK_META_TABLE), kept for the new URLs.

        unseen: the caller vouches that the table holds none of these URLs, so they are not looked up. The master
        pushes only what its Bloom filter had never seen (a Bloom filter has no false negatives, and it holds every
        URL of the table), or what the table itself just said it lacks; looking them up again would cost a probe
        of every table of the URL index per URL, on the path every new URL takes.

        Returns how many were new.
        """
        self._begin()
        fresh: dict[str, tuple[str, int, int, str | None, str | None]] = {}
        for row in rows:
            fresh.setdefault(row[0], row)
        if not unseen:
            for url in self._lookup(fresh, "url"):
                del fresh[url]
        if not fresh:
            return 0
        parents = {p for *_, p in fresh.values() if p is not None}
        parent_keys = {u: r[1] for u, r in self._lookup(parents, "url, id").items()} if parents else {}
        origin_of = self._origin_ids(split_url(u)[0] for u in fresh)
        slot_of = self._slot_of
        inserts = []
        key = self._take_ids(list(fresh))
        for url, depth, priority, node, parent in fresh.values():
            origin, rest = split_url(url)
            slot = slot_of(url) if slot_of is not None else None
            pkey = parent_keys.get(parent) if parent is not None else None
            inserts.append((key, origin_of[origin], rest, self._node_id(node), depth, priority, self._take_seq(),
                            slot, pkey, parent if pkey is None else None))
            key += 1
            self._move(None, None, QUEUED, node)
        self.db.executemany(
            f"INSERT INTO url_state(id, origin, path, state, node, depth, priority, seq, slot, parent, parent_url) "
            f"VALUES (?, ?, ?, {QUEUED}, ?, ?, ?, ?, ?, ?, ?)", inserts)
        if link_meta:
            named = [(row[0], link_meta[url]) for url, row in zip(fresh, inserts) if url in link_meta]
            if named:
                self.db.executemany("INSERT INTO link_meta(id, meta) VALUES (?, ?) ON CONFLICT(id) DO NOTHING",
                                    named)
        return len(inserts)

    def _write_pages(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Set these result columns of URLs by key: rows are (id, value, ...), in the order of `columns`."""
        if not rows:
            return
        cols = ", ".join(columns)
        self.db.executemany(
            f"INSERT INTO pages(id, {cols}) VALUES (?{', ?' * len(columns)}) ON CONFLICT(id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in columns), rows)

    def _take_ids(self, urls: Sequence[str]) -> int:
        """Ids for new rows of these URLs, indexed: urls[k] gets the returned id + k (ids in arrival order)."""
        assert self._index is not None
        first = self._next_id
        self._index.add(url_hashes(urls), range(first, first + len(urls)))
        self._next_id = first + len(urls)
        return first

    def note_lastmod(self, pairs: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
        """Record when pages last changed, as their site's sitemap says. Returns (url, depth) of the done
        pages that changed after their last crawl: what a refreshing crawl should fetch again now.

        Only URLs the table holds are touched: a link the URL policy discarded has no row."""
        self._begin()
        latest: dict[str, float] = {}
        for u, t in pairs:
            latest[u] = max(t, latest.get(u, t))
        rows = self._lookup(latest, "url, depth, state, last_crawl, id")
        changed = [(u, depth) for u, depth, state, last_crawl, _ in rows.values()
                   if state == DONE and last_crawl is not None and latest[u] > last_crawl]
        self._write_pages(("lastmod",), [(r[4], latest[u]) for u, r in rows.items()])
        return changed

    def pop(self, node: str | None, n: int, now: float, max_depth: int | None = None, *,
            validators: bool = False, link_meta: bool = False) -> list[tuple[Any, ...]]:
        """Lease up to n of this node's frontier entries: lowest depth, then highest priority, then oldest;
        with max_depth, none deeper (the crawl's level barrier).

        Returns (url, depth, parent) rows; with validators, (url, depth, parent, (etag, last_modified) or None),
        the validators of the page's last full answer for a conditional fetch; with link_meta, each row ends with
        what the linking page said about the URL (its JSON, or None).
        """
        self._begin()
        node_id = self._node_ids.get(node) if node is not None else None
        if node is not None and node_id is None:
            return []
        where = "node IS NULL" if node is None else "node = ?"
        args: tuple[Any, ...] = () if node is None else (node_id,)
        if max_depth is not None:
            where += " AND depth <= ?"
            args += (max_depth,)
        args += (n,)
        cols, join = f"u.id, o.origin || u.path, u.depth, {_PARENT}", ""
        if validators:
            cols, join = cols + ", v.etag, v.last_modified", " LEFT JOIN page_visits v ON v.id = u.id"
        if link_meta:
            cols, join = cols + ", lm.meta", join + " LEFT JOIN link_meta lm ON lm.id = u.id"
        rows = self.db.execute(
            f"SELECT {cols} FROM "
            f"(SELECT id, depth AS d, priority AS p, seq AS s FROM url_state WHERE state = {QUEUED} AND {where} "
            f"ORDER BY depth, priority DESC, seq LIMIT ?) f "
            f"JOIN url_state u ON u.id = f.id JOIN origins o ON o.id = u.origin{join} ORDER BY f.d, f.p DESC, f.s",
            args).fetchall()
        if not rows:
            return []
        self.db.executemany(f"UPDATE url_state SET state = {LEASED} WHERE id = ?",
                            [(r[0],) for r in rows])
        self._move(QUEUED, node, LEASED, node, len(rows))
        named: tuple[Any, ...] = ()
        out = []
        for r in rows:
            if link_meta:
                named = (r[-1],)
            if validators:
                out.append((r[1], r[2], r[3], (r[4], r[5]) if r[4] is not None or r[5] is not None else None, *named))
            else:
                out.append((r[1], r[2], r[3], *named))
        return out

    def lowest_queued_depth(self) -> int | None:
        """The smallest depth in the frontier, over every node (None: the frontier is empty). One index seek a
        node (frontier_pop leads with node, depth); asked only when a level of the crawl may be done."""
        self._begin()
        nodes = [n for (state, n), c in self._current_counts().items() if state == QUEUED and c > 0]
        best: int | None = None
        for key in nodes:
            node = _node_of(key)
            if node is None:
                row = self.db.execute(
                    f"SELECT min(depth) FROM url_state WHERE state = {QUEUED} AND node IS NULL").fetchone()
            elif node in self._node_ids:
                row = self.db.execute(f"SELECT min(depth) FROM url_state WHERE state = {QUEUED} AND node = ?",
                                      (self._node_ids[node],)).fetchone()
            else:
                continue
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
        ids = [self._node_ids[n] for n in nodes if n is not None and n in self._node_ids]
        conds = []
        if ids:
            conds.append(f"node IN ({','.join(map(str, ids))})")
        if any(n is None for n in nodes):
            conds.append("node IS NULL")
        if not conds:
            return 0
        return self._reroute_where(" OR ".join(conds), [], route)

    def reset_routing(self) -> int:
        """The node table changed between runs: every queued entry forgets its node and its slot, so they are
        routed again as nodes join (entries without a slot are part of every reroute_slots)."""
        nodes = [_node_of(node) for (state, node), n in self._current_counts().items()
                 if state == QUEUED and n and node]
        moved = self.reroute(nodes, lambda urls: [None] * len(urls)) if nodes else 0
        self._begin()
        self.db.execute(f"UPDATE url_state SET slot = NULL WHERE state = {QUEUED}")
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
        # Park the entries first (node = -1 - old node id, so every parked value is negative), then drain the
        # parked entries in chunks: an entry that routes back to its own node is not met again, and memory stays
        # bounded however big the frontier is. The parked values never outlive this call, so no commit sees them.
        self.db.execute(
            f"UPDATE url_state SET node = -1 - coalesce(node, 0) WHERE state = {QUEUED} AND ({cond})", args)
        moved = 0
        while True:
            rows = self.db.execute(
                f"SELECT u.id, o.origin || u.path, u.node FROM url_state u JOIN origins o ON o.id = u.origin "
                f"WHERE u.state = {QUEUED} AND u.node < 0 LIMIT ?", (_CHUNK,)).fetchall()
            if not rows:
                return moved
            targets = route([r[1] for r in rows])
            self.db.executemany("UPDATE url_state SET node = ? WHERE id = ?",
                                [(self._node_id(t), r[0]) for r, t in zip(rows, targets, strict=True)])
            for (_, _, parked), target in zip(rows, targets):
                old_id = -1 - parked
                old = self._node_names[old_id] if old_id else None
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
            self.db.executemany(f"UPDATE url_state SET state = {ERROR}, attempts = attempts + 1 WHERE id = ?",
                                [(r[1],) for r in doomed])
            self._write_pages(("error",), [(r[1], "lease lost too often (a worker may be dying on it)")
                                           for r in doomed])
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
                f"SELECT url, id, node, state FROM urls WHERE id IN "
                f"(SELECT id FROM url_state WHERE state = {LEASED} LIMIT ?)", (_CHUNK,)).fetchall()
            if not rows:
                return total
            total += self._requeue_rows(rows, route, attempt=False)

    def _requeue_rows(self, rows: Sequence[tuple[Any, ...]], route: Route, *, attempt: bool) -> int:
        if not rows:
            return 0
        targets = route([r[0] for r in rows])
        bump = 1 if attempt else 0
        self.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, attempts = attempts + {bump} "
            f"WHERE id = ?", [(self._node_id(t), r[1]) for r, t in zip(rows, targets, strict=True)])
        for r, t in zip(rows, targets):
            self._move(LEASED, r[2], QUEUED, t)
        return len(rows)

    def finish(self, results: Sequence[PageOutcome], revisit: RevisitPolicy | None = None) -> list[bool]:
        """Record the nodes' results. True where the result was taken: the URL was leased (or back in line
        after its lease was given up); False for a repeat or late result of a URL already settled, or of
        a URL the store does not know. "retry" requeues on the same node until max_attempts, then "error";
        "throttled" (the site said 429/503) requeues on the same node without counting an attempt.

        With a revisit policy (refresh on), a done page also gets its next visit and its page_visits row, and
        a visit of a page seen before updates the catalogue: see _visited(). Whatever the policy, a done result
        records which catalogue items its URL lists (audio_keys; their rows must exist: add_audio first).
        """
        self._begin()
        current = {u: [i, st, node, att, status, last] for u, i, st, node, att, status, last in
                   self._lookup([r.url for r in results],
                                "url, id, state, node, attempts, http_status, last_crawl").values()}
        visits: list[tuple[PageOutcome, int, int | None, float | None]] = []
        listings: dict[int, tuple[frozenset[tuple[str, str]], bool]] = {}
        out: list[bool] = []
        fetched: list[tuple[Any, ...]] = []
        for res in results:
            row = current.get(res.url)
            if row is None or row[1] in (DONE, ERROR, ROBOTS):
                out.append(False)
                continue
            row_id, state, node, attempts = row[:4]
            if revisit is not None and res.state == "done":
                visits.append((res, row_id, row[4], row[5]))
            elif res.state == "done" and res.audio_keys:
                listings[row_id] = (res.audio_keys, False)
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
            elif res.state == ROBOTS_BLOCKED:
                new_state = ROBOTS
            else:
                raise ValueError(f"unknown result state {res.state!r}")
            new_node = node if new_state == QUEUED else res.node
            seq_sql = ", seq = ?" if new_state == QUEUED else ""
            args: list[Any] = [new_state, self._node_id(new_node), attempts]
            if new_state == QUEUED:
                args.append(self._take_seq())
            self.db.execute(f"UPDATE url_state SET state = ?, node = ?, attempts = ?{seq_sql} WHERE id = ?",
                            (*args, row_id))
            fetched.append((row_id, res.at, res.http_status, res.final_url, res.content_type, res.size, res.error))
            self._move(state, node, new_state, new_node)
            row[1], row[2], row[3] = new_state, new_node, attempts
            out.append(True)
        self._write_pages(_FETCH_COLUMNS, fetched)
        if visits:
            assert revisit is not None
            self._visited(visits, revisit)
        elif listings:
            self._follow_refs(listings, (), results[0].at)
        return out

    def _visited(self, visits: Sequence[tuple[PageOutcome, int, int | None, float | None]],
                 policy: RevisitPolicy) -> None:
        """Done pages (result, url id, last HTTP status, last crawl): their next visit and page_visits row; the
        catalogue follows what each URL lists (_follow_refs): a 304 confirms its items, a gone page lists none,
        a full answer lists what it reported (all of it, unless its resolver failed: then it only adds)."""
        from crawler.master.revisit import changed as page_changed
        from crawler.master.revisit import gone as page_gone

        prev: dict[int, tuple[Any, ...]] = {}
        ids = [v[1] for v in visits]
        for chunk in _chunks(ids):
            for row in self.db.execute(
                    "SELECT id, etag, last_modified, digest, interval, hub, changed_at, gone_at FROM page_visits "
                    f"WHERE {self.db.in_list('id')}", (self.db.list_arg(chunk),)):
                prev[row[0]] = row
        upserts, next_visits = [], []
        confirmed: list[int] = []
        listed: dict[int, tuple[frozenset[tuple[str, str]], bool]] = {}
        for res, row_id, last_status, last_crawl in visits:
            _, etag, lastmod, digest, interval, hub, changed_at, gone_at = prev.get(row_id, (None,) * 8)
            status, at = res.http_status, res.at
            seen_before = last_crawl is not None
            changed = seen_before and page_changed(status, res.digest, last_status, digest)
            keys = res.audio_keys or frozenset()
            if status == 304:   # the page as it was: keep what its full answer said
                etag, lastmod = res.etag or etag, res.last_modified or lastmod
                if seen_before:
                    confirmed.append(row_id)
                if keys:        # its audio, revalidated from what the worker knew of the page
                    listed[row_id] = (keys, False)
            else:
                etag, lastmod, digest = res.etag, res.last_modified, res.digest
                hub = 1 if res.audio_keys else 0
                if page_gone(status):
                    listed[row_id] = (frozenset(), True)
                elif status is not None and 200 <= status < 300 and res.audio_keys is not None:
                    listed[row_id] = (keys, res.error is None)
            if page_gone(status):
                gone_at = gone_at if gone_at is not None else at
            elif status is not None and status < 300 or status == 304:
                gone_at = None
            if changed:
                changed_at = at
            hub = hub or 0
            interval = policy.interval(interval, changed, bool(hub))
            upserts.append((row_id, etag, lastmod, digest, interval, hub, changed_at, gone_at))
            next_visits.append((row_id, at + interval))
        cols = ("etag", "last_modified", "digest", "interval", "hub", "changed_at", "gone_at")
        self.db.executemany(
            f"INSERT INTO page_visits(id, {', '.join(cols)}) VALUES (?{', ?' * len(cols)}) ON CONFLICT(id) DO UPDATE "
            f"SET " + ", ".join(f"{c} = excluded.{c}" for c in cols), upserts)
        self._write_pages(("next_visit",), next_visits)
        if listed or confirmed:
            self._follow_refs(listed, confirmed, visits[0][0].at)

    def _follow_refs(self, listed: Mapping[int, tuple[frozenset[tuple[str, str]], bool]], confirmed: Sequence[int],
                     at: float) -> None:
        """What URLs list now: url id -> (catalogue keys, whether that is all it lists). A URL's items it no
        longer lists lose its reference, and an item left with none is "removed" (no page, playlist or feed
        lists it any more); the items of the `confirmed` URLs (answered 304) are seen at `at`. Set-wise, a
        statement per chunk: the cost follows the report, not the catalogue."""
        ids = self._audio_ids({k for keys, _ in listed.values() for k in keys})
        whole = [ref for ref, (_, full) in listed.items() if full]
        had: dict[int, set[int]] = {}
        for chunk in _chunks(whole):
            for ref, audio_id in self.db.execute(
                    f"SELECT referrer, audio_id FROM audio_refs WHERE {self.db.in_list('referrer')}",
                    (self.db.list_arg(chunk),)):
                had.setdefault(ref, set()).add(audio_id)
        adds: list[tuple[int, int]] = []
        drops: list[tuple[int, int]] = []
        for ref, (keys, full) in listed.items():
            now = {ids[k] for k in keys if k in ids}
            before = had.get(ref, set())
            adds.extend((ref, a) for a in sorted(now - before))
            if full:
                drops.extend((ref, a) for a in sorted(before - now))
        if adds:
            self.db.executemany("INSERT INTO audio_refs(referrer, audio_id) VALUES (?, ?) ON CONFLICT DO NOTHING", adds)
        if drops:
            self.db.executemany("DELETE FROM audio_refs WHERE referrer = ? AND audio_id = ?", drops)
            self._remove_orphans(sorted({a for _, a in drops}), at)
        for chunk in _chunks(list(confirmed)):
            self.db.execute(f"UPDATE audio SET last_seen = ? WHERE status != '{REMOVED}' AND id IN "
                            f"(SELECT audio_id FROM audio_refs WHERE {self.db.in_list('referrer')})",
                            (at, self.db.list_arg(chunk)))

    def _audio_ids(self, keys: Collection[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Catalogue row ids of (item key, page) keys, those that exist."""
        out: dict[tuple[str, str], int] = {}
        ukeys = sorted({k for k, _ in keys})
        pages = sorted({p for _, p in keys})
        for chunk in _chunks(ukeys):
            for chunk_pages in _chunks(pages):
                for row_id, ukey, page in self.db.execute(
                        f"SELECT id, ukey, page FROM audio WHERE {self.db.in_list('ukey')} AND "
                        f"{self.db.in_list('page')}", (self.db.list_arg(chunk), self.db.list_arg(chunk_pages))):
                    if (ukey, page) in keys:
                        out[(ukey, page)] = row_id
        return out

    def _remove_orphans(self, audio_ids: Sequence[int], at: float) -> None:
        """Of these items, those no URL lists any more become "removed"."""
        still: set[int] = set()
        for chunk in _chunks(audio_ids):
            still.update(r[0] for r in self.db.execute(
                f"SELECT DISTINCT audio_id FROM audio_refs WHERE {self.db.in_list('audio_id')}",
                (self.db.list_arg(chunk),)))
        gone: list[tuple[int, str]] = []
        for chunk in _chunks([a for a in audio_ids if a not in still]):
            gone.extend((r[0], r[1]) for r in self.db.execute(
                f"SELECT id, status FROM audio WHERE {self.db.in_list('id')} AND status != '{REMOVED}'",
                (self.db.list_arg(chunk),)))
        if not gone:
            return
        self.db.executemany(f"UPDATE audio SET status = '{REMOVED}', removed_at = ?, returned_at = NULL WHERE id = ?",
                            [(at, i) for i, _ in gone])
        for _, status in gone:
            self._count_audio(status, REMOVED)
        self._note_change(REMOVED, len(gone))

    def _fill_refs(self) -> int:
        """Fill audio_refs from the catalogue of a store that had none (see _REFS_TABLE): each present item is
        listed by the playlist that named it (found_in "playlist"), its own address (found_in "response"), else
        its page; one set-wise pass in id order. Returns the references made."""
        self._begin()
        found_in = self.db.json_text("extra", "found_in")
        playlist = self.db.json_text("extra", "playlist")
        last, made = 0, 0
        while True:
            rows = self.db.execute(
                f"SELECT id, url, page, {found_in}, {playlist} FROM audio WHERE id > ? AND status != '{REMOVED}' "
                "ORDER BY id LIMIT ?", (last, _CHUNK)).fetchall()
            if not rows:
                return made
            last = rows[-1][0]
            want = {i: (pl if fi == "playlist" and pl else url if fi == "response" and url else page, page)
                    for i, url, page, fi, pl in rows}
            known = {u: r[1] for u, r in self._lookup({u for pair in want.values() for u in pair}, "url, id").items()}
            refs = [(known.get(ref, known.get(page)), i) for i, (ref, page) in want.items()]
            refs = [r for r in refs if r[0] is not None]
            self.db.executemany("INSERT INTO audio_refs(referrer, audio_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                                refs)
            made += len(refs)

    def retry_errors(self, route: Route, contains: str | None = None, after: int | None = None,
                     limit: int = _CHUNK) -> tuple[int, int | None]:
        """Failed URLs (state error) back in line with their attempts reset, optionally only those whose error
        contains `contains`. Works through the table in key order, `limit` rows a call: returns how many went
        back and the key to continue after, or None when the table is done."""
        self._begin()
        op, start = _from(after)
        cond, args = "", (start,)   # type: tuple[str, tuple[Any, ...]]
        if contains:
            cond, args = (f" AND id IN (SELECT id FROM pages WHERE id {op} ? AND {self.db.strpos}(error, ?) > 0)",
                          (start, start, contains))
        rows = self.db.execute(
            f"SELECT url, id, node FROM urls WHERE id IN (SELECT id FROM url_state WHERE id {op} ? "
            f"AND state = {ERROR}{cond} ORDER BY id LIMIT ?) ORDER BY id", (*args, limit)).fetchall()
        if not rows:
            return 0, None
        targets = route([r[0] for r in rows])
        self.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, attempts = 0, seq = ? WHERE id = ?",
            [(self._node_id(t), self._take_seq(), r[1]) for r, t in zip(rows, targets, strict=True)])
        self.db.executemany("UPDATE pages SET error = NULL WHERE id = ?", [(r[1],) for r in rows])
        for r, t in zip(rows, targets):
            self._move(ERROR, r[2], QUEUED, t)
        return len(rows), rows[-1][1]

    def failed(self) -> Iterator[dict[str, Any]]:
        """The URLs given up as errors, with why, in key order (streams, a page of rows at a time)."""
        cols = ("url", "error", "http_status", "attempts", "node", "last_crawl", "depth", "parent")
        last = None
        while True:
            op, start = _from(last)
            rows = self.db.execute(
                f"SELECT {', '.join(cols)}, id FROM urls WHERE id IN (SELECT id FROM url_state WHERE id {op} ? "
                f"AND state = {ERROR} ORDER BY id LIMIT 1000) ORDER BY id", (start,)).fetchall()
            if not rows:
                return
            last = rows[-1][-1]
            for row in rows:
                yield dict(zip(cols, row))

    def requeue_refresh(self, rows: Sequence[tuple[str, int]], route: Route) -> int:
        """Put done pages back at the end of the line for a fresh crawl (past the Bloom filter)."""
        self._begin()
        depth_of = dict(rows)
        found = [r for r in self._lookup(depth_of, "url, id, node, state").values() if r[3] == DONE]
        if not found:
            return 0
        targets = route([r[0] for r in found])
        self.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, depth = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(self._node_id(t), depth_of[r[0]], self._take_seq(), r[1]) for r, t in zip(found, targets, strict=True)])
        self.db.executemany("UPDATE pages SET next_visit = NULL WHERE id = ?", [(r[1],) for r in found])
        for r, t in zip(found, targets):
            self._move(DONE, r[2], QUEUED, t)
        return len(found)

    def requeue_due(self, now: float, route: Route, limit: int = _CHUNK) -> list[float]:
        """Done pages whose next visit is due (next_visit <= now), most overdue first, back in line for a fresh
        crawl (past the Bloom filter), at most `limit` a call, through the next-visit index. Returns how late
        each one is (now - next_visit): the caller calls again while a full batch came back."""
        self._begin()
        rows = self.db.execute(
            f"SELECT v.id, v.url, v.node, f.next_visit FROM (SELECT p.id, p.next_visit FROM pages p "
            f"JOIN url_state u ON u.id = p.id WHERE p.next_visit <= ? AND u.state = {DONE} "
            f"ORDER BY p.next_visit LIMIT ?) f JOIN urls v ON v.id = f.id ORDER BY f.next_visit",
            (now, limit)).fetchall()
        if not rows:
            return []
        targets = route([r[1] for r in rows])
        self.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(self._node_id(t), self._take_seq(), r[0]) for r, t in zip(rows, targets, strict=True)])
        # Out of the next-visit index until the visit is done and sets the next one.
        self.db.executemany("UPDATE pages SET next_visit = NULL WHERE id = ?", [(r[0],) for r in rows])
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
        return int(self.db.execute(
            f"UPDATE pages SET next_visit = coalesce(last_crawl, 0) WHERE next_visit IS NULL "
            f"AND id IN (SELECT id FROM url_state WHERE state = {DONE})").rowcount)

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
        self.db.executemany("UPDATE url_state SET depth = ? WHERE id = ?", [(want[r[0]], r[1]) for r in rows])
        return [(r[0], r[2], want[r[0]]) for r in rows if r[3] == DONE]

    def url_count(self) -> int:
        return sum(self._current_counts().values())

    def iter_urls(self, batch: int = 100_000) -> Iterator[list[str]]:
        """Every URL, in batches, to rebuild the Bloom filter."""
        for rows in _url_rows(self.db, None, batch):
            yield [u for _, u in rows]

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
        for row in rows:
            values = _audio_values(row)
            at = values["found_at"]
            values["last_seen"] = at
            values["changed_at"] = values["removed_at"] = values["returned_at"] = None
            ukey = _audio_ukey(row).replace("\x00", "")
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
                    f"status = '{CHANGED}', reason = NULL, changed_at = ?, last_seen = ?, removed_at = NULL, "
                    "returned_at = NULL "
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
                                            status, status, at, at, old_id))
        return out

    def settle_audio(self, settled: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any] | None]:
        """Downloads ended: (the catalogue row as its page reported it, pending; the row as the download ended).
        A row still pending takes the outcome whole (status, reason, sha256, size, path, the file's tags), its
        times kept; the row as it now is comes back, for the catalogue file. A row no longer pending (its page
        was visited again meanwhile) takes the outcome as a repeat report would (add_audio): None for it."""
        self._begin()
        out: list[dict[str, Any] | None] = []
        for reported, final in settled:
            ukey = _audio_ukey(reported).replace("\x00", "")
            page = str(reported.get("page") or "").replace("\x00", "")
            found = self.db.execute("SELECT id, status FROM audio WHERE ukey = ? AND page = ?",
                                    (ukey, page)).fetchone()
            if found is None or found[1] != PENDING:
                # A download is no listing: an item nothing lists any more stays removed when its last download
                # ends after that.
                if found is None or found[1] != REMOVED:
                    self.add_audio([{**final, "page": page}])
                out.append(None)
                continue
            row_id, _ = found
            values = _audio_values({**final, "page": page})
            cols = [c for c in AUDIO_COLUMNS if c not in AUDIO_TIMES and c != "page"]
            self.db.execute(f"UPDATE audio SET {', '.join(f'{c} = ?' for c in cols)} WHERE id = ?",
                            (*(values[c] for c in cols), row_id))
            self._count_audio(PENDING, values["status"])
            out.append(next(self._audio_rows("id = ?", (row_id,))))
        return out

    # -- pending downloads ---------------------------------------------------------------------------

    def add_pending(self, rows: Sequence[tuple[str, str, str | None, str, float]]) -> None:
        """(page, url, node, item as JSON, since): downloads reported pending. A download already pending for
        the same page and address is the newer report's (its page was fetched again)."""
        if not rows:
            return
        self._begin()
        self.db.executemany("INSERT INTO pending_downloads(page, url, node, item, since) VALUES (?, ?, ?, ?, ?) "
                            "ON CONFLICT(page, url) DO UPDATE SET node = excluded.node, item = excluded.item, "
                            "since = excluded.since",
                            [(pg.replace("\x00", ""), u.replace("\x00", ""), n, item, t)
                             for pg, u, n, item, t in rows])

    def pending_holders(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str | None, str]]:
        """(page, url) -> (node, item JSON) of those of keys still pending."""
        out = {}
        for page, url in keys:
            row = self.db.execute("SELECT node, item FROM pending_downloads WHERE page = ? AND url = ?",
                                  (page, url)).fetchone()
            if row is not None:
                out[(page, url)] = (row[0], row[1])
        return out

    def drop_pending(self, keys: Sequence[tuple[str, str]]) -> None:
        if keys:
            self._begin()
            self.db.executemany("DELETE FROM pending_downloads WHERE page = ? AND url = ?", keys)

    def pending_of(self, nodes: Collection[str], unheld: bool = False) -> list[tuple[str, str, str | None, str]]:
        """(page, url, node, item JSON) of the downloads the nodes hold, and with unheld those no node holds."""
        out: list[tuple[str, str, str | None, str]] = []
        if nodes:
            out += self.db.execute(f"SELECT page, url, node, item FROM pending_downloads WHERE {self.db.in_list('node')} "
                                   "ORDER BY since", (self.db.list_arg(list(nodes)),)).fetchall()
        if unheld:
            out += self.db.execute("SELECT page, url, node, item FROM pending_downloads WHERE node IS NULL "
                                   "ORDER BY since").fetchall()
        return [tuple(r) for r in out]   # type: ignore[misc]

    def move_pending(self, moves: Sequence[tuple[str | None, str, str]]) -> None:
        """(new node, page, url): the downloads change hands (None: no node holds them for now)."""
        if moves:
            self._begin()
            self.db.executemany("UPDATE pending_downloads SET node = ? WHERE page = ? AND url = ?", moves)

    def pending_count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM pending_downloads").fetchone()[0])

    def pending_nodes(self) -> list[str]:
        """The nodes that hold pending downloads."""
        return [r[0] for r in self.db.execute("SELECT DISTINCT node FROM pending_downloads WHERE node IS NOT NULL")]

    def _count_audio(self, old: str | None, new: str) -> None:
        if old == new:
            return
        if old is not None:
            self._audio_counts[old] = self._audio_counts.get(old, 0) - 1
        self._audio_counts[new] = self._audio_counts.get(new, 0) + 1

    def _note_change(self, kind: str, n: int = 1) -> None:
        """Count a catalogue change (new, changed, removed) in this refresh cycle's figures (see roll_cycle). What
        the first cycle finds is the site as it is, not news: it is not counted as new."""
        if kind == "new" and self._cycle.get("first", self._cycle.get("start") is None):
            return
        self._cycle[kind] = self._cycle.get(kind, 0) + n
        self._cycle_dirty = True

    def roll_cycle(self, now: float, length: float, due: int = 0) -> bool:
        """Count `due` pages gone back in line for a revisit now, and close the refresh cycle when it is over:
        the first (the crawl's first visit of its pages) once pages came due again and no URL in line was never
        fetched (checked at most every `length` seconds: the check reads the frontier), the others once they
        are `length` seconds old. The closed cycle's counts (pages due again; new, changed and removed items)
        become the last cycle's (the status command and the web page show them). True when it rolled."""
        start = self._cycle.get("start")
        if start is None:
            # A store whose pages are due at once (refresh switched on for a crawl already made) has no first
            # visit to wait for.
            self._cycle = {"start": now, "first": not due, "due": due}
            self._cycle_dirty = True
            return False
        first = bool(self._cycle.get("first"))
        if first:
            over = bool(due or self._cycle.get("due")) and now - self._first_checked >= length
            if over:
                self._first_checked = now
                over = not self._first_visits_left()
        else:
            over = now - start >= length
        if not over:
            if due:
                self._cycle["due"] = self._cycle.get("due", 0) + due
                self._cycle_dirty = True
            return False
        self._begin()
        last = {"start": start, "end": now, "first": first, "due": self._cycle.get("due", 0),
                **{k: self._cycle.get(k, 0) for k in _CHANGE_KINDS}}
        self._write_meta("last_cycle", last)
        self._cycle = {"start": now, "first": False, "due": due}
        self._cycle_dirty = True
        return True

    def _first_visits_left(self) -> bool:
        """Whether a URL in line (queued or leased) was never fetched. Through the frontier's and the leases'
        partial indexes; stops at the first such URL, which while the first visit goes on comes early."""
        return any(self.db.execute(
            f"SELECT 1 FROM url_state u WHERE u.state = {state} AND NOT EXISTS "
            f"(SELECT 1 FROM pages p WHERE p.id = u.id AND p.last_crawl IS NOT NULL) LIMIT 1").fetchone()
            for state in (QUEUED, LEASED))

    def changes_since(self, since: float) -> Iterator[dict[str, Any]]:
        """Catalogue items that appeared, changed or were removed at `since` or later, the latest event first
        named in "change" (new, changed, removed), in the order of that event (streams, through an index, a
        page of rows at a time)."""
        when = self._event_at
        last: tuple[float, int] | None = None
        args: tuple[Any, ...]
        while True:
            if last is None:
                cond, args = f"{when} >= ?", (since,)
            else:
                cond, args = f"({when}, id) > (?, ?)", last
            rows = self.db.execute(f"SELECT {self._audio_select}, {when}, id FROM audio WHERE {cond} "
                                   f"ORDER BY {when}, id LIMIT 1000", args).fetchall()
            if not rows:
                return
            last = (rows[-1][-2], rows[-1][-1])
            for values in rows:
                d = self._audio_dict(values)
                if d.get("removed_at") is not None and d["status"] == REMOVED:
                    d["change"] = REMOVED
                elif d.get("returned_at") is not None and d["returned_at"] >= since:
                    d["change"] = "new"          # listed again after its removal: it appeared again
                elif d.get("changed_at") is not None and d["changed_at"] >= since:
                    d["change"] = CHANGED
                else:
                    d["change"] = "new"
                yield d

    @staticmethod
    def _audio_dict(row: Sequence[Any]) -> dict[str, Any]:
        d = dict(zip(AUDIO_COLUMNS, row))
        for c in _JSON_COLUMNS:
            d[c] = json.loads(d[c]) if d[c] else {}
        return d

    def _audio_rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[dict[str, Any]]:
        # Pages of rows by id: streams on either database without holding a cursor open across yields.
        last = 0
        cond = f"({where}) AND " if where else ""
        while True:
            rows = self.db.execute(f"SELECT {self._audio_select}, id FROM audio WHERE {cond}id > ? "
                                   f"ORDER BY id LIMIT 1000", (*args, last)).fetchall()
            if not rows:
                return
            last = rows[-1][-1]
            for row in rows:
                yield self._audio_dict(row)

    def catalogue(self, settled: bool = False) -> Iterator[dict[str, Any]]:
        """Every catalogue row in the order found, for export (streams; does not load the table). settled: only
        the rows whose download is not pending (the catalogue file takes a row once its download ended)."""
        return self._audio_rows(f"status != '{PENDING}'") if settled else self._audio_rows()

    def search_audio(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        """Catalogue rows whose title, artist, audio URL or page contains `query` (case-insensitive for
        ASCII), newest first; an empty query gives the newest rows. Bounded by `limit`; a query that matches
        little may read the whole table, so callers run it off the event loop (see master/web.py)."""
        cols = "url, page, title, artist, album, status, node, found_at"
        args: tuple[Any, ...]
        if not query:
            sql, args = f"SELECT {cols} FROM audio ORDER BY id DESC LIMIT ?", (limit,)
        else:
            like = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            cond = " OR ".join(f"{c} {self.db.like} ? ESCAPE '\\'" for c in ("title", "artist", "url", "page"))
            sql, args = f"SELECT {cols} FROM audio WHERE {cond} ORDER BY id DESC LIMIT ?", (like,) * 4 + (limit,)
        names = [c.strip() for c in cols.split(",")]
        return [dict(zip(names, row)) for row in self.db.execute(sql, args).fetchall()]

    # -- figures -------------------------------------------------------------------------------------

    def count_discards(self, reasons: Mapping[str, int]) -> None:
        """Add to the discard counters (URLs dropped by policy, by reason)."""
        self._begin()
        self.db.executemany(
            "INSERT INTO discards(reason, n) VALUES (?, ?) ON CONFLICT(reason) DO UPDATE SET n = discards.n + excluded.n",
            [(r, n) for r, n in reasons.items() if n])

    def fetched_bytes(self) -> int:
        """Bytes the workers reported fetched over the whole crawl: pages and stored audio (crawl.max_bytes)."""
        row = self.db.execute("SELECT coalesce(sum(value), 0) FROM node_stats "
                              "WHERE name IN ('bytes', 'audio_bytes')").fetchone()
        return int(row[0])

    def note_node(self, node: str, **counters: int) -> None:
        """Add to one node's figures (pages, errors, bytes ...)."""
        self._begin()
        self.db.executemany(
            "INSERT INTO node_stats(node, name, value) VALUES (?, ?, ?) "
            "ON CONFLICT(node, name) DO UPDATE SET value = node_stats.value + excluded.value",
            [(node, k, v) for k, v in counters.items()])

    def _current_counts(self) -> dict[tuple[int, str], int]:
        if self.readonly:
            return {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        return self._counts

    def status(self) -> dict[str, Any]:
        """The operator's figures, read in one snapshot (a reader beside a running master sees one commit):

        states: URLs by state; frontier: queued URLs; frontier_by_node: queued URLs by routed node ("None":
        not routed); nodes: per node, its URLs by state plus the note_node() counters; discards: by reason;
        audio: catalogue rows by status ("pending": the download is under way at a node); downloads_pending:
        the downloads the master waits for (pending_downloads rows); figures: what the master saved under the meta key "figures" (HTTP
        status and error reason counts, recent errors); paused: whether the operator paused the crawl. Cheap in
        the master: counts come from memory, the rest are small tables.
        """
        snapshot = self.readonly and not self.db.in_transaction
        if snapshot:
            self.db.begin_snapshot()
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
            paused = bool(self.get_meta("paused", False))
            limit = self.get_meta(LIMIT_META)
            pending = self.pending_count() if self._has_pending else 0
            cycle = self.get_meta("cycle", {}) if self.readonly else self._cycle
            changes = {"this_cycle": {"start": cycle.get("start"), "first": bool(cycle.get("first")),
                                      "due": cycle.get("due", 0), **{k: cycle.get(k, 0) for k in _CHANGE_KINDS}},
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
            "downloads_pending": pending,
            "figures": figures,
            "changes": changes,
            "paused": paused,
            "limit": limit,
        }

    def url_counts(self) -> dict[str, int]:
        """URLs by state for /metrics: queued, leased, done, failed (the store's in-memory counts) and
        discarded (the discards table: a row per reason). URLs robots.txt refused are among the discarded (reason
        "robots"), so their own state is not counted again. Nothing here scans the URL table."""
        by_state = {name: 0 for name in STATE_NAMES.values()}
        for (state, _node), n in self._current_counts().items():
            by_state[STATE_NAMES[state]] += n
        discarded = self.db.execute("SELECT coalesce(sum(n), 0) FROM discards").fetchone()[0]
        return {"queued": by_state["queued"], "leased": by_state["leased"], "done": by_state["done"],
                "failed": by_state["error"], "discarded": int(discarded)}

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


# -- upgrading a store of an earlier layout ---------------------------------------------------------------

_V1_URL_COLUMNS = ("url", "depth", "priority", "seq", "slot", "state", "node", "parent", "attempts", "last_crawl",
                   "http_status", "final_url", "content_type", "size", "error", "lastmod")


class NothingToUpgrade(StoreError):
    """upgrade-store on a store already in this crawler's layout: nothing to do, not a failure."""


def upgrade_layout(path: Path, *, chunk: int = 20_000,
                   progress: Callable[[int], None] | None = None) -> tuple[int, Path]:
    """Rewrite an SQLite store of layout 1 (URL text per row, a separate key index) or 2 (rows keyed by a hash of
    host and URL) in the current layout: row ids in arrival order, the URL index beside the file.

    Written beside the old file and swapped in only when complete, so a crash midway leaves the old store as it
    was; the old file is kept as ``<path>.layout<N>`` until the operator removes it. Returns how many URLs moved,
    and where the old file is now.
    Refuses while a master holds the store. Every row keeps its state, node, place in line, attempts and results.
    """
    import sqlite3

    from crawler.master.backend import SqliteBackend, take_lock

    path = Path(path)
    new_path = path.with_name(path.name + ".upgrading")
    SqliteBackend(path, readonly=True).close()      # it exists and is an SQLite file
    lock_fd = take_lock(path)                        # and no master holds it, nor will until this is done
    try:
        old = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            app_id = old.execute("PRAGMA application_id").fetchone()[0]
            version = old.execute("PRAGMA user_version").fetchone()[0]
            if app_id != 0x41435257:
                raise StoreError(f"{path}: not a crawl database")
            if version not in (1, 2):
                raise (NothingToUpgrade if version == SCHEMA_VERSION else StoreError)(
                    f"{path}: layout {version}, nothing to upgrade (this crawler reads {SCHEMA_VERSION})")
            for suffix in ("", "-wal", "-shm", ".urlidx"):
                Path(f"{new_path}{suffix}").unlink(missing_ok=True)
            new = MasterStore(new_path)
            if version == 1:
                moved = _copy_v1(new, old, chunk, progress)
            else:
                moved = _copy_v2(new, path, progress)
            new.close()
        finally:
            old.close()
        kept = path.with_name(f"{path.name}.layout{version}")
        path.rename(kept)
        for suffix in ("-wal", "-shm", ".urlidx"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        Path(f"{new_path}.urlidx").rename(Path(f"{path}.urlidx"))
        new_path.rename(path)
        return moved, kept
    finally:
        os.close(lock_fd)


def upgrade_postgres(location: str, *, progress: Callable[[int], None] | None = None) -> int:
    """Bring a PostgreSQL store of layout 2 to the current one, in place and in one transaction: its rows keep
    their ids (new ones follow the highest), and the URL index table is filled from them. Returns the URLs
    indexed."""
    db = open_backend(location, readonly=False)
    try:
        version = db.schema_version()
        if version != 2:
            raise (NothingToUpgrade if version == SCHEMA_VERSION else StoreError)(
                f"{describe(location)}: layout {version}, nothing to upgrade (this crawler reads {SCHEMA_VERSION})")
        db.begin()
        db.script(SqlUrlIndex.DDL)
        index = SqlUrlIndex(db)
        n = 0
        for rows in _url_rows(db, None, 50_000):
            index.add(url_hashes(u for _, u in rows), [i for i, _ in rows])
            n += len(rows)
            if progress is not None:
                progress(n)
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
        return n
    finally:
        db.close()


def _copy_tables(store: MasterStore, old: Any) -> None:
    for table, cols in (("meta", "key, value"), ("counts", "state, node, n"), ("discards", "reason, n"),
                        ("node_stats", "node, name, value")):
        rows = old.execute(f"SELECT {cols} FROM {table}").fetchall()
        store.db.executemany(f"INSERT INTO {table}({cols}) VALUES ({', '.join('?' * len(cols.split(',')))})"
                            f" ON CONFLICT DO NOTHING", rows)
    present = {r[1] for r in old.execute("PRAGMA table_info(audio)")}
    cols = ", ".join(c for c in ("ukey", *AUDIO_COLUMNS) if c in present)
    cur = old.execute(f"SELECT {cols} FROM audio ORDER BY id")
    while batch := cur.fetchmany(5000):
        store.db.executemany(f"INSERT INTO audio({cols}) VALUES ({', '.join('?' * len(cols.split(',')))})", batch)


def _copy_v2(store: MasterStore, old_path: Path, progress: Callable[[int], None] | None) -> int:
    """Layout 2 -> current: the same tables; URL rows get ids in line order (seq), and every reference to a row
    (parent, pages, page_visits) follows it. Set-wise SQL on an attached copy, one transaction."""
    db = store.db
    db.execute("ATTACH DATABASE ? AS old", (str(old_path),))
    try:
        store._begin()

        def cols(table: str) -> str:
            new = [r[1] for r in db.execute(f"PRAGMA main.table_info({table})")]
            old = {r[1] for r in db.execute(f"PRAGMA old.table_info({table})")}
            return ", ".join(c for c in new if c in old)

        for table in ("meta", "counts", "discards", "node_stats", "origins", "nodes", "audio", "audio_history",
                      "pending_downloads"):
            if db.execute("SELECT 1 FROM old.sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone():
                c = cols(table)
                db.execute(f"INSERT INTO main.{table}({c}) SELECT {c} FROM old.{table} WHERE true "
                           f"ON CONFLICT DO NOTHING")
        db.execute("CREATE TEMP TABLE remap (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
        db.execute("INSERT INTO temp.remap(old, new) SELECT id, row_number() OVER (ORDER BY seq, id) "
                   "FROM old.url_state")
        db.execute("INSERT INTO main.url_state(id, origin, path, state, node, depth, priority, seq, slot, parent, "
                   "parent_url, attempts) SELECT r.new, u.origin, u.path, u.state, u.node, u.depth, u.priority, "
                   "u.seq, u.slot, p.new, u.parent_url, u.attempts "
                   "FROM old.url_state u JOIN temp.remap r ON r.old = u.id LEFT JOIN temp.remap p ON p.old = u.parent ORDER BY r.new")
        for table in ("pages", "page_visits"):
            names = [x for x in cols(table).split(", ") if x != "id"]
            db.execute(f"INSERT INTO main.{table}(id, {', '.join(names)}) SELECT r.new, "
                       f"{', '.join('t.' + x for x in names)} FROM old.{table} t JOIN temp.remap r ON r.old = t.id "
                       "ORDER BY r.new")
        moved = int(db.execute("SELECT count(*) FROM temp.remap").fetchone()[0])
        db.execute("DROP TABLE temp.remap")
        store._load_counts()
        store._load_names()
        store._next_seq = int(store.get_meta("next_seq", 0))
        store.commit()
        # The rows came in by SQL: index them as a master does when it finds the index missing.
        store._close_index()
        if store.index_path is not None:
            store.index_path.unlink(missing_ok=True)
        store._open_index()
        store._fill_refs()      # the layout had no references: the catalogue's items get theirs
        store.commit()
        if progress is not None:
            progress(moved)
        return moved
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")       # a failed copy leaves the new file empty; the old one is untouched
        db.execute("DETACH DATABASE old")


def _copy_v1(store: MasterStore, old: Any, chunk: int, progress: Callable[[int], None] | None) -> int:
    store._begin()
    _copy_tables(store, old)
    moved = 0
    cur = old.execute(f"SELECT {', '.join(_V1_URL_COLUMNS)} FROM urls ORDER BY seq, id")
    while rows := cur.fetchmany(chunk):
        by_url = {r[0]: r for r in rows}
        origin_of = store._origin_ids(split_url(u)[0] for u in by_url)
        states, pages = [], []
        key = store._take_ids(list(by_url))
        for (url, depth, priority, seq, slot, state, node, parent, attempts, *result) in by_url.values():
            origin, rest = split_url(url)
            states.append((key, origin_of[origin], rest, state, store._node_id(node), depth, priority, seq, slot,
                           parent, attempts))
            if any(v is not None for v in result):
                pages.append((key, *result))
            key += 1
        store.db.executemany(
            "INSERT INTO url_state(id, origin, path, state, node, depth, priority, seq, slot, parent_url, attempts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", states)
        store._write_pages((*_FETCH_COLUMNS, "lastmod"), pages)
        moved += len(states)
        store.commit()
        store._begin()
        if progress is not None:
            progress(moved)
    # Parents by key now that every URL has one (a parent the table never held keeps its text).
    last = None
    while True:
        op, start = _from(last)
        rows = store.db.execute(f"SELECT id, parent_url FROM url_state WHERE id {op} ? AND parent_url IS NOT NULL "
                               f"ORDER BY id LIMIT ?", (start, chunk)).fetchall()
        if not rows:
            break
        last = rows[-1][0]
        keys = {u: r[1] for u, r in store._lookup({p for _, p in rows}, "url, id").items()}
        store.db.executemany("UPDATE url_state SET parent = ?, parent_url = NULL WHERE id = ?",
                            [(keys[p], i) for i, p in rows if p in keys])
        store.commit()
        store._begin()
    store._load_counts()
    store._next_seq = int(store.get_meta("next_seq", 0))
    store._fill_refs()          # the layout had no references: the catalogue's items get theirs
    store.commit()
    return moved
