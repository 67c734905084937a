"""The master store's layout: the tables a new store is made with, the checks a store is opened with (ours, not
newer than this program), the small changes brought in place to a store of an earlier version of this layout
(tables and columns added since), and the rewrite of a store of an older layout (upgrade-store).

``open_store`` is how every store is opened: the backend, the layout checked or made, the shared core and the
catalogue started (crawler/master/store.py builds its facade on them; the upgrade writes through them).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crawler.master.backend import SqliteBackend, StoreError, describe, is_postgres, open_backend, take_lock
from crawler.master.store_audio import (
    AUDIO_COLUMNS,
    AUDIO_KEY,
    AUDIO_TABLE,
    COLUMN_TYPES,
    EVENT_AT,
    LIVE_TABLE,
    PENDING_TABLE,
    REFS_TABLE,
    AudioCatalogue,
)
from crawler.master.store_core import (
    ERROR,
    FETCH_COLUMNS,
    PARENT,
    QUEUED,
    ROBOTS,
    LEASED,
    StoreCore,
    key_from,
    split_url,
    url_rows,
)
from crawler.master.store_frontier import LINK_META_TABLE
from crawler.master.store_identify import AUDIO_URL_INDEX, IDENTIFY_TABLES, MATCHES_TABLE, MATCHES_TIME_INDEX
from crawler.master.store_identify import SCHEMA as IDENTIFY_SCHEMA
from crawler.master.urlindex import SqlUrlIndex, url_hashes

log = logging.getLogger(__name__)

# 1: one row per URL with its text, a text index of keys. 2: compact rows keyed by a hash of host and URL.
# 3: the layout described in crawler/master/store.py (row ids in arrival order, the URL index apart).
SCHEMA_VERSION = 3

ROBOTS_REASON = "disallowed by robots.txt"
# The meta key set once a store's robots-refused URLs (state ERROR before ROBOTS existed) moved to ROBOTS.
_ROBOTS_STATE_META = "robots_state"

_AUDIO_SHA_INDEX = "CREATE INDEX audio_sha ON audio(sha256) WHERE sha256 IS NOT NULL"
_AUDIO_EVENTS_INDEX = f"CREATE INDEX audio_events ON audio(({EVENT_AT}), id)"

SCHEMA = f"""
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
           u.slot AS slot, u.state AS state, n.name AS node, {PARENT} AS parent, u.attempts AS attempts,
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
{AUDIO_TABLE}
{_AUDIO_SHA_INDEX};
-- The catalogue's history: the bytes an address served before it changed (a page's items, for its next visit, are
-- found through the catalogue key, which leads with the page).
CREATE TABLE audio_history (
    id          {{AUTO_ID}},
    audio_id    {{INT}} NOT NULL,        -- audio.id
    sha256      TEXT NOT NULL,
    size        {{INT}},
    path        TEXT,
    replaced_at {{REAL}} NOT NULL        -- when other bytes were found at the address
);
CREATE INDEX audio_history_item ON audio_history(audio_id);
{LIVE_TABLE};
{_AUDIO_EVENTS_INDEX};
{PENDING_TABLE};
{REFS_TABLE};
{LINK_META_TABLE};
{IDENTIFY_SCHEMA}
"""



@dataclass(frozen=True)
class Layout:
    """What an open store's tables have, for the parts that read them."""

    audio_select: str        # the catalogue's columns to select, NULL for those an older store lacks
    event_at: str            # the time of an item's latest event, as the store's columns allow
    has_pending: bool        # the pending_downloads table exists
    refs_missing: bool       # audio_refs was made at this opening: to fill from the catalogue
    has_live: bool = True    # live_recordings exists (a reader of a store from before it: no windows)


def open_store(location: Path | str, *, readonly: bool, slot_of: Callable[[str], int] | None = None,
               cache_mb: int = 64, checkpoint_pages: int = 10_000) -> tuple[StoreCore, AudioCatalogue]:
    """Open (or create) a store: its backend, its layout checked and brought up to date, the shared core and the
    catalogue started. StoreError when it is not ours, newer, of an older layout, or held by another master."""
    db = open_backend(location, readonly=readonly, cache_mb=cache_mb, checkpoint_pages=checkpoint_pages)
    core = StoreCore(db, location, readonly=readonly, slot_of=slot_of)
    try:
        layout = _open_layout(core)
        core.start()
        audio = AudioCatalogue(core, audio_select=layout.audio_select, event_at=layout.event_at,
                               has_pending=layout.has_pending, has_live=layout.has_live)
        if layout.refs_missing and not readonly:
            audio.fill_refs()
            core.commit()
    except StoreError:
        core.close_index()
        db.close()
        raise
    except Exception as e:
        core.close_index()
        db.close()
        if type(e).__module__.startswith(("sqlite3", "psycopg")):
            raise StoreError(f"{describe(location)}: not a crawl database ({e})") from e
        raise
    except BaseException:
        core.close_index()
        db.close()
        raise
    return core, audio


def _open_layout(core: StoreCore) -> Layout:
    """Check the store's layout, make it in an empty store, and bring in place what this version of it added."""
    where = describe(core.location)
    version = core.db.schema_version()
    if version is None:
        if core.readonly:
            raise StoreError(f"{where}: empty database, not a crawl database")
        core.db.create(SCHEMA + (f";\n{SqlUrlIndex.DDL}" if is_postgres(core.location) else ""),
                       SCHEMA_VERSION)
        return Layout(", ".join(AUDIO_COLUMNS), EVENT_AT, has_pending=True, refs_missing=False)
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where}: schema version {version} is newer than this program's "
                         f"({SCHEMA_VERSION}); upgrade the crawler")
    if version < SCHEMA_VERSION:
        # The layout changed (URL text per row and a text index in 1; rows keyed by hash in 2): rewriting a big
        # crawl would hold the master for a long time, so say so rather than start on a state it cannot read.
        raise StoreError(f"{where}: crawl state from an older crawler (layout {version}, this one reads "
                         f"{SCHEMA_VERSION}): run `crawler-master upgrade-store` with this config once")
    has_pending = bool(core.db.columns("pending_downloads"))
    if not has_pending and not core.readonly:
        # A store from before downloads reported apart from their pages: the table starts empty.
        core.db.begin()
        for statement in core.db.ddl(PENDING_TABLE).split(";"):
            core.db.execute(statement)
        core.db.execute("COMMIT")
        has_pending = True
    refs_missing = not core.db.columns("audio_refs")
    if refs_missing and not core.readonly:
        # A store from before items were tracked by referrer: the table is made here and filled from the
        # catalogue once the URL index is open (AudioCatalogue.fill_refs).
        core.db.begin()
        for statement in core.db.ddl(REFS_TABLE).split(";"):
            core.db.execute(statement)
        core.db.execute("COMMIT")
    if not core.db.columns("link_meta") and not core.readonly:
        # A store from before links carried their page's words: the table starts empty.
        core.db.begin()
        core.db.execute(core.db.ddl(LINK_META_TABLE))
        core.db.execute("COMMIT")
    if not core.readonly and not all(core.db.columns(table) for table, _ in IDENTIFY_TABLES):
        # A store from before the works were identified: references, fingerprints and matches start empty.
        core.db.begin()
        for table, ddl in IDENTIFY_TABLES:
            if not core.db.columns(table):
                for statement in core.db.ddl(ddl).split(";"):
                    core.db.execute(statement)
        core.db.execute(AUDIO_URL_INDEX)
        core.db.execute("COMMIT")
    has_live = bool(core.db.columns("live_recordings"))
    if not has_live and not core.readonly:
        # A store from before live streams were recorded in windows: the table starts empty, and the matches
        # are keyed by window too (a file's matches are window 0: what they were).
        core.db.begin()
        for statement in core.db.ddl(LIVE_TABLE).split(";"):
            core.db.execute(statement)
        core.db.execute("COMMIT")
        has_live = True
    if not core.readonly and "live_id" not in core.db.columns("matches"):
        _matches_by_window(core)
    if not core.readonly and core.get_meta(_ROBOTS_STATE_META) is None:
        _robots_state(core)
    present = core.db.columns("audio")
    missing = [c for c in AUDIO_COLUMNS if c not in present]
    if missing and not core.readonly:
        # A store from before a field was added: the new columns start empty. ADD COLUMN only edits the
        # table's definition, so this is instant whatever the table's size.
        core.db.begin()
        for c in missing:
            core.db.execute(core.db.ddl(f"ALTER TABLE audio ADD COLUMN {c} {COLUMN_TYPES[c]}"))
        core.db.execute("COMMIT")
        missing = []
    if "returned_at" not in present and not core.readonly:
        # The changes index is on an item's latest event, which a return after a removal now is too: made
        # again once (a pass over the catalogue, not the URL table).
        core.db.begin()
        core.db.execute("DROP INDEX IF EXISTS audio_changes")
        core.db.execute(_AUDIO_EVENTS_INDEX.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        core.db.execute("COMMIT")
    if not core.readonly and not missing and AUDIO_KEY not in core.db.unique_keys("audio").values():
        _audio_key_by_page(core)
    if not core.readonly and "refresh" in core.db.indexes("pages"):
        # A store from before revisits were found through next_visit kept an index on pages(last_crawl) that
        # nothing reads: one index less to write a page crawled.
        core.db.begin()
        core.db.execute("DROP INDEX IF EXISTS refresh")
        core.db.execute("COMMIT")
    event_at = EVENT_AT if "returned_at" not in missing else "coalesce(removed_at, changed_at, found_at)"
    # A reader of an older store that it may not alter sees the missing columns as null.
    audio_select = ", ".join("NULL" if c in missing else c for c in AUDIO_COLUMNS)
    return Layout(audio_select, event_at, has_pending=has_pending, refs_missing=refs_missing, has_live=has_live)


def _matches_by_window(core: StoreCore) -> None:
    """A store from before the matches said when a live stream played a work: its matches table is made again
    with the window and the time played (one statement set-wise copy, one transaction; a key changes, which
    neither database alters in place). Its rows are the matches of files: window 0, never played at a time."""
    db = core.db
    db.begin()
    db.execute(db.ddl(MATCHES_TABLE.replace("CREATE TABLE matches (", "CREATE TABLE matches_new (", 1)
                      .split(";")[0]))
    db.execute("INSERT INTO matches_new(url, work, live_id, score, work_offset, matched_at) "
               "SELECT url, work, 0, score, work_offset, matched_at FROM matches")
    db.execute("DROP TABLE matches")          # and its index, made again below under its name
    db.execute("ALTER TABLE matches_new RENAME TO matches")
    db.execute(MATCHES_TIME_INDEX)
    db.execute("COMMIT")


def _audio_key_by_page(core: StoreCore) -> None:
    """A store from before the catalogue key led with the page (UNIQUE (ukey, page), and an index on page apart):
    the key is made again page first and the index on page goes, in one transaction. PostgreSQL swaps the
    constraint in place; SQLite cannot drop a table's constraint, so the table is copied set-wise into one made
    anew (its rows keep their ids), and its indexes made again. A table with a column this crawler does not
    know is left as it is: its key works either way round."""
    db = core.db
    present = db.columns("audio")
    if not present <= {"id", "ukey", *AUDIO_COLUMNS}:
        return
    t0, n = time.monotonic(), int(db.execute("SELECT count(*) FROM audio").fetchone()[0])
    db.begin()
    if is_postgres(core.location):
        for name, columns in db.unique_keys("audio").items():
            if sorted(columns) == sorted(AUDIO_KEY):
                db.execute(f'ALTER TABLE audio DROP CONSTRAINT "{name}"')
        db.execute(f"ALTER TABLE audio ADD UNIQUE ({', '.join(AUDIO_KEY)})")
    else:
        names = ", ".join(("id", "ukey", *AUDIO_COLUMNS))
        db.execute(db.ddl(AUDIO_TABLE.replace("CREATE TABLE audio (", "CREATE TABLE audio_new (", 1)))
        db.execute(f"INSERT INTO audio_new({names}) SELECT {names} FROM audio ORDER BY id")
        db.execute("DROP TABLE audio")        # and its indexes, made again below
        db.execute("ALTER TABLE audio_new RENAME TO audio")
        for ddl in (_AUDIO_SHA_INDEX, _AUDIO_EVENTS_INDEX, AUDIO_URL_INDEX):
            db.execute(ddl)
    db.execute("DROP INDEX IF EXISTS audio_page")
    db.execute("COMMIT")
    log.info("%s: the catalogue's key leads with the page now (%d items, %.1f s)", describe(core.location), n,
             time.monotonic() - t0)


def _robots_state(core: StoreCore) -> None:
    """A store from before robots-refused URLs had a state of their own (they were errors, "disallowed by
    robots.txt"): they move to ROBOTS and the error and robots counts are made again, in one transaction."""
    core.db.begin()
    core.db.execute(f"UPDATE url_state SET state = {ROBOTS} WHERE state = {ERROR} AND id IN "
                    "(SELECT id FROM pages WHERE error = ?)", (ROBOTS_REASON,))
    core.db.execute(f"DELETE FROM counts WHERE state IN ({ERROR}, {ROBOTS})")
    core.db.execute(
        "INSERT INTO counts(state, node, n) SELECT u.state, coalesce(n.name, ''), count(*) FROM url_state u "
        f"LEFT JOIN nodes n ON n.id = u.node WHERE u.state IN ({ERROR}, {ROBOTS}) GROUP BY u.state, n.name")
    core.write_meta(_ROBOTS_STATE_META, True)
    core.db.execute("COMMIT")


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
            core, audio = open_store(new_path, readonly=False)
            if version == 1:
                moved = _copy_v1(core, audio, old, chunk, progress)
            else:
                moved = _copy_v2(core, audio, path, progress)
            core.close()
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
        for rows in url_rows(db, None, 50_000):
            index.add(url_hashes(u for _, u in rows), [i for i, _ in rows])
            n += len(rows)
            if progress is not None:
                progress(n)
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
        return n
    finally:
        db.close()


def _copy_tables(core: StoreCore, old: Any) -> None:
    for table, cols in (("meta", "key, value"), ("counts", "state, node, n"), ("discards", "reason, n"),
                        ("node_stats", "node, name, value")):
        rows = old.execute(f"SELECT {cols} FROM {table}").fetchall()
        core.db.executemany(f"INSERT INTO {table}({cols}) VALUES ({', '.join('?' * len(cols.split(',')))})"
                            f" ON CONFLICT DO NOTHING", rows)
    present = {r[1] for r in old.execute("PRAGMA table_info(audio)")}
    cols = ", ".join(c for c in ("ukey", *AUDIO_COLUMNS) if c in present)
    cur = old.execute(f"SELECT {cols} FROM audio ORDER BY id")
    while batch := cur.fetchmany(5000):
        core.db.executemany(f"INSERT INTO audio({cols}) VALUES ({', '.join('?' * len(cols.split(',')))})", batch)


def _copy_v2(core: StoreCore, audio: AudioCatalogue, old_path: Path, progress: Callable[[int], None] | None) -> int:
    """Layout 2 -> current: the same tables; URL rows get ids in line order (seq), and every reference to a row
    (parent, pages, page_visits) follows it. Set-wise SQL on an attached copy, one transaction."""
    db = core.db
    db.execute("ATTACH DATABASE ? AS old", (str(old_path),))
    try:
        core.begin()

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
        core.load_counts()
        core.load_names()
        core.next_seq = int(core.get_meta("next_seq", 0))
        core.commit()
        # The rows came in by SQL: index them as a master does when it finds the index missing.
        core.close_index()
        if core.index_path is not None:
            core.index_path.unlink(missing_ok=True)
        core.open_index()
        audio.fill_refs()      # the layout had no references: the catalogue's items get theirs
        core.commit()
        if progress is not None:
            progress(moved)
        return moved
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")       # a failed copy leaves the new file empty; the old one is untouched
        db.execute("DETACH DATABASE old")


def _copy_v1(core: StoreCore, audio: AudioCatalogue, old: Any, chunk: int, progress: Callable[[int], None] | None) -> int:
    core.begin()
    _copy_tables(core, old)
    moved = 0
    cur = old.execute(f"SELECT {', '.join(_V1_URL_COLUMNS)} FROM urls ORDER BY seq, id")
    while rows := cur.fetchmany(chunk):
        by_url = {r[0]: r for r in rows}
        origin_of = core.origin_ids(split_url(u)[0] for u in by_url)
        states, pages = [], []
        key = core.take_ids(list(by_url))
        for (url, depth, priority, seq, slot, state, node, parent, attempts, *result) in by_url.values():
            origin, rest = split_url(url)
            states.append((key, origin_of[origin], rest, state, core.node_id(node), depth, priority, seq, slot,
                           parent, attempts))
            if any(v is not None for v in result):
                pages.append((key, *result))
            key += 1
        core.db.executemany(
            "INSERT INTO url_state(id, origin, path, state, node, depth, priority, seq, slot, parent_url, attempts) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", states)
        core.write_pages((*FETCH_COLUMNS, "lastmod"), pages)
        moved += len(states)
        core.commit()
        core.begin()
        if progress is not None:
            progress(moved)
    # Parents by key now that every URL has one (a parent the table never held keeps its text).
    last = None
    while True:
        op, start = key_from(last)
        rows = core.db.execute(f"SELECT id, parent_url FROM url_state WHERE id {op} ? AND parent_url IS NOT NULL "
                               f"ORDER BY id LIMIT ?", (start, chunk)).fetchall()
        if not rows:
            break
        last = rows[-1][0]
        keys = {u: r[1] for u, r in core.lookup({p for _, p in rows}, "url, id").items()}
        core.db.executemany("UPDATE url_state SET parent = ?, parent_url = NULL WHERE id = ?",
                            [(keys[p], i) for i, p in rows if p in keys])
        core.commit()
        core.begin()
    core.load_counts()
    core.next_seq = int(core.get_meta("next_seq", 0))
    audio.fill_refs()          # the layout had no references: the catalogue's items get theirs
    core.commit()
    return moved
