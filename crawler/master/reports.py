"""Reports on a crawl, read from the master's store (running or stopped): per host, per MIME type, per response
code, and the crawl log (one row per URL). The database groups; Python only merges the groups it returns (one per
stored URL prefix, content type or status code: a few thousand at most, whatever the crawl's size) and names them.

Per host: pages (URLs fetched), audio (catalogue items found on its pages), bytes (pages and stored audio, as the
workers reported them), errors (URLs given up, and pages answered with 4xx/5xx), robots_blocked (URLs its
robots.txt refused: never fetched, counted here only). Per type: pages and audio items with that MIME type and
their bytes. Per code: fetched pages with that HTTP status and their bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from crawler.logs import iso_utc
from crawler.master.store import DONE, ERROR, ROBOTS, ROBOTS_REASON, STATE_NAMES, MasterStore

REPORTS = ("hosts", "types", "codes")
HOST_COLUMNS = ("host", "urls", "pages", "audio", "bytes", "errors", "robots_blocked")
TYPE_COLUMNS = ("type", "pages", "audio", "bytes")
CODE_COLUMNS = ("code", "pages", "bytes")
PAGE_COLUMNS = ("url", "state", "http_status", "depth", "parent", "content_type", "size", "attempts", "node",
                "last_crawl", "next_visit", "reason")
# URLs per query of the crawl log: memory stays bounded however big the crawl.
_PAGE_BATCH = 1000

# A store that has not been opened by this crawler yet keeps robots-refused URLs as errors with this reason:
# counted as refused all the same. (The master moves them to their own state when it opens the store.)
_STATE = f"CASE WHEN u.state = {ERROR} AND p.error = ? THEN {ROBOTS} ELSE u.state END"


@contextmanager
def _snapshot(store: MasterStore) -> Iterator[None]:
    """One commit seen throughout, beside a running master (SQLite WAL reader, PostgreSQL repeatable read)."""
    db = store.db
    own = not db.in_transaction
    if own:
        db.begin_snapshot()
    try:
        yield
    finally:
        if own:
            db.execute("COMMIT")


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else url


def _mime(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def hosts(store: MasterStore) -> list[dict[str, Any]]:
    db = store.db
    out: dict[str, dict[str, Any]] = {}

    def row(host: str) -> dict[str, Any]:
        return out.setdefault(host, {"host": host, **{c: 0 for c in HOST_COLUMNS[1:]}})

    with _snapshot(store):
        by_prefix = db.execute(
            f"SELECT o.origin, count(*), sum(CASE WHEN s = {DONE} THEN 1 ELSE 0 END), "
            f"sum(CASE WHEN s = {ERROR} OR (s = {DONE} AND status >= 400) THEN 1 ELSE 0 END), "
            f"sum(CASE WHEN s = {ROBOTS} THEN 1 ELSE 0 END), coalesce(sum(size), 0) "
            f"FROM (SELECT u.origin AS origin, {_STATE} AS s, p.http_status AS status, p.size AS size "
            "FROM url_state u LEFT JOIN pages p ON p.id = u.id) x JOIN origins o ON o.id = x.origin "
            "GROUP BY o.origin", (ROBOTS_REASON,)).fetchall()
        page_host = f"substr(page, 1, {db.strpos}(substr(page, 9), '/') + 7)"
        audio = db.execute(
            f"SELECT {page_host}, count(*), coalesce(sum(CASE WHEN sha256 IS NOT NULL THEN size ELSE 0 END), 0) "
            f"FROM audio GROUP BY {page_host}").fetchall()
    for prefix, urls, pages, errors, robots, size in by_prefix:
        r = row(_host(prefix))
        r["urls"] += urls
        r["pages"] += pages or 0
        r["errors"] += errors or 0
        r["robots_blocked"] += robots or 0
        r["bytes"] += int(size)
    for page, n, size in audio:
        r = row(_host(page))
        r["audio"] += n
        r["bytes"] += int(size)
    return [out[h] for h in sorted(out)]


def types(store: MasterStore) -> list[dict[str, Any]]:
    db = store.db
    out: dict[str, dict[str, Any]] = {}
    with _snapshot(store):
        pages = db.execute(
            f"SELECT p.content_type, count(*), coalesce(sum(p.size), 0) FROM pages p JOIN url_state u ON u.id = p.id "
            f"WHERE p.last_crawl IS NOT NULL AND {_STATE} != {ROBOTS} GROUP BY p.content_type",
            (ROBOTS_REASON,)).fetchall()
        audio = db.execute(
            "SELECT content_type, count(*), coalesce(sum(CASE WHEN sha256 IS NOT NULL THEN size ELSE 0 END), 0) "
            "FROM audio GROUP BY content_type").fetchall()
    for kind, rows in (("pages", pages), ("audio", audio)):
        for ctype, n, size in rows:
            mime = _mime(ctype)
            r = out.setdefault(mime, {"type": mime, "pages": 0, "audio": 0, "bytes": 0})
            r[kind] += n
            r["bytes"] += int(size)
    return [out[t] for t in sorted(out)]


def codes(store: MasterStore) -> list[dict[str, Any]]:
    with _snapshot(store):
        rows = store.db.execute(
            f"SELECT p.http_status, count(*), coalesce(sum(p.size), 0) FROM pages p JOIN url_state u ON u.id = p.id "
            f"WHERE p.last_crawl IS NOT NULL AND {_STATE} != {ROBOTS} GROUP BY p.http_status",
            (ROBOTS_REASON,)).fetchall()
    # None: no answer at all (a connection error, a timeout), listed last.
    return [{"code": code, "pages": n, "bytes": int(size)}
            for code, n, size in sorted(rows, key=lambda r: (r[0] is None, r[0] or 0))]


REPORT_COLUMNS: dict[str, tuple[str, ...]] = {"hosts": HOST_COLUMNS, "types": TYPE_COLUMNS, "codes": CODE_COLUMNS}
REPORT_ROWS: dict[str, Callable[[MasterStore], list[dict[str, Any]]]] = {"hosts": hosts, "types": types,
                                                                         "codes": codes}


def pages(store: MasterStore) -> Iterator[dict[str, Any]]:
    """The crawl log: every URL the crawl knows, once, in arrival order, with its state, what its last fetch
    said (status, type, size, reason) and when; a page of rows per query."""
    last = 0
    while True:
        rows = store.db.execute(
            f"SELECT u.id, o.origin || u.path, {_STATE}, p.http_status, u.depth, "
            "coalesce(u.parent_url, (SELECT po.origin || pp.path FROM url_state pp JOIN origins po "
            "ON po.id = pp.origin WHERE pp.id = u.parent)), p.content_type, p.size, u.attempts, n.name, "
            "p.last_crawl, p.next_visit, p.error "
            "FROM url_state u JOIN origins o ON o.id = u.origin LEFT JOIN pages p ON p.id = u.id "
            "LEFT JOIN nodes n ON n.id = u.node WHERE u.id > ? ORDER BY u.id LIMIT ?",
            (ROBOTS_REASON, last, _PAGE_BATCH)).fetchall()
        if not rows:
            return
        last = rows[-1][0]
        for (_, url, state, status, depth, parent, ctype, size, attempts, node, crawled, next_visit,
             reason) in rows:
            yield {"url": url, "state": STATE_NAMES.get(state, str(state)), "http_status": status, "depth": depth,
                   "parent": parent, "content_type": ctype, "size": size, "attempts": attempts, "node": node,
                   "last_crawl": iso_utc(crawled), "next_visit": iso_utc(next_visit), "reason": reason}
