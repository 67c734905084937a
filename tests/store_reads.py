"""Reads of the master store that only tests make: one URL's row, one page's revisit record, the pages a
refresh by age would take, an address's history, the places one content was found. The master itself never asks
these questions (it reads in bulk through MasterStore's API), so they live here, beside the tests, reading the
tables the store documents."""

from __future__ import annotations

from typing import Any

from crawler.master.store import DONE, STATE_NAMES, MasterStore

_URL_COLUMNS = ("url", "depth", "priority", "state", "node", "parent", "attempts", "last_crawl", "http_status",
                "final_url", "content_type", "size", "error", "lastmod")


def url_info(store: MasterStore, url: str) -> dict[str, Any] | None:
    """Everything the table holds about one URL (the urls view's columns, the state by name)."""
    row = store.core.lookup([url], ", ".join(_URL_COLUMNS)).get(url)
    if row is None:
        return None
    d = dict(zip(_URL_COLUMNS, row))
    d["state"] = STATE_NAMES[d["state"]]
    return d


def page_visit(store: MasterStore, url: str) -> dict[str, Any] | None:
    """The revisit record of one fetched page."""
    found = store.core.lookup([url], "url, id").get(url)
    if found is None:
        return None
    cols = ("next_visit", "etag", "last_modified", "digest", "interval", "hub", "changed_at", "gone_at")
    row = store.db.execute(
        "SELECT p.next_visit, v.etag, v.last_modified, v.digest, v.interval, v.hub, v.changed_at, v.gone_at "
        "FROM page_visits v LEFT JOIN pages p ON p.id = v.id WHERE v.id = ?", (found[1],)).fetchone()
    return None if row is None else dict(zip(cols, row))


def due_for_refresh(store: MasterStore, now: float, older_than: float, limit: int) -> list[tuple[str, int]]:
    """Done pages last crawled before now - older_than, oldest first: (url, depth)."""
    return [tuple(r) for r in store.db.execute(
        f"SELECT o.origin || u.path, u.depth FROM pages p JOIN url_state u ON u.id = p.id "
        f"JOIN origins o ON o.id = u.origin WHERE p.last_crawl < ? AND u.state = {DONE} "
        f"ORDER BY p.last_crawl LIMIT ?", (now - older_than, limit))]


def audio_history(store: MasterStore, audio_url: str) -> list[dict[str, Any]]:
    """The bytes an address served before they changed, oldest first."""
    cols = ("page", "sha256", "size", "path", "replaced_at")
    rows = store.db.execute(
        "SELECT a.page, h.sha256, h.size, h.path, h.replaced_at FROM audio_history h "
        "JOIN audio a ON a.id = h.audio_id WHERE a.url = ? ORDER BY h.id", (audio_url,)).fetchall()
    return [dict(zip(cols, row)) for row in rows]


def audio_by_sha(store: MasterStore, sha256: str) -> list[dict[str, Any]]:
    """Every place one content was found."""
    return [row for row in store.catalogue() if row.get("sha256") == sha256]

