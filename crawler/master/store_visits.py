"""Page visits and revisits in the master store: what each visit of a fetched page said (``page_visits``: its
validators, a digest of its body, the wait before the next visit, when it changed or went), when it is due again
(``pages.next_visit``, through a partial index), and the sitemaps' dates. A part of MasterStore
(crawler/master/store.py), writing into the transaction it shares with the frontier and the catalogue
(crawler/master/store_core.py); the revisit policy itself is crawler/master/revisit.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from crawler.master.revisit import RevisitPolicy
from crawler.master.revisit import changed as page_changed
from crawler.master.revisit import gone as page_gone
from crawler.master.store_audio import AudioCatalogue
from crawler.master.store_core import CHUNK, DONE, QUEUED, PageOutcome, Route, StoreCore, chunks


class Visits:
    """Revisits: the next visit of each fetched page, found through its index, and the record of its last one."""

    def __init__(self, core: StoreCore, audio: AudioCatalogue) -> None:
        self.core = core
        self.audio = audio

    def visited(self, visits: Sequence[tuple[PageOutcome, int, int | None, float | None]],
                 policy: RevisitPolicy) -> None:
        """Done pages (result, url id, last HTTP status, last crawl): their next visit and page_visits row; the
        catalogue follows what each URL lists (AudioCatalogue.follow_refs): a 304 confirms its items, a gone page
        lists none, a full answer lists what it reported (all of it, unless its resolver failed: then it only
        adds)."""
        prev: dict[int, tuple[Any, ...]] = {}
        ids = [v[1] for v in visits]
        for chunk in chunks(ids):
            for row in self.core.db.execute(
                    "SELECT id, etag, last_modified, digest, interval, hub, changed_at, gone_at FROM page_visits "
                    f"WHERE {self.core.db.in_list('id')}", (self.core.db.list_arg(chunk),)):
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
        self.core.db.executemany(
            f"INSERT INTO page_visits(id, {', '.join(cols)}) VALUES (?{', ?' * len(cols)}) ON CONFLICT(id) DO UPDATE "
            f"SET " + ", ".join(f"{c} = excluded.{c}" for c in cols), upserts)
        self.core.write_pages(("next_visit",), next_visits)
        if listed or confirmed:
            self.audio.follow_refs(listed, confirmed, visits[0][0].at)

    def note_lastmod(self, pairs: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
        """Record when pages last changed, as their site's sitemap says. Returns (url, depth) of the done
        pages that changed after their last crawl: what a refreshing crawl should fetch again now.

        Only URLs the table holds are touched: a link the URL policy discarded has no row."""
        self.core.begin()
        latest: dict[str, float] = {}
        for u, t in pairs:
            latest[u] = max(t, latest.get(u, t))
        rows = self.core.lookup(latest, "url, depth, state, last_crawl, id")
        changed = [(u, depth) for u, depth, state, last_crawl, _ in rows.values()
                   if state == DONE and last_crawl is not None and latest[u] > last_crawl]
        self.core.write_pages(("lastmod",), [(r[4], latest[u]) for u, r in rows.items()])
        return changed

    def requeue_refresh(self, rows: Sequence[tuple[str, int]], route: Route) -> int:
        """Put done pages back at the end of the line for a fresh crawl (past the Bloom filter)."""
        self.core.begin()
        depth_of = dict(rows)
        found = [r for r in self.core.lookup(depth_of, "url, id, node, state").values() if r[3] == DONE]
        if not found:
            return 0
        targets = route([r[0] for r in found])
        self.core.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, depth = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(self.core.node_id(t), depth_of[r[0]], self.core.take_seq(), r[1]) for r, t in zip(found, targets, strict=True)])
        self.core.db.executemany("UPDATE pages SET next_visit = NULL WHERE id = ?", [(r[1],) for r in found])
        for r, t in zip(found, targets):
            self.core.move(DONE, r[2], QUEUED, t)
        return len(found)

    def requeue_due(self, now: float, route: Route, limit: int = CHUNK) -> list[float]:
        """Done pages whose next visit is due (next_visit <= now), most overdue first, back in line for a fresh
        crawl (past the Bloom filter), at most `limit` a call, through the next-visit index. Returns how late
        each one is (now - next_visit): the caller calls again while a full batch came back."""
        self.core.begin()
        rows = self.core.db.execute(
            f"SELECT v.id, v.url, v.node, f.next_visit FROM (SELECT p.id, p.next_visit FROM pages p "
            f"JOIN url_state u ON u.id = p.id WHERE p.next_visit <= ? AND u.state = {DONE} "
            f"ORDER BY p.next_visit LIMIT ?) f JOIN urls v ON v.id = f.id ORDER BY f.next_visit",
            (now, limit)).fetchall()
        if not rows:
            return []
        targets = route([r[1] for r in rows])
        self.core.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, seq = ?, attempts = 0 WHERE id = ?",
            [(self.core.node_id(t), self.core.take_seq(), r[0]) for r, t in zip(rows, targets, strict=True)])
        # Out of the next-visit index until the visit is done and sets the next one.
        self.core.db.executemany("UPDATE pages SET next_visit = NULL WHERE id = ?", [(r[0],) for r in rows])
        for r, t in zip(rows, targets):
            self.core.move(DONE, r[2], QUEUED, t)
        return [now - r[3] for r in rows]

    def schedule_unscheduled(self, refresh: bool) -> int:
        """Call at start with whether refresh is on. Once it is switched on, done pages with no next visit
        (fetched while it was off) are due from their last crawl on: one pass over the table, only the first
        time after a run without refresh."""
        self.core.begin()
        scheduled = bool(self.core.get_meta("revisits_scheduled", False))
        if refresh == scheduled:
            return 0
        self.core.write_meta("revisits_scheduled", refresh)
        if not refresh:
            return 0
        return int(self.core.db.execute(
            f"UPDATE pages SET next_visit = coalesce(last_crawl, 0) WHERE next_visit IS NULL "
            f"AND id IN (SELECT id FROM url_state WHERE state = {DONE})").rowcount)
