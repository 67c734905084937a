"""The master's durable state in SQLite (WAL): the URL table, the frontier, the audio catalogue, statistics.

Every method writes inside the open transaction; `commit()` ends it. The master commits every ~200 ms, so a
crash loses at most the last fraction of a second, and never leaves the frontier and the URL table disagreeing:
both change in the same transaction.

The frontier is a table ordered by (node, depth, priority, seq): each entry is routed to a node when it is
pushed, and a node pops only its own entries, so a slow node never holds up the others. Only what is popped is
in memory; the frontier is as large as the disk.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SCHEMA_VERSION = 1
QUEUED, LEASED, DONE, ERROR = 0, 1, 2, 3
STATE_NAMES = {QUEUED: "queued", LEASED: "leased", DONE: "done", ERROR: "error"}
# A URL whose leases keep getting lost (its worker dies on it) is given up after this many times max_attempts.
LOST_LEASE_FACTOR = 3

Route = Callable[[Sequence[str]], list]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS urls (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE,
    depth INTEGER NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    parent TEXT,
    state INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    node TEXT,
    http_status INTEGER,
    final_url TEXT,
    content_type TEXT,
    size INTEGER,
    error TEXT,
    last_crawl REAL
);
CREATE INDEX IF NOT EXISTS urls_state ON urls (state, last_crawl);
CREATE TABLE IF NOT EXISTS frontier (
    seq INTEGER PRIMARY KEY,
    url_id INTEGER NOT NULL,
    node TEXT,
    depth INTEGER NOT NULL,
    priority INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS frontier_pop ON frontier (node, depth, priority DESC, seq);
CREATE TABLE IF NOT EXISTS audio (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL,
    page TEXT NOT NULL,
    status TEXT,
    sha256 TEXT,
    row TEXT NOT NULL,
    UNIQUE (key, page)
);
CREATE INDEX IF NOT EXISTS audio_sha ON audio (sha256);
CREATE TABLE IF NOT EXISTS discards (reason TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS node_stats (node TEXT NOT NULL, key TEXT NOT NULL, n INTEGER NOT NULL,
                                       PRIMARY KEY (node, key));
"""


class StoreError(Exception):
    """The database cannot be used (not ours, newer schema, unreadable)."""


@dataclass(frozen=True, slots=True)
class Finished:
    url: str
    state: str            # "done" | "error" | "retry"
    http_status: int | None
    final_url: str | None
    content_type: str | None
    size: int | None
    error: str | None
    node: str
    at: float


class MasterStore:
    def __init__(self, path: Path, *, max_attempts: int = 3, _readonly: bool = False) -> None:
        self.path = Path(path)
        self.max_attempts = max_attempts
        try:
            if _readonly:
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            else:
                self.db = sqlite3.connect(self.path, check_same_thread=False)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.execute("PRAGMA cache_size=-65536")   # 64 MiB page cache, bounded
                self.db.executescript(_SCHEMA)
            self.db.execute("PRAGMA busy_timeout=5000")
            version = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path} is not a crawl database: {e}") from None
        if version is None and not _readonly:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            self.db.commit()
        elif version is not None and int(version[0]) > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema {version[0]}; this version reads up to {SCHEMA_VERSION}")

    @classmethod
    def open_readonly(cls, path: Path) -> MasterStore:
        return cls(path, _readonly=True)

    def close(self) -> None:
        try:
            self.db.commit()
        except sqlite3.Error:
            pass
        self.db.close()

    def commit(self) -> None:
        self.db.commit()

    # ------------------------------------------------------------------ frontier
    def push(self, rows: Sequence[tuple[str, int, int, str | None, str | None]]) -> int:
        """(url, depth, priority, node, parent); URLs the table already holds are ignored. Returns how many were new."""
        cur = self.db.cursor()
        added = 0
        for url, depth, priority, node, parent in rows:
            cur.execute("INSERT OR IGNORE INTO urls (url, depth, priority, parent, state) VALUES (?, ?, ?, ?, 0)",
                        (url, depth, priority, parent))
            if cur.rowcount:
                cur.execute("INSERT INTO frontier (url_id, node, depth, priority) VALUES (?, ?, ?, ?)",
                            (cur.lastrowid, node, depth, priority))
                added += 1
        return added

    def pop(self, node: str, n: int, now: float) -> list[tuple[str, int, str | None]]:
        """Up to n of node's entries, lowest depth first; they leave the frontier, leased to node."""
        rows = self.db.execute(
            "SELECT f.seq, f.url_id, u.url, u.depth, u.parent FROM frontier f JOIN urls u ON u.id = f.url_id "
            "WHERE f.node = ? ORDER BY f.depth, f.priority DESC, f.seq LIMIT ?", (node, n)).fetchall()
        if not rows:
            return []
        self.db.executemany("DELETE FROM frontier WHERE seq = ?", [(r[0],) for r in rows])
        self.db.executemany("UPDATE urls SET state = 1, node = ? WHERE id = ?", [(node, r[1]) for r in rows])
        return [(r[2], r[3], r[4]) for r in rows]

    def frontier_size(self, node: str | None = None) -> int:
        if node is None:
            return self.db.execute("SELECT COUNT(*) FROM frontier").fetchone()[0]
        return self.db.execute("SELECT COUNT(*) FROM frontier WHERE node = ?", (node,)).fetchone()[0]

    def frontier_empty(self) -> bool:
        return self.db.execute("SELECT 1 FROM frontier LIMIT 1").fetchone() is None

    def reroute(self, nodes: Collection[str | None], route: Route, batch: int = 20_000) -> int:
        """Entries routed to any of `nodes` are routed again with route(urls). Returns how many moved."""
        moved = 0
        for node in nodes:
            last = 0
            while True:
                rows = self.db.execute(
                    "SELECT f.seq, u.url FROM frontier f JOIN urls u ON u.id = f.url_id "
                    "WHERE f.node IS ? AND f.seq > ? ORDER BY f.seq LIMIT ?", (node, last, batch)).fetchall()
                if not rows:
                    break
                last = rows[-1][0]
                targets = route([r[1] for r in rows])
                changes = [(t, r[0]) for r, t in zip(rows, targets) if t != node]
                if changes:
                    self.db.executemany("UPDATE frontier SET node = ? WHERE seq = ?", changes)
                    moved += len(changes)
        return moved

    def _requeue(self, rows: list[tuple[int, str, int, int]], route: Route) -> None:
        """rows: (id, url, depth, priority) already set back to queued."""
        nodes = route([r[1] for r in rows])
        self.db.executemany("INSERT INTO frontier (url_id, node, depth, priority) VALUES (?, ?, ?, ?)",
                            [(r[0], n, r[2], r[3]) for r, n in zip(rows, nodes)])

    def release(self, urls: Sequence[str], route: Route) -> int:
        """Leased URLs go back to the frontier (lease expired, node died)."""
        back: list[tuple[int, str, int, int]] = []
        give_up: list[tuple[str, int]] = []
        limit = self.max_attempts * LOST_LEASE_FACTOR
        for url in urls:
            row = self.db.execute("SELECT id, depth, priority, attempts FROM urls WHERE url = ? AND state = 1",
                                  (url,)).fetchone()
            if row is None:
                continue
            if row[3] + 1 >= limit:
                give_up.append(("lease lost too often (a worker may be dying on it)", row[0]))
            else:
                back.append((row[0], url, row[1], row[2]))
        if back:
            self.db.executemany("UPDATE urls SET state = 0, attempts = attempts + 1, node = NULL WHERE id = ?",
                                [(r[0],) for r in back])
            self._requeue(back, route)
        if give_up:
            self.db.executemany("UPDATE urls SET state = 3, error = ? WHERE id = ?", give_up)
        return len(back)

    def requeue_leased(self, route: Route) -> int:
        """At start-up: whatever was leased when the master stopped goes back to the frontier."""
        rows = self.db.execute("SELECT id, url, depth, priority FROM urls WHERE state = 1").fetchall()
        if rows:
            self.db.executemany("UPDATE urls SET state = 0, node = NULL WHERE id = ?", [(r[0],) for r in rows])
            self._requeue(rows, route)
        return len(rows)

    # ------------------------------------------------------------------ results
    def finish(self, results: Sequence[Finished]) -> list[bool]:
        """Records results; True where the URL was leased (the first result), False for late duplicates."""
        out = []
        for r in results:
            row = self.db.execute("SELECT id, state, attempts, depth, priority FROM urls WHERE url = ?",
                                  (r.url,)).fetchone()
            if row is None or row[1] != LEASED:
                out.append(False)
                continue
            uid, _, attempts, depth, priority = row
            if r.state == "retry" and attempts + 1 < self.max_attempts:
                self.db.execute("UPDATE urls SET state = 0, attempts = ?, error = ?, http_status = ? WHERE id = ?",
                                (attempts + 1, r.error, r.http_status, uid))
                self.db.execute("INSERT INTO frontier (url_id, node, depth, priority) VALUES (?, ?, ?, ?)",
                                (uid, r.node, depth, priority))
            else:
                state = DONE if r.state == "done" else ERROR
                self.db.execute(
                    "UPDATE urls SET state = ?, attempts = ?, node = ?, http_status = ?, final_url = ?, "
                    "content_type = ?, size = ?, error = ?, last_crawl = ? WHERE id = ?",
                    (state, attempts + (r.state != "done"), r.node, r.http_status, r.final_url, r.content_type,
                     r.size, r.error, r.at, uid))
            out.append(True)
        return out

    def known(self, urls: Sequence[str]) -> set[str]:
        found: set[str] = set()
        step = 500
        for i in range(0, len(urls), step):
            chunk = list(urls[i:i + step])
            q = ",".join("?" * len(chunk))
            found.update(r[0] for r in self.db.execute(f"SELECT url FROM urls WHERE url IN ({q})", chunk))
        return found

    # ------------------------------------------------------------------ refresh
    def due_for_refresh(self, now: float, older_than: float, limit: int) -> list[tuple[str, int]]:
        return self.db.execute("SELECT url, depth FROM urls WHERE state = 2 AND last_crawl < ? LIMIT ?",
                               (now - older_than, limit)).fetchall()

    def requeue_refresh(self, rows: Sequence[tuple[str, int]], route: Route) -> int:
        back = []
        for url, _depth in rows:
            row = self.db.execute("SELECT id, url, depth, priority FROM urls WHERE url = ? AND state = 2",
                                  (url,)).fetchone()
            if row is not None:
                back.append(row)
        if back:
            self.db.executemany("UPDATE urls SET state = 0, attempts = 0 WHERE id = ?", [(r[0],) for r in back])
            self._requeue(back, route)
        return len(back)

    # ------------------------------------------------------------------ catalogue
    def add_audio(self, rows: Sequence[dict]) -> list[bool]:
        """Catalogue rows, unique on (source id or url, page). A repeat fills in what the first lacked."""
        out = []
        for row in rows:
            key = f"{row.get('resolver')}:{row['source_id']}" if row.get("source_id") else row["url"]
            cur = self.db.execute("INSERT OR IGNORE INTO audio (key, page, status, sha256, row) VALUES (?, ?, ?, ?, ?)",
                                  (key, row["page"], row.get("status"), row.get("sha256"),
                                   json.dumps(row, ensure_ascii=False, sort_keys=True)))
            if cur.rowcount:
                out.append(True)
                continue
            out.append(False)
            if row.get("sha256"):
                self.db.execute("UPDATE audio SET sha256 = ?, status = ?, row = ? WHERE key = ? AND page = ? "
                                "AND sha256 IS NULL", (row["sha256"], row.get("status"),
                                                       json.dumps(row, ensure_ascii=False, sort_keys=True),
                                                       key, row["page"]))
        return out

    def catalogue(self) -> Iterator[dict]:
        cur = self.db.execute("SELECT row FROM audio ORDER BY id")
        for (row,) in cur:
            yield json.loads(row)

    def audio_by_sha(self, sha256: str) -> list[dict]:
        return [json.loads(r[0]) for r in self.db.execute("SELECT row FROM audio WHERE sha256 = ?", (sha256,))]

    # ------------------------------------------------------------------ statistics
    def count_discards(self, reasons: Mapping[str, int]) -> None:
        if reasons:
            self.db.executemany("INSERT INTO discards VALUES (?, ?) ON CONFLICT (reason) DO UPDATE SET n = n + "
                                "excluded.n", list(reasons.items()))

    def note_node(self, node: str, **counters: int) -> None:
        self.db.executemany("INSERT INTO node_stats VALUES (?, ?, ?) ON CONFLICT (node, key) DO UPDATE SET "
                            "n = n + excluded.n", [(node, k, v) for k, v in counters.items()])

    def status(self) -> dict:
        states = {STATE_NAMES[s]: n for s, n in self.db.execute("SELECT state, COUNT(*) FROM urls GROUP BY state")}
        per_node: dict[str, dict[str, int]] = {}
        for node, state, n in self.db.execute(
                "SELECT node, state, COUNT(*) FROM urls WHERE node IS NOT NULL GROUP BY node, state"):
            per_node.setdefault(node, {})[STATE_NAMES[state]] = n
        for node, key, n in self.db.execute("SELECT node, key, n FROM node_stats"):
            per_node.setdefault(node, {})[key] = n
        frontier_by_node = {str(node): n for node, n in
                            self.db.execute("SELECT node, COUNT(*) FROM frontier GROUP BY node")}
        return {
            "states": {name: states.get(name, 0) for name in STATE_NAMES.values()},
            "frontier": sum(frontier_by_node.values()),
            "frontier_by_node": frontier_by_node,
            "nodes": per_node,
            "discards": dict(self.db.execute("SELECT reason, n FROM discards ORDER BY reason")),
            "audio": dict(self.db.execute("SELECT COALESCE(status, 'unknown'), COUNT(*) FROM audio GROUP BY 1")),
        }

    def url_count(self) -> int:
        # ids only grow and rows are never deleted, so the largest id is the count, in O(1).
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM urls").fetchone()[0]

    def iter_urls(self, batch: int = 100_000) -> Iterator[list[str]]:
        last = 0
        while True:
            rows = self.db.execute("SELECT id, url FROM urls WHERE id > ? ORDER BY id LIMIT ?",
                                   (last, batch)).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield [r[1] for r in rows]

    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        (key, value))
