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

**Three parts and a facade.** ``MasterStore`` is the API the daemons use; it delegates to three parts that share
one backend and one open transaction (crawler/master/store_core.py): the frontier (store_frontier.py: the URL table
as a line of work), the page visits and revisits (store_visits.py), and the audio catalogue (store_audio.py). The
layout (the tables, the checks at opening, the changes brought in place, upgrade-store) is crawler/master/migrations.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import EllipsisType
from typing import Any, Self

from crawler.master.backend import (
    Backend,
    ReadOnlyStoreError,
    StoreBusy,
    StoreError,
    StoreValueError,
    is_postgres,
)
from crawler.master.limits import LIMIT_META
from crawler.master.migrations import (
    ROBOTS_REASON,
    SCHEMA_VERSION,
    NothingToUpgrade,
    open_store,
    upgrade_layout,
    upgrade_postgres,
)
from crawler.master.revisit import RevisitPolicy
from crawler.master.store_audio import AUDIO_COLUMNS, AUDIO_TIMES, CHANGE_KINDS, RECORDING_COLUMNS, is_live, listed_keys
from crawler.master.store_core import (
    CHUNK,
    DONE,
    ERROR,
    LEASED,
    QUEUED,
    ROBOTS,
    STATE_NAMES,
    PageOutcome,
    Route,
    StoreCore,
    StoreInUse,
    node_of,
    split_url,
)
from crawler.master.store_frontier import LOST_LEASE_FACTOR, ROBOTS_BLOCKED, Frontier
from crawler.master.store_identify import MATCH_COLUMNS, Checked, Identification, Reference
from crawler.master.store_visits import Visits
from crawler.master.urlindex import url_hash

__all__ = [
    "AUDIO_COLUMNS",
    "AUDIO_TIMES",
    "DONE",
    "ERROR",
    "LEASED",
    "LOST_LEASE_FACTOR",
    "MATCH_COLUMNS",
    "QUEUED",
    "RECORDING_COLUMNS",
    "ROBOTS",
    "ROBOTS_BLOCKED",
    "ROBOTS_REASON",
    "Checked",
    "Reference",
    "SCHEMA_VERSION",
    "STATE_NAMES",
    "MasterStore",
    "NothingToUpgrade",
    "PageOutcome",
    "ReadOnlyStoreError",
    "StoreBusy",
    "StoreError",
    "StoreInUse",
    "StoreValueError",
    "is_live",
    "listed_keys",
    "split_url",
    "upgrade_layout",
    "upgrade_postgres",
    "url_hash",
]


# The matches status() shows, newest first.
LATEST_MATCHES = 10


class _NodeFigures:
    """The node_stats added in the open transaction, kept in memory and written with the commit (a part of the
    transaction, store_core.Part): a report added four rows with an upsert statement of its own, 1 us a page.
    Sums, so the rows the commit writes are what the statements a report would have made."""

    def __init__(self, core: StoreCore) -> None:
        self.core = core
        self.pending: dict[tuple[str, str], int] = {}
        if not core.readonly:
            core.parts.append(self)

    def add(self, node: str, counters: Mapping[str, int]) -> None:
        pending = self.pending
        for name, value in counters.items():
            key = (node, name)
            pending[key] = pending.get(key, 0) + value

    def stage(self) -> None:
        if self.pending:
            self.core.db.executemany(
                "INSERT INTO node_stats(node, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT(node, name) DO UPDATE SET value = node_stats.value + excluded.value",
                [(node, name, value) for (node, name), value in self.pending.items()])
            self.pending = {}

    def save(self) -> object:
        return dict(self.pending)

    def restore(self, saved: object) -> None:
        self.pending = dict(saved)  # type: ignore[call-overload]


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
        self.readonly = _readonly
        self.core, self.audio = open_store(self.location, readonly=_readonly, slot_of=slot_of, cache_mb=cache_mb,
                                           checkpoint_pages=checkpoint_pages)
        self.visits = Visits(self.core, self.audio)
        self.frontier = Frontier(self.core, self.visits, self.audio, max_attempts=max_attempts)
        self.identify = Identification(self.core)
        self._node_figures = _NodeFigures(self.core)

    @classmethod
    def open_readonly(cls, location: Path | str) -> MasterStore:
        """A reader for the status/export commands; works beside a running master and after it stopped."""
        return cls(location, _readonly=True)

    @property
    def backend(self) -> str:
        """"sqlite" or "postgresql"."""
        return self.core.db.name

    @property
    def db(self) -> Backend:
        """The open connection, for the reports' SQL (crawler/master/reports.py) and ad hoc reads."""
        return self.core.db

    # -- the transaction (store_core.py) --------------------------------------------------------------

    def commit(self) -> None:
        """End the open transaction: everything written since the last commit becomes durable at once."""
        self.core.commit()

    def prepare_commit(self) -> bool:
        """commit()'s first half, on the store's own thread: the counters the store keeps in memory are written
        into the open transaction. True when there is a transaction for end_transaction() to end."""
        return self.core.prepare_commit()

    def end_transaction(self) -> None:
        """commit()'s second half: COMMIT, the part that waits on the disk (on SQLite the WAL is written, and
        every few thousand pages checkpointed into the database file, with fsyncs), then the URL index's upkeep
        (now and then an fsync). It changes no state the loop reads, so it may run on another thread, provided
        nothing uses the store until it returns (the master lends the store to its commit thread for that time:
        crawler/master/storegate.py)."""
        self.core.end_transaction()

    def atomic(self) -> contextlib.AbstractContextManager[None]:
        """A unit inside the open transaction (one report): if it raises, everything it wrote is undone, the
        counters with it, and the rest of the transaction stays."""
        return self.core.atomic()

    def close(self) -> None:
        """Commit what is open and close; a stopped master leaves nothing half-written."""
        self.core.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def limit_time(self, seconds: float) -> None:
        """Queries from now on are cut off after `seconds` with a StoreError."""
        self.core.limit_time(seconds)

    # -- the frontier (store_frontier.py) --------------------------------------------------------------

    def known(self, urls: Sequence[str]) -> set[str]:
        return self.frontier.known(urls)

    def push(self, rows: Sequence[tuple[str, int, int, str | None, str | None]], *, unseen: bool = False,
             link_meta: Mapping[str, str] | None = None) -> int:
        return self.frontier.push(rows, unseen=unseen, link_meta=link_meta)

    def pop(self, node: str | None, n: int, now: float, max_depth: int | None = None, *,
            validators: bool = False, link_meta: bool = False) -> list[tuple[Any, ...]]:
        return self.frontier.pop(node, n, now, max_depth, validators=validators, link_meta=link_meta)

    def lowest_queued_depth(self, skip: Collection[str] = ()) -> int | None:
        return self.frontier.lowest_queued_depth(skip)

    def frontier_size(self, node: str | None | EllipsisType = ...) -> int:
        return self.frontier.frontier_size(node)

    def frontier_empty(self) -> bool:
        return self.frontier.frontier_empty()

    def reroute(self, nodes: Collection[str | None], route: Route) -> int:
        return self.frontier.reroute(nodes, route)

    def reset_routing(self) -> int:
        return self.frontier.reset_routing()

    def reroute_slots(self, slots: Collection[int], route: Route) -> int:
        return self.frontier.reroute_slots(slots, route)

    def release(self, urls: Sequence[str], route: Route) -> int:
        return self.frontier.release(urls, route)

    def unlease(self, urls: Sequence[str], route: Route) -> int:
        return self.frontier.unlease(urls, route)

    def requeue_leased(self, route: Route) -> int:
        return self.frontier.requeue_leased(route)

    def finish(self, results: Sequence[PageOutcome], revisit: RevisitPolicy | None = None) -> list[bool]:
        return self.frontier.finish(results, revisit)

    def retry_errors(self, route: Route, contains: str | None = None, after: int | None = None,
                     limit: int = CHUNK) -> tuple[int, int | None]:
        return self.frontier.retry_errors(route, contains, after, limit)

    def failed(self) -> Iterator[dict[str, Any]]:
        return self.frontier.failed()

    def lower_depths(self, pairs: Sequence[tuple[str, int]]) -> list[tuple[str, int, int]]:
        return self.frontier.lower_depths(pairs)

    def url_count(self) -> int:
        return self.frontier.url_count()

    def iter_urls(self, batch: int = 100_000) -> Iterator[list[str]]:
        return self.frontier.iter_urls(batch)

    # -- page visits and revisits (store_visits.py) ----------------------------------------------------

    def note_lastmod(self, pairs: Sequence[tuple[str, float]]) -> list[tuple[str, int]]:
        return self.visits.note_lastmod(pairs)

    def requeue_refresh(self, rows: Sequence[tuple[str, int]], route: Route) -> int:
        return self.visits.requeue_refresh(rows, route)

    def requeue_due(self, now: float, route: Route, limit: int = CHUNK) -> list[float]:
        return self.visits.requeue_due(now, route, limit)

    def schedule_unscheduled(self, refresh: bool) -> int:
        return self.visits.schedule_unscheduled(refresh)

    # -- the audio catalogue (store_audio.py) ----------------------------------------------------------

    def add_audio(self, rows: Sequence[Mapping[str, Any]]) -> list[bool]:
        return self.audio.add_audio(rows)

    def settle_audio(self, settled: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> list[dict[str, Any] | None]:
        return self.audio.settle_audio(settled)

    def add_pending(self, rows: Sequence[tuple[str, str, str | None, str, float]]) -> None:
        return self.audio.add_pending(rows)

    def pending_holders(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], tuple[str | None, str]]:
        return self.audio.pending_holders(keys)

    def drop_pending(self, keys: Sequence[tuple[str, str]]) -> None:
        return self.audio.drop_pending(keys)

    def pending_of(self, nodes: Collection[str], unheld: bool = False) -> list[tuple[str, str, str | None, str]]:
        return self.audio.pending_of(nodes, unheld)

    def move_pending(self, moves: Sequence[tuple[str | None, str, str]]) -> None:
        return self.audio.move_pending(moves)

    def pending_count(self) -> int:
        return self.audio.pending_count()

    def pending_nodes(self) -> list[str]:
        return self.audio.pending_nodes()

    def roll_cycle(self, now: float, length: float, due: int = 0) -> bool:
        return self.audio.roll_cycle(now, length, due)

    def changes_since(self, since: float) -> Iterator[dict[str, Any]]:
        return self.audio.changes_since(since)

    def catalogue(self, settled: bool = False) -> Iterator[dict[str, Any]]:
        return self.with_identity(self.audio.catalogue(settled))

    def search_audio(self, query: str, limit: int = 50) -> list[dict[str, Any]]:
        return self.audio.search_audio(query, limit)

    def export_recordings(self) -> Iterator[dict[str, Any]]:
        """Every window recorded of a live stream (store_audio.RECORDING_COLUMNS), in the order stored."""
        return self.audio.recordings_of_items()

    def recordings_stored(self) -> int:
        """Live streams' windows this master stored since it started (crawler_recordings_total)."""
        return self.audio.windows_stored

    def chain_rows(self, wanted: Sequence[str], limit: int = 16) -> list[list[tuple[str | None, str, str]]]:
        return self.audio.chain_rows(wanted, limit)

    # -- identification (store_identify.py) -------------------------------------------------------------

    def add_references(self, refs: Sequence[Reference], now: float) -> int:
        return self.identify.add_references(refs, now)

    def remove_reference(self, work: str) -> bool:
        return self.identify.remove_reference(work)

    def references(self) -> list[dict[str, Any]]:
        return self.identify.references()

    def reference_fingerprints(self, after: int = 0, limit: int = CHUNK) -> list[tuple[int, str, bytes]]:
        return self.identify.reference_fingerprints(after, limit)

    def reference_state(self) -> tuple[int, int]:
        return self.identify.reference_state()

    def reference_works(self) -> set[str]:
        return self.identify.reference_works()

    def add_fingerprints(self, rows: Sequence[tuple[str, bytes]], now: float) -> None:
        self.identify.add_fingerprints(rows, now)

    def add_window_fingerprints(self, rows: Sequence[tuple[str, str, bytes]]) -> None:
        self.identify.add_window_fingerprints(rows)

    def windows_to_match(self, upto: int, limit: int) -> list[tuple[int, bytes, int]]:
        return self.identify.windows_to_match(upto, limit)

    def to_match(self, upto: int, limit: int) -> list[tuple[str, bytes, int | None, int]]:
        return self.identify.to_match(upto, limit)

    def recordings(self, after: str = "", limit: int = CHUNK) -> list[tuple[str, int, bytes]]:
        return self.identify.recordings(after, limit)

    def new_recording(self) -> int:
        return self.identify.new_recording()

    def record_checked(self, checked: Sequence[Checked], now: float, *, alert: bool = False) -> list[dict[str, Any]]:
        return self.identify.record_checked(checked, now, alert=alert)

    def due_alerts(self, now: float, limit: int) -> list[tuple[int, str, int]]:
        return self.identify.due_alerts(now, limit)

    def alert_delivered(self, ids: Sequence[int]) -> None:
        self.identify.alert_delivered(ids)

    def alert_failed(self, retries: Sequence[tuple[int, float]]) -> None:
        self.identify.alert_failed(retries)

    def match_count(self) -> int:
        return self.identify.match_count()

    def latest_matches(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.identify.latest_matches(limit)

    def export_matches(self) -> Iterator[dict[str, Any]]:
        return self.identify.export_matches()

    def with_identity(self, rows: Iterator[dict[str, Any]], batch: int = 1000) -> Iterator[dict[str, Any]]:
        """Catalogue rows with their match ({"work", "score", "offset"}) and recording, when they have one."""
        if not self.identify.present:
            yield from rows
            return
        part: list[dict[str, Any]] = []
        for row in rows:
            part.append(row)
            if len(part) >= batch:
                yield from self._identified(part)
                part = []
        yield from self._identified(part)

    def _identified(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not rows:
            return rows
        found = self.identify.identity_of([r.get("url") or "" for r in rows])
        if found:
            for r in rows:
                r.update(found.get(r.get("url") or "", {}))
        return rows

    # -- figures ---------------------------------------------------------------------------------------

    def count_discards(self, reasons: Mapping[str, int]) -> None:
        """Add to the discard counters (URLs dropped by policy, by reason)."""
        self.core.begin()
        self.core.db.executemany(
            "INSERT INTO discards(reason, n) VALUES (?, ?) ON CONFLICT(reason) DO UPDATE SET n = discards.n + excluded.n",
            [(r, n) for r, n in reasons.items() if n])

    def fetched_bytes(self) -> int:
        """Bytes the workers reported fetched over the whole crawl: pages and stored audio (crawl.max_bytes)."""
        row = self.core.db.execute("SELECT coalesce(sum(value), 0) FROM node_stats "
                                   "WHERE name IN ('bytes', 'audio_bytes')").fetchone()
        return int(row[0])

    def note_node(self, node: str, **counters: int) -> None:
        """Add to one node's figures (pages, errors, bytes ...), in the open transaction (written with the
        commit: _NodeFigures)."""
        self.core.begin()
        self._node_figures.add(node, counters)

    def status(self) -> dict[str, Any]:
        """The operator's figures, read in one snapshot (a reader beside a running master sees one commit):

        states: URLs by state; frontier: queued URLs; frontier_by_node: queued URLs by routed node ("None":
        not routed); nodes: per node, its URLs by state plus the note_node() counters; discards: by reason;
        matches: the (audio URL, work) matches' count and the latest of them (export rows);
        audio: catalogue rows by status ("pending": the download is under way at a node); downloads_pending:
        the downloads the master waits for (pending_downloads rows); figures: what the master saved under the meta key "figures" (HTTP
        status and error reason counts, recent errors); paused: whether the operator paused the crawl. Cheap in
        the master: counts come from memory, the rest are small tables.
        """
        db = self.core.db
        snapshot = self.readonly and not db.in_transaction
        if snapshot:
            db.begin_snapshot()
        try:
            counts = self.core.current_counts()
            by_state = {name: 0 for name in STATE_NAMES.values()}
            frontier_by_node: dict[str, int] = {}
            nodes: dict[str, dict[str, int]] = {}
            for (state, node), n in sorted(counts.items()):
                if not n:
                    continue
                by_state[STATE_NAMES[state]] += n
                if state == QUEUED:
                    frontier_by_node[str(node_of(node))] = n
                if node:
                    nodes.setdefault(node, {})[STATE_NAMES[state]] = n
            self._node_figures.stage()      # what this transaction added, as a commit would write it
            for node, name, value in db.execute("SELECT node, name, value FROM node_stats"):
                nodes.setdefault(node, {})[name] = value
            discards = dict(db.execute("SELECT reason, n FROM discards ORDER BY reason"))
            audio = self.audio.counts_by_status()
            figures = self.get_meta("figures", {})
            paused = bool(self.get_meta("paused", False))
            limit = self.get_meta(LIMIT_META)
            pending = self.audio.pending_count() if self.audio.has_pending else 0
            cycle = self.audio.cycle()
            changes = {"this_cycle": {"start": cycle.get("start"), "first": bool(cycle.get("first")),
                                      "due": cycle.get("due", 0), **{k: cycle.get(k, 0) for k in CHANGE_KINDS}},
                       "last_cycle": self.get_meta("last_cycle")}
            matches = {"count": self.identify.match_count(), "latest": self.identify.latest_matches(LATEST_MATCHES)}
        finally:
            if snapshot:
                db.execute("COMMIT")
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
            "matches": matches,
        }

    def url_counts(self) -> dict[str, int]:
        """URLs by state for /metrics: queued, leased, done, failed (the store's in-memory counts) and
        discarded (the discards table: a row per reason). URLs robots.txt refused are among the discarded (reason
        "robots"), so their own state is not counted again. Nothing here scans the URL table."""
        by_state = {name: 0 for name in STATE_NAMES.values()}
        for (state, _node), n in self.core.current_counts().items():
            by_state[STATE_NAMES[state]] += n
        discarded = self.core.db.execute("SELECT coalesce(sum(n), 0) FROM discards").fetchone()[0]
        return {"queued": by_state["queued"], "leased": by_state["leased"], "done": by_state["done"],
                "failed": by_state["error"], "discarded": int(discarded)}

    def get_meta(self, key: str, default: Any = None) -> Any:
        """A value set_meta() stored (default when none is)."""
        return self.core.get_meta(key, default)

    def set_meta(self, key: str, value: Any) -> None:
        """Store a small JSON-able value in the open transaction."""
        self.core.set_meta(key, value)
