"""The frontier of the master store: the URL table as a line of work. URLs are pushed (each once), popped by a
node in crawl order (lowest depth, then highest priority, then oldest), leased until their result comes, requeued
when a lease is lost, rerouted when nodes come and go, and finished as done, failed or refused by robots.txt. A
part of MasterStore (crawler/master/store.py), writing into the transaction it shares with the visits and the
catalogue (crawler/master/store_core.py): a finished page's visit and its listing of catalogue items are recorded
in the same transaction as its result.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import islice
from types import EllipsisType
from typing import Any

from crawler.master.backend import StoreError
from crawler.master.revisit import RevisitPolicy
from crawler.master.store_audio import AudioCatalogue
from crawler.master.store_core import (
    CHUNK,
    DONE,
    ERROR,
    FETCH_COLUMNS,
    LEASED,
    PARENT,
    QUEUED,
    ROBOTS,
    PageOutcome,
    Route,
    StoreCore,
    chunks,
    insert_rows,
    key_from,
    node_key,
    node_of,
    split_url,
    url_rows,
)
from crawler.master.store_visits import Visits

ROBOTS_BLOCKED = "robots"                  # the PageOutcome state of a URL robots.txt refused
# A URL whose lease keeps being lost (its worker dies on it) is given up after max_attempts times this many.
LOST_LEASE_FACTOR = 3
# URLs handed out whose keys the frontier keeps for their results (Frontier._leased_keys): far more than a crawl
# holds in flight, a few tens of MB at most.
LEASED_KEYS = 200_000
# A pushed URL's row (Frontier.push's values, in this order), queued.
_PUSHED = ("id", "origin", "path", "node", "depth", "priority", "seq", "slot", "parent", "parent_url")
_QUEUED = (("state", str(QUEUED)),)

# What the page that linked a URL said about the link, for a link that may lead to audio without saying so (a
# playlist, a stream named like a page): crawler.items.LinkMeta as JSON, handed out with the URL's task so that
# the audio found there is named without fetching that page again. One row per such URL only, written when the URL
# enters the table (the first page to report it names it).
LINK_META_TABLE = """CREATE TABLE link_meta (
    id   {INT} PRIMARY KEY,     -- url_state.id
    meta TEXT NOT NULL
)"""


class Frontier:
    """The URL table's states and the line: every URL is in exactly one place (queued, leased, done, failed,
    refused by robots.txt), by construction."""

    def __init__(self, core: StoreCore, visits: Visits, audio: AudioCatalogue, *, max_attempts: int) -> None:
        self.core = core
        self.visits = visits
        self.audio = audio
        self.max_attempts = max_attempts
        # url -> key of the URLs the last finish() found: the pages whose links come next (Crawl.complete pushes
        # them right after), so push() takes their parents' keys from here instead of looking them up again. A
        # URL's key never changes and its row is never deleted, so an entry is never wrong; bounded by a report.
        self._finished_keys: dict[str, int] = {}
        # url -> key of the URLs pop() handed out, until finish() takes their results: finish() reads their rows by
        # key instead of finding them by their text (a probe of the URL index and the origin joined per URL). The
        # same reasoning: an entry is never wrong, only missing; bounded (LEASED_KEYS, oldest dropped first) for
        # leases that end otherwise (expired, released, lost with their node).
        self._leased_keys: dict[str, int] = {}

    def known(self, urls: Sequence[str]) -> set[str]:
        """Which of these URLs the URL table holds, whatever their state (exact, not probabilistic)."""
        return set(self.core.lookup(urls, "url"))

    def push(self, rows: Sequence[tuple[str, int, int, str | None, str | None]], *, unseen: bool = False,
             link_meta: Mapping[str, str] | None = None) -> int:
        """Queue (url, depth, priority, node, parent) rows; URLs the table already holds are ignored.

        link_meta: url -> what its linking page said about it (JSON, see LINK_META_TABLE), kept for the new URLs.

        unseen: the caller vouches that the table holds none of these URLs, so they are not looked up. The master
        pushes only what its Bloom filter had never seen (a Bloom filter has no false negatives, and it holds every
        URL of the table), or what the table itself just said it lacks; looking them up again would cost a probe
        of every table of the URL index per URL, on the path every new URL takes.

        Returns how many were new.
        """
        self.core.begin()
        fresh: dict[str, tuple[str, int, int, str | None, str | None]] = {}
        for row in rows:
            fresh.setdefault(row[0], row)
        if not unseen:
            for url in self.core.lookup(fresh, "url"):
                del fresh[url]
        if not fresh:
            return 0
        known = self._finished_keys
        parent_keys = {p: known[p] for *_, p in fresh.values() if p is not None and p in known}
        parents = {p for *_, p in fresh.values() if p is not None and p not in parent_keys}
        if parents:
            parent_keys.update((u, r[1]) for u, r in self.core.lookup(parents, "url, id").items())
        parts = [split_url(u) for u in fresh]
        origin_of = self.core.origin_ids(origin for origin, _ in parts)
        slot_of = self.core.slot_of
        node_id = self.core.node_id
        inserts = []
        per_node: dict[str | None, int] = {}
        key = self.core.take_ids(list(fresh))
        seq = self.core.take_seqs(len(fresh))      # in push order, as one take_seq() a row would give them
        for (url, depth, priority, node, parent), (origin, rest) in zip(fresh.values(), parts):
            slot = slot_of(url) if slot_of is not None else None
            pkey = parent_keys.get(parent) if parent is not None else None
            inserts.append((key, origin_of[origin], rest, node_id(node), depth, priority, seq, slot, pkey,
                            parent if pkey is None else None))
            key += 1
            seq += 1
            per_node[node] = per_node.get(node, 0) + 1
        for node, n in per_node.items():
            self.core.move(None, None, QUEUED, node, n)
        # Usually every parent's key is known (its text is kept only when not): no parent_url is bound.
        insert_rows(self.core.db, "url_state", _PUSHED, inserts, constants=_QUEUED)
        if link_meta:
            named = [(row[0], link_meta[url]) for url, row in zip(fresh, inserts) if url in link_meta]
            if named:
                self.core.db.executemany("INSERT INTO link_meta(id, meta) VALUES (?, ?) ON CONFLICT(id) DO NOTHING",
                                         named)
        return len(inserts)

    def pop(self, node: str | None, n: int, now: float, max_depth: int | None = None, *,
            validators: bool = False, link_meta: bool = False) -> list[tuple[Any, ...]]:
        """Lease up to n of this node's frontier entries: lowest depth, then highest priority, then oldest;
        with max_depth, none deeper (the crawl's level barrier).

        Returns (url, depth, parent) rows; with validators, (url, depth, parent, (etag, last_modified) or None),
        the validators of the page's last full answer for a conditional fetch; with link_meta, each row ends with
        what the linking page said about the URL (its JSON, or None).
        """
        self.core.begin()
        node_id = self.core.node_ids.get(node) if node is not None else None
        if node is not None and node_id is None:
            return []
        where = "node IS NULL" if node is None else "node = ?"
        args: tuple[Any, ...] = () if node is None else (node_id,)
        if max_depth is not None:
            where += " AND depth <= ?"
            args += (max_depth,)
        args += (n,)
        cols, join = f"u.id, o.origin || u.path, u.depth, {PARENT}", ""
        if validators:
            cols, join = cols + ", v.etag, v.last_modified", " LEFT JOIN page_visits v ON v.id = u.id"
        if link_meta:
            cols, join = cols + ", lm.meta", join + " LEFT JOIN link_meta lm ON lm.id = u.id"
        rows = self.core.db.execute(
            f"SELECT {cols} FROM "
            f"(SELECT id, depth AS d, priority AS p, seq AS s FROM url_state WHERE state = {QUEUED} AND {where} "
            f"ORDER BY depth, priority DESC, seq LIMIT ?) f "
            f"JOIN url_state u ON u.id = f.id JOIN origins o ON o.id = u.origin{join} ORDER BY f.d, f.p DESC, f.s",
            args).fetchall()
        if not rows:
            return []
        # One statement for the batch, its keys as one list parameter: an update a row cost 2.1 us, this 1.3.
        db = self.core.db
        for chunk in chunks([r[0] for r in rows]):
            db.execute(f"UPDATE url_state SET state = {LEASED} WHERE {db.in_list('id')}", (db.list_arg(chunk),))
        self.core.move(QUEUED, node, LEASED, node, len(rows))
        leased = self._leased_keys
        for r in rows:
            leased[r[1]] = r[0]
        if len(leased) > LEASED_KEYS:
            # The oldest, in one pass: next(iter()) per entry would walk the deleted slots at the dict's front
            # again for each one (about 2 ms a pop once full, against 0.08).
            for url in list(islice(leased, len(leased) - LEASED_KEYS)):
                del leased[url]
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

    def lowest_queued_depth(self, skip: Collection[str] = ()) -> int | None:
        """The smallest depth in the frontier, over every node but those in skip (None: the frontier is empty).
        One index seek a node (frontier_pop leads with node, depth); asked only when a level of the crawl may be
        done."""
        self.core.begin()
        nodes = [n for (state, n), c in self.core.current_counts().items()
                 if state == QUEUED and c > 0 and n not in skip]
        best: int | None = None
        for key in nodes:
            node = node_of(key)
            if node is None:
                row = self.core.db.execute(
                    f"SELECT min(depth) FROM url_state WHERE state = {QUEUED} AND node IS NULL").fetchone()
            elif node in self.core.node_ids:
                row = self.core.db.execute(f"SELECT min(depth) FROM url_state WHERE state = {QUEUED} AND node = ?",
                                           (self.core.node_ids[node],)).fetchone()
            else:
                continue
            if row[0] is not None and (best is None or row[0] < best):
                best = row[0]
        return best

    def frontier_size(self, node: str | None | EllipsisType = ...) -> int:
        """Queued URLs: all of them, or those routed to one node (None: not routed to any)."""
        counts = self.core.current_counts()
        if node is ...:
            return sum(c for (s, _), c in counts.items() if s == QUEUED)
        return counts.get((QUEUED, node_key(node)), 0)

    def frontier_empty(self) -> bool:
        return self.frontier_size() == 0

    def reroute(self, nodes: Collection[str | None], route: Route) -> int:
        """Route again the frontier entries of these nodes (the live set changed). Returns how many moved."""
        ids = [self.core.node_ids[n] for n in nodes if n is not None and n in self.core.node_ids]
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
        nodes = [node_of(node) for (state, node), n in self.core.current_counts().items()
                 if state == QUEUED and n and node]
        moved = self.reroute(nodes, lambda urls: [None] * len(urls)) if nodes else 0
        self.core.begin()
        self.core.db.execute(f"UPDATE url_state SET slot = NULL WHERE state = {QUEUED}")
        return moved

    def reroute_slots(self, slots: Collection[int], route: Route) -> int:
        """Route again the frontier entries whose URL hashes to one of these slots of the node table.

        Needs the store opened with slot_of. Entries pushed without a slot are included: they may be anywhere.
        """
        if self.core.slot_of is None:
            raise StoreError("reroute_slots needs the store opened with slot_of")
        wanted = sorted({int(s) for s in slots})
        if not wanted:
            return 0
        cond = f"slot IN ({','.join(map(str, wanted))}) OR slot IS NULL"
        return self._reroute_where(cond, [], route)

    def _reroute_where(self, cond: str, args: Sequence[Any], route: Route) -> int:
        self.core.begin()
        # Park the entries first (node = -1 - old node id, so every parked value is negative), then drain the
        # parked entries in chunks: an entry that routes back to its own node is not met again, and memory stays
        # bounded however big the frontier is. The parked values never outlive this call, so no commit sees them.
        self.core.db.execute(
            f"UPDATE url_state SET node = -1 - coalesce(node, 0) WHERE state = {QUEUED} AND ({cond})", args)
        moved = 0
        while True:
            rows = self.core.db.execute(
                f"SELECT u.id, o.origin || u.path, u.node FROM url_state u JOIN origins o ON o.id = u.origin "
                f"WHERE u.state = {QUEUED} AND u.node < 0 LIMIT ?", (CHUNK,)).fetchall()
            if not rows:
                return moved
            targets = route([r[1] for r in rows])
            self.core.db.executemany("UPDATE url_state SET node = ? WHERE id = ?",
                                     [(self.core.node_id(t), r[0]) for r, t in zip(rows, targets, strict=True)])
            for (_, _, parked), target in zip(rows, targets):
                old_id = -1 - parked
                old = self.core.node_names[old_id] if old_id else None
                if target != old:
                    self.core.move(QUEUED, old, QUEUED, target)
                    moved += 1

    def release(self, urls: Sequence[str], route: Route) -> int:
        """Leased URLs back to the frontier (lease expired, node died), counting an attempt; depth,
        priority, parent and place in line are kept. A URL whose lease was lost max_attempts *
        LOST_LEASE_FACTOR times becomes an error instead: a page that kills its worker must not kill them all.
        Returns how many went back to the frontier."""
        self.core.begin()
        rows = [r for r in self.core.lookup(urls, "url, id, node, state, attempts").values() if r[3] == LEASED]
        limit = self.max_attempts * LOST_LEASE_FACTOR
        doomed = [r for r in rows if r[4] + 1 >= limit]
        if doomed:
            self.core.db.executemany(f"UPDATE url_state SET state = {ERROR}, attempts = attempts + 1 WHERE id = ?",
                                     [(r[1],) for r in doomed])
            self.core.write_pages(("error",), [(r[1], "lease lost too often (a worker may be dying on it)")
                                               for r in doomed])
            for r in doomed:
                self.core.move(LEASED, r[2], ERROR, r[2])
        return self._requeue_rows([r for r in rows if r[4] + 1 < limit], route, attempt=True)

    def unlease(self, urls: Sequence[str], route: Route) -> int:
        """Leased URLs that were never sent to a node back in line without counting an attempt (the node that
        popped them is not the one the double hash names any more). Returns how many went back."""
        self.core.begin()
        rows = [r for r in self.core.lookup(urls, "url, id, node, state").values() if r[3] == LEASED]
        return self._requeue_rows(rows, route, attempt=False)

    def requeue_leased(self, route: Route) -> int:
        """At start-up: every URL still leased (its result died with the old master) goes back in line."""
        self.core.begin()
        total = 0
        while True:
            rows = self.core.db.execute(
                f"SELECT url, id, node, state FROM urls WHERE id IN "
                f"(SELECT id FROM url_state WHERE state = {LEASED} LIMIT ?)", (CHUNK,)).fetchall()
            if not rows:
                return total
            total += self._requeue_rows(rows, route, attempt=False)

    def _requeue_rows(self, rows: Sequence[tuple[Any, ...]], route: Route, *, attempt: bool) -> int:
        if not rows:
            return 0
        targets = route([r[0] for r in rows])
        bump = 1 if attempt else 0
        self.core.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, attempts = attempts + {bump} "
            f"WHERE id = ?", [(self.core.node_id(t), r[1]) for r, t in zip(rows, targets, strict=True)])
        for r, t in zip(rows, targets):
            self.core.move(LEASED, r[2], QUEUED, t)
        return len(rows)

    def finish(self, results: Sequence[PageOutcome], revisit: RevisitPolicy | None = None) -> list[bool]:
        """Record the nodes' results. True where the result was taken: the URL was leased (or back in line
        after its lease was given up); False for a repeat or late result of a URL already settled, or of
        a URL the store does not know. "retry" requeues on the same node until max_attempts, then "error";
        "throttled" (the site said 429/503) requeues on the same node without counting an attempt.

        With a revisit policy (refresh on), a done page also gets its next visit and its page_visits row, and
        a visit of a page seen before updates the catalogue: see Visits.visited(). Whatever the policy, a done
        result records which catalogue items its URL lists (audio_keys; their rows must exist: add_audio first).
        """
        self.core.begin()
        current = self._current([r.url for r in results], pages=revisit is not None)
        visits: list[tuple[PageOutcome, int, int | None, float | None]] = []
        listings: dict[int, tuple[frozenset[tuple[str, str]], bool]] = {}
        self._finished_keys = {u: row[0] for u, row in current.items()}
        out: list[bool] = []
        fetched: list[tuple[Any, ...]] = []
        moved: list[tuple[Any, ...]] = []      # (state, node id, attempts, seq or None, key) in result order
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
            # A URL back in line takes a new place in it (seq); any other keeps its own.
            moved.append((new_state, self.core.node_id(new_node), attempts,
                          self.core.take_seq() if new_state == QUEUED else None, row_id))
            fetched.append((row_id, res.at, res.http_status, res.final_url, res.content_type, res.size, res.error))
            self.core.move(state, node, new_state, new_node)
            row[1], row[2], row[3] = new_state, new_node, attempts
            out.append(True)
        # One statement for the report, in result order (a URL twice in it ends as its last result says). When
        # no URL goes back in line (the usual), no place in line is bound (store_core.null_columns).
        # And when they all end alike (done at one node, the usual) and no URL is twice in the report, their keys go
        # as one list parameter: 1.3 us a row against 1.7.
        db = self.core.db
        if any(m[3] is not None for m in moved):
            db.executemany("UPDATE url_state SET state = ?, node = ?, attempts = ?, seq = coalesce(?, seq) "
                           "WHERE id = ?", moved)
        elif len({m[:3] for m in moved}) == 1 and len({m[4] for m in moved}) == len(moved):
            for chunk in chunks([m[4] for m in moved]):
                db.execute(f"UPDATE url_state SET state = ?, node = ?, attempts = ? WHERE {db.in_list('id')}",
                           (*moved[0][:3], db.list_arg(chunk)))
        else:
            db.executemany("UPDATE url_state SET state = ?, node = ?, attempts = ? WHERE id = ?",
                           [(m[0], m[1], m[2], m[4]) for m in moved])
        self.core.write_pages(FETCH_COLUMNS, fetched)
        if visits:
            assert revisit is not None
            self.visits.visited(visits, revisit)
        elif listings:
            self.audio.follow_refs(listings, (), results[0].at)
        return out

    def _current(self, urls: Sequence[str], pages: bool = True) -> dict[str, list[Any]]:
        """url -> [key, state, node, attempts, http_status, last_crawl] of these URLs, those the table holds: by
        key for the URLs pop() handed out (_leased_keys, each entry taken), by text for the others. Without
        `pages` (only a revisit reads them), http_status and last_crawl of the URLs found by key are None: their
        pages rows are not looked up."""
        leased = self._leased_keys
        by_key: dict[int, str] = {}
        rest = []
        for u in urls:
            key = leased.pop(u, None)
            if key is None:
                rest.append(u)
            else:
                by_key[key] = u
        rows: dict[str, list[Any]] = {}
        db = self.core.db
        if by_key:
            # The node's name from memory (node_names holds every node the table names), not joined.
            names = self.core.node_names
            sql = (f"SELECT u.id, u.state, u.node, u.attempts, p.http_status, p.last_crawl FROM url_state u "
                   f"LEFT JOIN pages p ON p.id = u.id WHERE {db.in_list('u.id')}" if pages else
                   f"SELECT u.id, u.state, u.node, u.attempts, NULL, NULL FROM url_state u WHERE {db.in_list('u.id')}")
            for chunk in chunks(list(by_key)):
                for i, st, node, att, status, last in db.execute(sql, (db.list_arg(chunk),)):
                    rows[by_key[i]] = [i, st, names.get(node), att, status, last]
        if rest:
            for u, i, st, node, att, status, last in self.core.lookup(
                    rest, "url, id, state, node, attempts, http_status, last_crawl").values():
                rows[u] = [i, st, node, att, status, last]
        return rows

    def retry_errors(self, route: Route, contains: str | None = None, after: int | None = None,
                     limit: int = CHUNK) -> tuple[int, int | None]:
        """Failed URLs (state error) back in line with their attempts reset, optionally only those whose error
        contains `contains`. Works through the table in key order, `limit` rows a call: returns how many went
        back and the key to continue after, or None when the table is done."""
        self.core.begin()
        op, start = key_from(after)
        cond, args = "", (start,)   # type: tuple[str, tuple[Any, ...]]
        if contains:
            cond, args = (f" AND id IN (SELECT id FROM pages WHERE id {op} ? AND {self.core.db.strpos}(error, ?) > 0)",
                          (start, start, contains))
        rows = self.core.db.execute(
            f"SELECT url, id, node FROM urls WHERE id IN (SELECT id FROM url_state WHERE id {op} ? "
            f"AND state = {ERROR}{cond} ORDER BY id LIMIT ?) ORDER BY id", (*args, limit)).fetchall()
        if not rows:
            return 0, None
        targets = route([r[0] for r in rows])
        self.core.db.executemany(
            f"UPDATE url_state SET state = {QUEUED}, node = ?, attempts = 0, seq = ? WHERE id = ?",
            [(self.core.node_id(t), self.core.take_seq(), r[1]) for r, t in zip(rows, targets, strict=True)])
        self.core.db.executemany("UPDATE pages SET error = NULL WHERE id = ?", [(r[1],) for r in rows])
        for r, t in zip(rows, targets):
            self.core.move(ERROR, r[2], QUEUED, t)
        return len(rows), rows[-1][1]

    def failed(self) -> Iterator[dict[str, Any]]:
        """The URLs given up as errors, with why, in key order (streams, a page of rows at a time)."""
        cols = ("url", "error", "http_status", "attempts", "node", "last_crawl", "depth", "parent")
        last = None
        while True:
            op, start = key_from(last)
            rows = self.core.db.execute(
                f"SELECT {', '.join(cols)}, id FROM urls WHERE id IN (SELECT id FROM url_state WHERE id {op} ? "
                f"AND state = {ERROR} ORDER BY id LIMIT 1000) ORDER BY id", (start,)).fetchall()
            if not rows:
                return
            last = rows[-1][-1]
            for row in rows:
                yield dict(zip(cols, row))

    def lower_depths(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
        """Known URLs found on a shorter path: (url, depth) rows whose recorded depth is larger get this one.
        Returns (url, old depth, new depth) of the done pages lowered, which the crawl may fetch again."""
        self.core.begin()
        want: dict[str, int] = {}
        for u, d in pairs:
            want[u] = min(d, want.get(u, d))
        rows = [r for r in self.core.lookup(want, "url, id, depth, state").values() if want[r[0]] < r[2]]
        if not rows:
            return []
        self.core.db.executemany("UPDATE url_state SET depth = ? WHERE id = ?", [(want[r[0]], r[1]) for r in rows])
        return [(r[0], r[2], want[r[0]]) for r in rows if r[3] == DONE]

    def url_count(self) -> int:
        return sum(self.core.current_counts().values())

    def iter_urls(self, batch: int = 100_000) -> Iterator[list[str]]:
        """Every URL, in batches, to rebuild the Bloom filter."""
        for rows in url_rows(self.core.db, None, batch):
            yield [u for _, u in rows]
