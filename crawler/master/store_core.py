"""The part of the master store its three parts share: one backend, one open transaction, and what each of them
needs of the URL table (crawler/master/store.py describes the layout).

A store is a facade (``MasterStore``) over three parts that write into the same transaction: the frontier
(store_frontier.py), the page visits and revisits (store_visits.py) and the audio catalogue (store_audio.py). What
they share lives here: the backend and its transaction (begin, the commit in two halves, atomic units), the URL
table's names (node ids, origin ids), the URL index and the lookups by URL text through it, the counts by
(state, node) kept in memory and written with each commit, the line's sequence numbers, the meta table.

A part that keeps figures of its own in memory (the catalogue's counts and its refresh cycle) registers with
``parts``: its figures are written into the transaction at each commit, and an atomic unit that fails restores
them with the rest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, Protocol

from crawler.master.backend import Backend, ReadOnlyStoreError, StoreError, describe, is_postgres
from crawler.master.urlindex import FileUrlIndex, SqlUrlIndex, UrlIndex, url_hashes
from crawler.web.memo import Memo

log = logging.getLogger(__name__)

QUEUED, LEASED, DONE, ERROR, ROBOTS = 0, 1, 2, 3, 4
# ROBOTS: refused by the site's robots.txt, never fetched. Apart from ERROR, so that such a URL is counted once
# (as discarded by "robots"), never as failed, and `retry` leaves it alone.
STATE_NAMES = {QUEUED: "queued", LEASED: "leased", DONE: "done", ERROR: "error", ROBOTS: "robots"}

Route = Callable[[Sequence[str]], list[str | None]]

# Rows per statement when the store works through a large set (reroute, requeue, lookups).
CHUNK = 2000
# Origin ids the store keeps in memory (an LRU): enough for the hosts of a busy crawl, bounded whatever its size.
_ORIGIN_CACHE = 100_000

# The parent's text: its own when it is not in the table, else the text of the row its key names.
PARENT = ("coalesce(u.parent_url, (SELECT po.origin || p.path FROM url_state p JOIN origins po ON po.id = p.origin "
          "WHERE p.id = u.parent))")
# What a fetch said of a URL: the result columns of ``pages`` a finished fetch writes.
FETCH_COLUMNS = ("last_crawl", "http_status", "final_url", "content_type", "size", "error")


@dataclass(slots=True)
class PageOutcome:
    """A node's verdict on one leased URL. (Not frozen, though nothing changes it: one is made per page crawled,
    and a frozen dataclass sets each of its 13 fields through object.__setattr__, 1.7 us against 0.3.)"""

    url: str
    state: str                    # "done" | "error" | "retry" | "throttled" (a retry that costs no attempt)
    http_status: int | None
    final_url: str | None
    content_type: str | None
    size: int | None
    error: str | None
    node: str
    at: float
    # What a page visit brings for revisits and the catalogue's history (see Frontier.finish()).
    etag: str | None = None
    last_modified: str | None = None
    digest: int | None = None           # 64-bit hash of a 2xx body
    # The catalogue keys (listed_keys) of the audio the visit reported, whatever page each names: what this URL
    # lists now. All of it unless `error` is set (a resolver failed: the visit takes no item off the URL).
    audio_keys: frozenset[tuple[str, str]] | None = None


def null_columns(rows: Sequence[Sequence[Any]], start: int = 0) -> frozenset[int]:
    """The positions, from `start` on, where every one of these rows (all of one length, at least one)
    holds None. sqlite3 binds a None through its adapter lookup, some 0.3 us each, where an int or a short
    text takes a tenth of that: a statement spells such a column as NULL (or leaves it out of an insert)."""
    n = len(rows)
    return frozenset(i for i, column in enumerate(zip(*rows)) if i >= start and column.count(None) == n)


def insert_rows(db: Backend, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], *,
                constants: tuple[tuple[str, str], ...] = (), suffix: str = "") -> int:
    """INSERT INTO table the rows (values in the order of ``columns``), leaving out the columns none of them sets
    (null_columns): a column not named is NULL all the same, for a table that gives it no default. ``constants``:
    (column, SQL literal) pairs every row takes; ``suffix``: a clause after the values (ON CONFLICT ...). Returns
    the rows inserted. The statement of each set of columns is made once (_INSERTS)."""
    nulls = null_columns(rows)
    keep = tuple(i for i in range(len(columns)) if i not in nulls)
    key = (table, tuple(columns), keep, constants, suffix)
    sql = _INSERTS.get(key)
    if sql is None:
        names = [columns[i] for i in keep] + [c for c, _ in constants]
        values = ["?"] * len(keep) + [v for _, v in constants]
        sql = _INSERTS.keep(key, f"INSERT INTO {table}({', '.join(names)}) VALUES ({', '.join(values)}){suffix}")
    if not nulls:
        return db.executemany(sql, rows)
    return db.executemany(sql, map(itemgetter(*keep), rows) if len(keep) > 1 else [(r[keep[0]],) for r in rows])


_INSERTS: Memo[tuple[str, tuple[str, ...], tuple[int, ...], tuple[tuple[str, str], ...], str], str] = Memo(256)


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


def key_from(after: int | None) -> tuple[str, int]:
    """The condition on keys for "after this key" (None: from the first); keys span the whole int64 range."""
    return (">=", -(1 << 63)) if after is None else (">", after)


def url_rows(db: Backend, after: int | None = None, batch: int = 100_000) -> Iterator[list[tuple[int, str]]]:
    """(id, url) of every URL with an id after ``after`` (None: all), in id order, a batch at a time."""
    while True:
        op, start = key_from(after)
        rows = db.execute("SELECT u.id, o.origin || u.path FROM url_state u JOIN origins o ON o.id = u.origin "
                          f"WHERE u.id {op} ? ORDER BY u.id LIMIT ?", (start, batch)).fetchall()
        if not rows:
            return
        after = rows[-1][0]
        yield rows


def next_id_of(db: Backend) -> int:
    """The id the next new URL takes: ids are given in arrival order."""
    return int(db.execute("SELECT coalesce(max(id), 0) FROM url_state").fetchone()[0]) + 1


def node_key(node: str | None) -> str:
    return "" if node is None else node


def node_of(key: str) -> str | None:
    return None if key == "" else key


def chunks(seq: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


class Part(Protocol):
    """What a part that keeps figures in memory offers the transaction (see StoreCore.parts)."""

    def stage(self) -> None:
        """Write the figures changed since the last commit into the open transaction."""

    def save(self) -> object:
        """A copy of the figures, for an atomic unit to go back to."""

    def restore(self, saved: object) -> None:
        """Back to a copy save() made."""


class StoreInUse(RuntimeError):
    """The store was used while its connection is lent to the commit thread (see crawler/master/storegate.py):
    a task of the master started without the store gate."""


class _Lent(Backend):
    """Stands in for the connection while the commit thread has it: any use of the store meets it and raises."""

    def __init__(self, where: str) -> None:
        self.where = where

    def __getattribute__(self, name: str) -> Any:
        if name in ("where", "__class__", "__dict__"):
            return object.__getattribute__(self, name)
        raise StoreInUse(f"{object.__getattribute__(self, 'where')}: the store was used while a commit runs on "
                         "the commit thread (a task started without the store gate)")


class StoreCore:
    """The backend, its open transaction and the URL table's names, shared by the store's parts. Used from one
    thread at a time (see end_transaction for the one method that may run on another)."""

    def __init__(self, db: Backend, location: Path | str, *, readonly: bool,
                 slot_of: Callable[[str], int] | None = None) -> None:
        # The connection every part uses: `backend` itself, or a stand-in that refuses every use while the
        # connection is lent to the commit thread (lend, take_back).
        self.db = db
        self.backend = db
        self.location = location
        self.readonly = readonly
        # The scheduler's first hash (URL -> slot of the node table), recorded at push (see reroute_slots).
        self.slot_of = slot_of
        self.parts: list[Part] = []
        self.counts: dict[tuple[int, str], int] = {}
        self.dirty_counts: set[tuple[int, str]] = set()
        self.next_seq = 0
        self.seq_dirty = False
        self.origins: OrderedDict[str, int] = OrderedDict()
        self.next_origin = 0
        self.node_ids: dict[str, int] = {}
        self.node_names: dict[int, str] = {}
        self.next_id = 1
        self.index: UrlIndex | None = None

    def start(self) -> None:
        """The store's names and (for a writer) its counters from the tables, then the URL index."""
        self.load_names()
        if not self.readonly:
            self.db.start_writing()
            self.load_counts()
            self.next_seq = int(self.get_meta("next_seq", 0))
        self.open_index()

    @property
    def index_path(self) -> Path | None:
        """The URL index file of an SQLite store (None on PostgreSQL, whose index is a table)."""
        return None if is_postgres(self.location) else Path(f"{self.location}.urlidx")

    def open_index(self) -> None:
        self.next_id = next_id_of(self.db)
        path = self.index_path
        if path is None:
            self.index = SqlUrlIndex(self.db)
            return
        token = self.get_meta("url_index")
        if self.readonly:
            try:
                self.index = FileUrlIndex(path, str(token), readonly=True) if token else None
            except OSError:
                self.index = None      # lookups by text say so; everything else reads on
            return
        if token is None:
            token = secrets.token_hex(16)
            self.begin()
            self.write_meta("url_index", token)
            self.commit()
        index = self.index = FileUrlIndex(path, str(token))
        since = 0 if index.fresh else index.synced_through
        if self.next_id - 1 > since:
            # Rows committed after the index was last made durable (a machine crash may have lost their entries),
            # or all of them for a new index: index them again; an entry already there is not added twice.
            t0, n = time.monotonic(), 0
            for rows in url_rows(self.db, since):
                hashes = url_hashes(u for _, u in rows)
                have = set(index.find(hashes)) if not index.fresh else set()
                todo = [(h, r[0]) for k, (h, r) in enumerate(zip(hashes, rows)) if (k, r[0]) not in have]
                index.add([h for h, _ in todo], [i for _, i in todo])
                n += len(rows)
            index.sync(self.next_id - 1)
            if index.fresh or n > 1_000_000:
                log.warning("URL index %s: %d rows indexed in %.1f s", path, n, time.monotonic() - t0)

    def close_index(self) -> None:
        if self.index is not None:
            self.index.close()
            self.index = None

    def load_names(self) -> None:
        self.node_ids = {name: i for i, name in self.db.execute("SELECT id, name FROM nodes")}
        self.node_names = {i: name for name, i in self.node_ids.items()}
        self.origins.clear()
        self.next_origin = int(self.db.execute("SELECT coalesce(max(id), 0) FROM origins").fetchone()[0])

    def load_counts(self) -> None:
        self.counts = {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        self.dirty_counts.clear()

    # -- transactions --------------------------------------------------------------------------------

    def begin(self) -> None:
        if self.readonly:
            raise ReadOnlyStoreError(f"{describe(self.location)}: opened read-only")
        if not self.db.in_transaction:
            self.db.begin()

    def commit(self) -> None:
        """End the open transaction: everything written since the last commit becomes durable at once."""
        if self.prepare_commit():
            self.end_transaction()

    def prepare_commit(self) -> bool:
        """commit()'s first half, on the store's own thread: the counters the store keeps in memory (its own and
        its parts') are written into the open transaction. True when there is a transaction for end_transaction()
        to end."""
        if self.readonly or not self.db.in_transaction:
            return False
        if self.dirty_counts:
            self.db.executemany(
                "INSERT INTO counts(state, node, n) VALUES (?, ?, ?) "
                "ON CONFLICT(state, node) DO UPDATE SET n = excluded.n",
                [(s, n, self.counts.get((s, n), 0)) for s, n in sorted(self.dirty_counts)])
            self.dirty_counts.clear()
        if self.seq_dirty:
            self.write_meta("next_seq", self.next_seq)
            self.seq_dirty = False
        for part in self.parts:
            part.stage()
        return True

    def end_transaction(self) -> None:
        """commit()'s second half: COMMIT, the part that waits on the disk (on SQLite the WAL is written, and
        every few thousand pages checkpointed into the database file, with fsyncs), then the URL index's upkeep
        (now and then an fsync). It changes no state the loop reads, so it may run on another thread, provided
        nothing uses the store until it returns (the master lends the store to its commit thread for that time:
        crawler/master/storegate.py)."""
        self.backend.execute("COMMIT")
        if self.index is not None:
            self.index.after_commit(self.next_id - 1, time.monotonic())

    def lend(self) -> None:
        """The connection goes to another thread for end_transaction: until take_back(), any other use of the
        store raises StoreInUse rather than interleave its statements with the COMMIT."""
        self.db = _Lent(describe(self.location))

    def take_back(self) -> None:
        self.db = self.backend

    @contextlib.contextmanager
    def atomic(self) -> Iterator[None]:
        """A unit inside the open transaction (one report): if it raises, everything it wrote is undone, the
        counters with it, and the rest of the transaction stays."""
        self.begin()
        saved = (dict(self.counts), set(self.dirty_counts), self.next_seq, self.seq_dirty, self.next_id)
        parts = [part.save() for part in self.parts]
        self.db.execute("SAVEPOINT unit")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO SAVEPOINT unit")
            self.db.execute("RELEASE SAVEPOINT unit")
            self.counts, self.dirty_counts, self.next_seq, self.seq_dirty, self.next_id = saved
            for part, copy in zip(self.parts, parts, strict=True):
                part.restore(copy)
            self.load_names()       # ids handed out inside the unit are gone with it
            raise
        self.db.execute("RELEASE SAVEPOINT unit")

    def close(self) -> None:
        """Commit what is open and close; a stopped master leaves nothing half-written."""
        try:
            self.commit()
            if self.index is not None and not self.readonly:
                self.index.sync(self.next_id - 1)          # a master that stops leaves its index durable
        finally:
            self.close_index()
            self.backend.close()

    def limit_time(self, seconds: float) -> None:
        """Queries from now on are cut off after `seconds` with a StoreError."""
        self.db.limit_time(seconds)

    def move(self, state_from: int | None, node_from: str | None, state_to: int, node_to: str | None,
             n: int = 1) -> None:
        """Count a URL (or n) leaving one (state, node) for another; None: it is new."""
        if state_from is not None:
            k = (state_from, node_key(node_from))
            self.counts[k] = self.counts.get(k, 0) - n
            self.dirty_counts.add(k)
        k = (state_to, node_key(node_to))
        self.counts[k] = self.counts.get(k, 0) + n
        self.dirty_counts.add(k)

    def take_seq(self) -> int:
        self.next_seq += 1
        self.seq_dirty = True
        return self.next_seq

    def take_seqs(self, n: int) -> int:
        """n places in line at once: the first of them, the others following it (what n take_seq() give)."""
        first = self.next_seq + 1
        self.next_seq += n
        self.seq_dirty = True
        return first

    # -- names: nodes and origins --------------------------------------------------------------------

    def node_id(self, name: str | None) -> int | None:
        """The small id a node's name is stored as (created on first use, in the open transaction)."""
        if name is None:
            return None
        i = self.node_ids.get(name)
        if i is None:
            i = max(self.node_names, default=0) + 1
            self.db.execute("INSERT INTO nodes(id, name) VALUES (?, ?)", (i, name))
            self.node_ids[name], self.node_names[i] = i, name
        return i

    def origin_ids(self, origins: Iterable[str]) -> dict[str, int]:
        """Ids of these origins, creating the new ones in the open transaction. Remembers the recent ones."""
        out: dict[str, int] = {}
        missing = []
        for o in set(origins):
            i = self.origins.get(o)
            if i is None:
                missing.append(o)
            else:
                self.origins.move_to_end(o)
                out[o] = i
        for chunk in chunks(missing):
            for i, o in self.db.execute(f"SELECT id, origin FROM origins WHERE {self.db.in_list('origin')}",
                                        (self.db.list_arg(chunk),)):
                out[o] = i
        new = [o for o in missing if o not in out]
        if new:
            rows = []
            for o in new:
                self.next_origin += 1
                out[o] = self.next_origin
                rows.append((self.next_origin, o))
            self.db.executemany("INSERT INTO origins(id, origin) VALUES (?, ?)", rows)
        for o in missing:
            self.origins[o] = out[o]
        while len(self.origins) > _ORIGIN_CACHE:
            self.origins.popitem(last=False)
        return out

    # -- the URL table ---------------------------------------------------------------------------------

    def lookup(self, urls: Iterable[str], columns: str) -> dict[str, tuple[Any, ...]]:
        """Rows of the given URLs that exist, keyed by URL, in the order asked; `columns` (of the urls view) must
        start with url."""
        if self.index is None:
            raise StoreError(f"{describe(self.location)}: the URL index is missing (the master rebuilds it when it "
                             "starts); finding URLs by their text needs it")
        wanted = list(dict.fromkeys(urls))
        hits = self.index.find(url_hashes(wanted))
        by_id: dict[int, tuple[Any, ...]] = {}
        ids = sorted({i for _, i in hits})
        sql = f"SELECT {columns}, id FROM urls WHERE {self.db.in_list('id')}"
        for chunk in chunks(ids):
            for row in self.db.execute(sql, (self.db.list_arg(chunk),)):
                by_id[row[-1]] = row[:-1]
        found: dict[str, tuple[Any, ...]] = {}
        for pos, i in hits:
            row = by_id.get(i)
            if row is not None and row[0] == wanted[pos]:      # not another URL on the hash, nor a lost row
                found[wanted[pos]] = row
        return {u: found[u] for u in wanted if u in found}

    def write_pages(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Set these result columns of URLs by key: rows are (id, value, ...), in the order of `columns`."""
        if not rows:
            return
        # A column no row sets is a NULL in the statement, not a None bound a row (see null_columns).
        nulls = null_columns(rows, 1)
        values = ", ".join("NULL" if i in nulls else "?" for i in range(1, len(columns) + 1))
        if nulls:
            keep = [i for i in range(len(columns) + 1) if i not in nulls]
            rows = list(map(itemgetter(*keep), rows)) if len(keep) > 1 else [(r[0],) for r in rows]
        self.db.executemany(
            f"INSERT INTO pages(id, {', '.join(columns)}) VALUES (?, {values}) ON CONFLICT(id) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in columns), rows)

    def take_ids(self, urls: Sequence[str]) -> int:
        """Ids for new rows of these URLs, indexed: urls[k] gets the returned id + k (ids in arrival order)."""
        assert self.index is not None
        first = self.next_id
        self.index.add(url_hashes(urls), range(first, first + len(urls)))
        self.next_id = first + len(urls)
        return first

    def current_counts(self) -> dict[tuple[int, str], int]:
        if self.readonly:
            return {(s, n): c for s, n, c in self.db.execute("SELECT state, node, n FROM counts")}
        return self.counts

    # -- small key/value table -----------------------------------------------------------------------

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set_meta(self, key: str, value: Any) -> None:
        """Store a small JSON-able value in the open transaction."""
        self.begin()
        self.write_meta(key, value)

    def write_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, json.dumps(value)))
