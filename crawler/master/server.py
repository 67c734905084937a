"""The master daemon: accepts workers, streams assignments, takes reports, keeps the state durable.

`Master(cfg).serve()` runs until the crawl is done (with exit_when_done) or `stop()` is called (SIGTERM in the
CLI), and returns the summary. All background tasks and every connection live in one TaskGroup owned by serve(),
so a stop cancels and awaits each of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from crawler import protocol as p
from crawler import sdnotify
from crawler.archive import NO_ARCHIVE, Archive
from crawler.archive.writer import ArchiveWriter, open_archive
from crawler.bloom import BloomFileError, BloomFilter, GrowingBloomFilter
from crawler.connection import ConnectionClosed, FramedConnection
from crawler.http.egress import Egress, ProxiesUnavailable
from crawler.http.getter import Getter, build_stack
from crawler.http.proxies import Proxy
from crawler.http.targets import TargetPolicy
from crawler.items import MAX_URL, PENDING
from crawler.master import steering
from crawler.master.admission import Admission, Limits, source_of
from crawler.master.backend import StoreError, StoreUnreachable
from crawler.master.catalogue import CatalogueFile
from crawler.master.sitestats import SiteStats
from crawler.sites import gate_limits
from crawler.sites import to_wire as sites_to_wire
from crawler.master.config import MasterConfig
from crawler.master.crawl import Crawl, ReportRejected
from crawler.master.limits import LIMIT_META, MAX_PAGES
from crawler.master.matching import Index, Matcher
from crawler.master.dedup import Dedup
from crawler.master.evidence import EvidenceDesk, Request, finish
from crawler.master.downloads import DownloadBoard
from crawler.master.observe import FIGURES_META, Observer
from crawler.master.statistics import MasterStatistics, NodeStatistics
from crawler.master.store import MasterStore, Reference
from crawler.master.storegate import StoreGate
from crawler.politeness import (
    ROBOTS_MAX_BYTES,
    HostGate,
    PolitenessConfig,
    RobotsRules,
    parse_robots,
    robots_url,
)
from crawler.scheduler import NodeTable

if TYPE_CHECKING:
    from crawler.master.web import WebServer

log = logging.getLogger("crawler.master")
T = TypeVar("T")

HANDSHAKE_TIMEOUT = 10.0          # seconds a peer has to prove the secret
# Connections still in their handshake, shared out by source address, and the rate each source may open them at
# (see admission.py): one source cannot hold the slots a restarting worker needs.
ADMISSION = Limits()
READER_LIMIT = 128 * 1024         # asyncio buffers at most twice this per connection before it stops reading
REFRESH_BATCH = 5000      # due pages requeued per statement; the scan goes on batch after batch
COMMIT_INTERVAL = 0.2     # the housekeeping cadence: commit, expiry, heartbeats, "is the crawl done"
ALERTS_IDLE = 1.0         # how often the alerts' outbox is looked at when it had nothing due
IDENTIFY_IDLE = 1.0       # how often the matcher looks for new fingerprints and references when it has none
# A report is recorded a part at a time, the event loop served between the parts: at most REPORT_PART results,
# and no more results once the part holds PART_LINKS links (a link costs the master several microseconds:
# 16 link-heavy pages, 40,000 links, held the loop past 50 ms). Each part is one unit in the store: a part
# refused is undone alone.
REPORT_PART = 16
PART_LINKS = 2000


def report_parts(results: tuple[p.Result, ...]) -> Iterator[tuple[p.Result, ...]]:
    """The parts of a report, in order: a page's results are never split, so one page with more links than
    PART_LINKS is a part of its own (the worker caps a page's links, max_links_per_page)."""
    start, links = 0, 0
    for i, r in enumerate(results):
        if i > start and (i - start >= REPORT_PART or links + len(r.links) > PART_LINKS):
            yield results[start:i]
            start, links = i, 0
        links += len(r.links)
    if start < len(results):
        yield results[start:]


@dataclass
class Session:
    node: str
    conn: FramedConnection
    capacity: int
    credit: int = 0
    last_seen: float = 0.0
    resend: list[p.Task] = field(default_factory=list)
    tasks: asyncio.Task[None] | None = None
    fault: str | None = None     # the worker cannot store anything (its disk): it gets no work until its Credit
    # Every fingerprint the worker owes has come: its last heartbeat, later than its last report, said its
    # fingerprint pool was empty (a fingerprint made after its outcome follows it in a report of its own).
    fingerprints_in: bool = True


@dataclass
class Summary:
    pages: int = 0
    run_pages: int = 0        # done in this run: a restarted crawl's throughput counts only these
    errors: int = 0
    audio: int = 0
    elapsed: float = 0.0
    frontier: int = 0
    discards: dict[str, int] = field(default_factory=dict)
    stale_results: int = 0
    links: int = 0
    new_urls: int = 0
    data_dir: str = ""
    loop_lag_worst: float = 0.0   # the longest the event loop was held, as its lag probe saw it
    files_with_page: int = 0      # downloads whose outcome came in their page's report
    outcomes_apart: int = 0       # downloads reported apart from their page (pending, then settled)


    @property
    def pages_per_s(self) -> float:
        return self.run_pages / self.elapsed if self.elapsed > 0 else 0.0

    def text(self) -> str:
        disc = ", ".join(f"{k} {v}" for k, v in sorted(self.discards.items())) or "none"
        return "\n".join([
            "crawl summary",
            f"  pages fetched   {self.pages}",
            f"  this run        {self.run_pages} pages",
            f"  errors          {self.errors}",
            f"  audio items     {self.audio}",
            *([f"  downloads       {self.files_with_page} files with their pages, {self.outcomes_apart} reported apart"]
              if self.files_with_page or self.outcomes_apart else []),
            f"  elapsed         {self.elapsed:.1f} s",
            f"  throughput      {self.pages_per_s:.1f} pages/s",
            f"  left in queue   {self.frontier}",
            f"  links reported  {self.links} ({self.new_urls} new URLs)",
            f"  discarded URLs  {disc}",
            f"  loop lag worst  {1000 * self.loop_lag_worst:.0f} ms",
            f"  catalogue       {Path(self.data_dir) / 'catalog.jsonl'}",
        ])


def _hostport(addr: tuple[str, int] | None) -> str:
    return f"{addr[0]}:{addr[1]}" if addr else "-"


class StartupError(Exception):
    """The master cannot start as configured (address in use, data dir unusable): one line for the operator."""


class Master:
    def __init__(self, cfg: MasterConfig, *, clock: Callable[[], float] = time.time,
                 new_index: Callable[[], Index] | None = None) -> None:
        """new_index: makes an empty reference index (crawler.identify.ReferenceIndex unless a test gives one)."""
        self.cfg = cfg
        self.clock = clock
        if new_index is None:
            from crawler.identify import ReferenceIndex
            new_index = ReferenceIndex
        self._new_index = new_index
        self.matcher: Matcher | None = None
        self._said_fingerprints = False
        self.sessions: dict[str, Session] = {}
        self.port: int | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()       # something may be sendable now: the dispatcher runs
        self._maybe_done = asyncio.Event()   # the crawl may be done: the housekeeping looks now
        self._sleep_until = math.inf        # when the dispatcher wakes by itself (a politeness gate opens)
        self._turn = 0                      # which session dispatch starts from: rotates, see _dispatch_all
        self._done = False
        self._admission: Admission[int] = Admission(ADMISSION)
        self._strangers: dict[int, asyncio.StreamWriter] = {}    # connections in their handshake, by admission key
        self._conn_ids = itertools.count()
        self._tg: asyncio.TaskGroup | None = None
        # Every connection is a task of the master's TaskGroup (a stop cancels and awaits them all); one accepted
        # before the group runs (while the web server starts) waits here for it.
        self._connections: set[asyncio.Task[None]] = set()
        self._early: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, int]] = []
        self._excess_refused = 0
        self._excess_logged_at = -math.inf
        self.summary = Summary(data_dir=str(cfg.data_dir))
        self.observer = Observer(self.statistics, clock=clock, nodes=cfg.nodes,
                                 data_dir=cfg.data_dir, log_interval=cfg.log_interval)
        # The private addresses the crawl may reach: its seeds' and the configured networks (told to workers).
        self.targets = TargetPolicy.for_crawl(cfg.seeds, cfg.crawl.allowed_networks)
        self.site_wire = sites_to_wire(cfg.sites)      # what every Welcome tells the workers of the sites
        self.site_stats = SiteStats(cfg.sites)          # the sites' figures for the status
        # The master's own requests (robots.txt) leave as the workers' do: through a site's proxies when it names
        # some, else the crawl's; one egress for all its fetches, so a failing proxy is out for all of them.
        self.egress = Egress(self._route if cfg.proxies or any(s.proxies for s in cfg.sites.policies) else None)
        self.paused = False
        self._unanswered: set[str] = set()   # commands applied whose file could not be removed
        # Evidence requests waiting for the nodes' records (crawler/master/evidence.py), by command file name.
        self.evidence = EvidenceDesk(cfg.data_dir / "evidence")
        self._evidence_commands: set[str] = set()
        # Writes Bloom snapshots off the event loop; one thread, so snapshots are written one at a time.
        self._bloom_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bloom-snapshot")
        # The master's own exchanges (its robots.txt fetches) as WARC records in data_dir/archive (crawler/archive/),
        # once serve() has opened the state; NO_ARCHIVE when the archive section turns it off.
        self.archive: Archive = NO_ARCHIVE
        self._archive_writer: ArchiveWriter | None = None

    # ------------------------------------------------------------------ state
    def _open_core(self) -> None:
        """The store, the node table, the Bloom filter and the crawl state: all a command needs."""
        cfg = self.cfg
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self.table = NodeTable(cfg.nodes, key=cfg.scheduling.key)
        self.store = MasterStore(cfg.store_location, max_attempts=cfg.crawl.max_attempts,
                                 slot_of=self.table.slot_of)
        # Every task that uses the store runs through the gate; the store's commits end on its thread.
        self.store_gate = StoreGate(self.store)
        self.bloom_path = cfg.data_dir / "urls.bloom"
        self.bloom = self._load_bloom()
        self.dedup = Dedup(self.bloom, cfg.dedup.whitelist, self.store.known)
        pol = cfg.politeness
        # The gate also carries the 429/503 backoff, so it is always on; with no limits set it only counts.
        # A site's own politeness (cfg.sites) takes the crawl's place for its hosts, in both gates.
        gate = HostGate(pol, *gate_limits(cfg.sites, audio=False, max_per_host=pol.max_per_host,
                                          min_delay=pol.min_delay))
        robots = RobotsRules(pol) if pol.obey_robots else None
        # Downloads have their own gate: audio hosts (CDNs) are not the pages' hosts, nor paced like them.
        self.downloads = DownloadBoard(HostGate(PolitenessConfig(
            max_per_host=pol.audio_max_per_host, min_delay=pol.audio_min_delay, obey_robots=False),
            *gate_limits(cfg.sites, audio=True, max_per_host=pol.audio_max_per_host,
                         min_delay=pol.audio_min_delay)),
            max_age=cfg.crawl.refresh_interval, fault_timeout=cfg.scheduling.fault_timeout)
        self.crawl = Crawl(cfg, self.store, self.dedup, self.table, gate, robots,
                           first_lease=int(self.clock() * 1000) % (1 << 40) * 1000 + 1)
        self.paused = bool(self.store.get_meta("paused", False))

    def _open_state(self) -> None:
        cfg = self.cfg
        self._open_core()
        if self.store.get_meta("nodes") not in (None, list(cfg.nodes)):
            moved = self.store.reset_routing()
            log.warning("the nodes list changed since the last run: %d queued entries are routed again", moved)
        self.store.set_meta("nodes", list(cfg.nodes))
        if n := self.store.schedule_unscheduled(self.crawl.revisit is not None):
            log.info("refresh: %d pages fetched while refresh was off are due again", n)
        back = self.store.requeue_leased(self.crawl.route)
        if back:
            log.info("recovered %d leases that were in flight when the master stopped", back)
        pending = self.crawl.recover_pending(self.clock(), cfg.scheduling.heartbeat_timeout)
        if pending:
            log.info("%d downloads were pending when the master stopped: their nodes have %.0f s to come back "
                     "for them before they go to the others", pending, cfg.scheduling.heartbeat_timeout)
        added = self.crawl.seed(cfg.seeds)
        if added:
            log.info("seeded %d URLs", added)
        steering.commands_dir(cfg.data_dir).mkdir(exist_ok=True)
        for _ in self._apply_commands():    # left by the operator while the master was stopped
            pass
        if self.paused:
            log.warning("the crawl is paused: no work is handed out until `crawler-master resume`")
        self.catalogue = CatalogueFile(cfg.data_dir / "catalog.jsonl")
        self.catalogue.rewrite(self.store.catalogue(settled=True))
        # max_duration counts from the crawl's first start. A limit is said again by this run if still reached;
        # a crawl a limit paused keeps saying which until it is resumed.
        self.crawl.start(self.clock())
        if not self.paused:
            self.store.set_meta(LIMIT_META, None)
        self.observer.opened(self.store)
        self.store.commit()
        self._archive_writer = open_archive(cfg.archive, cfg.data_dir / "archive", "master", clock=self.clock)
        if left := self.evidence.clear_leftovers():
            log.info("evidence: removed what %d unfinished requests of an earlier run left", left)
        if self._archive_writer is not None:
            self.archive = self._archive_writer

    def _load_bloom(self) -> GrowingBloomFilter:
        d = self.cfg.dedup
        fresh = GrowingBloomFilter(d.expected_urls, d.fp_rate, bits_per_item=d.bits_per_url, hashes=d.hashes)
        first = fresh.layers[0]
        count = self.store.url_count()
        why = None
        if not self.bloom_path.exists():
            why = "no snapshot"
        else:
            try:
                # A snapshot from before the filter could grow was sized for the whole of fp_rate: it loads as a
                # first layer that takes fewer URLs (those within half of it).
                legacy = BloomFilter.sizing(d.expected_urls, d.fp_rate)
                bloom = GrowingBloomFilter.load(self.bloom_path, d.fp_rate,
                                                expect_first={(first.m, first.k), legacy})
                saved = self.store.get_meta("bloom_url_count")
                if saved is not None and int(saved) == count:
                    log.info("Bloom filter loaded from %s (%d URLs, %d layers)", self.bloom_path, count,
                             len(bloom.layers))
                    return bloom
                why = f"snapshot is stale ({saved} URLs in it, {count} in the database)"
            except BloomFileError as e:
                why = f"snapshot refused: {e}"
        if count:
            for urls in self.store.iter_urls():
                fresh.add_many(urls)
            log.warning("Bloom filter rebuilt from the URL table (%d URLs, %d layers): %s", count,
                        len(fresh.layers), why)
        return fresh

    # ------------------------------------------------------------------ operator commands
    def apply_offline(self) -> None:
        """Apply the waiting commands with no master running (the command line does this). Raises StoreBusy when
        a master holds the state: that master applies them."""
        self._open_core()
        try:
            seen: list[Path] = []
            # Batches of MAX_PER_TICK until none is left, or none could be removed (it would come back for ever).
            while (waiting := steering.pending(self.cfg.data_dir)) and waiting != seen:
                seen = waiting
                for _ in self._apply_commands():
                    pass
            self._snapshot_bloom()
        finally:
            self.store.close()

    def _apply_commands(self) -> Iterator[None]:
        """Apply the waiting commands, committing each before answering. Yields between chunks of a long one
        (a retry over millions of URLs), so the running master's loop is never held for long."""
        for path in steering.pending(self.cfg.data_dir):
            if path.name in self._unanswered or path.name in self._evidence_commands:
                continue
            try:
                cmd = steering.read(path)
                if cmd["command"] == "evidence" and self._tg is not None:
                    self._start_evidence(path, cmd)   # answered when the nodes have answered
                    continue
                result = yield from self._command(cmd)
            except steering.CommandError as e:
                log.warning("%s", e)
                result = {"error": str(e)}
            self._commit_state()
            try:
                steering.answer(path, result)
            except OSError as e:
                # Not applied again on every tick: once is what the operator asked for.
                self._unanswered.add(path.name)
                log.warning("operator command %s applied but not answered (remove it by hand): %s", path.name, e)

    def _command(self, cmd: dict[str, Any]) -> Generator[None, None, dict[str, Any]]:
        kind = cmd["command"]
        if kind in ("pause", "resume"):
            self.paused = kind == "pause"
            self.store.set_meta("paused", self.paused)
            if not self.paused and self.crawl.limit is None:   # a limit reached before a restart: not any more
                self.store.set_meta(LIMIT_META, None)
            log.warning("operator: crawl %s", "paused: no new work is handed out" if self.paused else "resumed")
            self._wake.set()
            return {"paused": self.paused}
        if kind == "seed":
            urls = cmd.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise steering.CommandError("seed: expected a list of URLs")
            result = self.crawl.seed_more(urls)
            log.info("operator: seeded %d of %d URLs", result["added"], len(urls))
            self._wake.set()
            return result
        if kind == "add-references":
            refs = _references(cmd.get("references"))
            n = self.store.add_references(refs, self.clock())
            log.info("operator: %d reference works added", n)
            return {"added": n, "references": self.store.reference_state()[1]}
        if kind == "evidence":   # no master runs (a running one starts it in _start_evidence)
            raise steering.CommandError("evidence: the master is not running, so no node can be asked for its "
                                        "records: on each node run `crawler-worker evidence --data-dir DIR ...`")
        if kind == "remove-reference":
            work = cmd.get("work")
            if not isinstance(work, str):
                raise steering.CommandError("remove-reference: work must be text")
            if not self.store.remove_reference(work):
                raise steering.CommandError(f"no reference work {work!r}")
            log.info("operator: reference work %r removed, with its matches", work)
            return {"removed": work}
        # retry
        contains = cmd.get("reason")
        if contains is not None and not isinstance(contains, str):
            raise steering.CommandError("retry: reason must be text")
        total, after = 0, None
        while True:
            n, more = self.store.retry_errors(self.crawl.route, contains or None, after)
            total += n
            if more is None:
                break
            after = more
            yield
        log.info("operator: %d failed URLs back in the queue%s", total,
                 f" (errors containing {contains!r})" if contains else "")
        self._wake.set()
        return {"requeued": total}

    # ------------------------------------------------------------------ evidence
    def _start_evidence(self, path: Path, cmd: dict[str, Any]) -> None:
        """Ask the connected nodes for the items' chains; answered at once when a holder is not connected."""
        items, out = cmd.get("items"), cmd.get("out")
        if (not isinstance(items, list) or not 0 < len(items) <= p.MAX_EVIDENCE_ITEMS
                or not all(isinstance(u, str) and 0 < len(u) <= MAX_URL for u in items)
                or not (out is None or isinstance(out, str) and Path(out).is_absolute())):
            self._answer(path, {"error": f"evidence: expected 1 to {p.MAX_EVIDENCE_ITEMS} items and an absolute "
                                         "--out path"})
            return
        connected = sorted(n for n, s in self.sessions.items() if not s.conn.writer.is_closing())
        rows = self.store.chain_rows(items)
        away = sorted({node for item in rows for node, _, _ in item if node} - set(connected))
        known = tuple((i, page, url) for i, item in enumerate(rows) for _, page, url in item)
        if away or not connected:
            where = (f"the records of these items are on {', '.join(away)}, not connected now" if away
                     else "no node is connected")
            self._answer(path, {"error": f"evidence: {where}: on the node's machine run "
                                         "`crawler-worker evidence --data-dir DIR ...`"})
            return
        req, asks = self.evidence.open(path, items, Path(out) if out else None, connected, self.clock(), known)
        try:
            p.encode(asks[0][1], self.cfg.max_frame)
        except p.LocalProtocolError:
            self.evidence.close(req)
            self._answer(path, {"error": "evidence: the items' addresses are too long for one request: ask for "
                                         "fewer at a time"})
            return
        self._evidence_commands.add(path.name)
        log.info("operator: evidence of %d items asked of %s", len(items), ", ".join(connected))
        for node, ask in asks:
            try:
                self.sessions[node].conn.send_nowait(ask)
            except ConnectionClosed:
                for done in self.evidence.gone(node):
                    self._finish_evidence(done)

    def _finish_evidence(self, req: Request) -> None:
        try:
            assert self._tg is not None
            self._tg.create_task(self._write_evidence(req))
        except RuntimeError:     # the master's task group is shutting down: the request ends here
            self.evidence.close(req)
            self._answer(req.command, {"error": "evidence: the master stopped before it could write the bundle"})
            self._evidence_commands.discard(req.command.name)

    async def _write_evidence(self, req: Request) -> None:
        """The bundle (or text) of a request every node has answered, written off the loop, then the answer."""
        try:
            result = await asyncio.to_thread(finish, req, created=time.time())
        except Exception as e:   # a fault of ours: the operator hears of it, the crawl goes on
            log.exception("evidence request %d failed", req.number)
            result = {"error": f"evidence: {e}"}
        finally:
            self.evidence.close(req)
        if "path" in result:
            log.info("operator: evidence written to %s", result["path"])
        self._answer(req.command, result)
        self._evidence_commands.discard(req.command.name)

    def _answer(self, path: Path, result: dict[str, Any]) -> None:
        try:
            steering.answer(path, result)
        except OSError as e:
            self._unanswered.add(path.name)
            log.warning("operator command %s not answered (remove it by hand): %s", path.name, e)

    def _snapshot_bloom(self) -> None:
        """A snapshot now, waiting for it (at start-up and shutdown). It queues behind a periodic one still being
        written: one writer thread, so two snapshots never race for the file."""
        self.store.commit()
        self._bloom_writer.submit(self.bloom.save, self.bloom_path).result()
        self.store.set_meta("bloom_url_count", str(self.store.url_count()))
        self.store.commit()

    async def _snapshot_bloom_off_loop(self) -> None:
        """The periodic snapshot, written by the writer thread from the live filter while the loop goes on adding
        to it (BloomFilter.save), so the event loop is not held while the bits are copied, hashed and written
        (0.16 s for the default filter). The file holds every URL of the count taken here, at a commit, and
        maybe more. That count is what is recorded: a crash before it is committed leaves the older count, and
        the next start rebuilds the filter from the URL table instead of trusting a snapshot it cannot match."""
        await self._commit_off_loop()
        count = self.store.url_count()
        await asyncio.wrap_future(self._bloom_writer.submit(self.bloom.save, self.bloom_path))
        self.store.set_meta("bloom_url_count", str(count))
        await self._commit_off_loop()

    def _stage_commit(self) -> bool:
        """The part of a commit that stays on the loop: the crawl's discards and the store's counters written
        into the open transaction. True when there is a transaction to end."""
        discards = self.crawl.take_discards()
        if (figures := self.observer.committing(discards)) is not None:
            self.store.set_meta(FIGURES_META, figures)
        self.store.count_discards(discards)
        return self.store.prepare_commit()

    def _commit_state(self) -> None:
        if self._stage_commit():
            self.store.end_transaction()

    def _commit(self) -> None:
        """A commit on the calling thread: at start-up and shutdown, when nothing else runs."""
        self.store_gate.wait_ended()   # one still running on the commit thread ends first
        self._commit_state()
        self.catalogue.flush()

    async def _commit_off_loop(self) -> None:
        """The running master's commit. The counters go into the transaction here; the COMMIT itself runs on the
        commit thread, the store lent to it, while the guarded tasks wait (crawler/master/storegate.py)."""
        if self._stage_commit():
            await self.store_gate.end_transaction()
        self.catalogue.flush()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """A task of the master's TaskGroup that may use the store: run through the store gate, so that it never
        runs while a commit holds the store."""
        assert self._tg is not None, "called only while serve() runs its TaskGroup"
        return self._tg.create_task(self.store_gate.guard(coro))

    async def _guard_request(self, work: Awaitable[T]) -> T:
        """A status page request's work: the page answers from the start, while the state opens too. Until the
        store is open no commit can run; from then on the work runs through the store gate."""
        if "store_gate" not in vars(self):
            return await work
        return await self.store_gate.guard(work)

    def statistics(self) -> MasterStatistics:
        """The figures the observer, the status page and /metrics read, as they are now."""
        crawl = self.crawl
        return MasterStatistics(
            sessions=tuple(NodeStatistics(node, s.last_seen, s.fault) for node, s in self.sessions.items()),
            in_flight={n: len(ids) for n, ids in crawl.leases_by_node.items()},
            held=sum(len(q) for q in crawl.held.values()), at_workers=crawl.in_flight(),
            run_pages=crawl.totals.pages, paused=self.paused, dedup=self.dedup.figures(),
            dedup_counts=self.dedup.stats.as_dict(),
            sites=self.site_stats.view(crawl.gate, self.downloads.gate, crawl.waiting_view(self.clock()))
            if self.site_stats else {})

    # ------------------------------------------------------------------ serve
    def stop(self) -> None:
        self._stop.set()

    async def serve(self, started: Callable[[int], None] | None = None) -> Summary:
        t0 = time.monotonic()
        host, port = self.cfg.listen
        # The port first: a taken port must fail before anything is seeded or written.
        try:
            server = await asyncio.start_server(self._accept, host, port, limit=READER_LIMIT)
        except OSError as e:
            raise StartupError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            web = await self._start_web()
        except OSError as e:
            server.close()
            raise StartupError(f"cannot listen on web.listen {_hostport(self.cfg.web.listen)}: {e.strerror or e}"
                               ) from None
        try:
            self._open_state()
        except BaseException as e:
            server.close()
            if web is not None:
                await web.close()
            if isinstance(e, OSError):
                raise StartupError(f"cannot use the data dir {self.cfg.data_dir}: {e.strerror or e}"
                                   f"{f' ({e.filename})' if e.filename else ''}") from None
            if isinstance(e, StoreError) and not isinstance(e, StoreUnreachable):
                # An older layout, another master on the state, not a crawl database: restarting repeats it.
                raise StartupError(str(e)) from None
            raise
        self.port = server.sockets[0].getsockname()[1]
        log.info("master listening on %s:%d for nodes %s", host, self.port, ", ".join(self.cfg.nodes))
        if web is not None:   # said once the state is open: a master that cannot start has no status page
            from crawler.master.web import WEB_ADDR_FILE

            log.info("status page on http://%s/ (metrics at /metrics%s)", self.observer.web_addr,
                     ", token required" if self.cfg.web.token else "")
            (self.cfg.data_dir / WEB_ADDR_FILE).write_text(f"{self.observer.web_addr}\n")
        # Tools and tests find a master that listens on port 0 here (and its web server in web.addr).
        (self.cfg.data_dir / "master.addr").write_text(f"{host}:{self.port}\n")
        if started:
            started(self.port)
        self.observer.write_snapshot()   # the status command has a view from the start, not after the first interval
        sdnotify.ready(f"listening on {host}:{self.port}")
        # Everything built so far (modules, the config, the opened state) lives as long as the process: out of
        # the collector's sight, so a full collection scans only what the crawl allocates (it held the loop
        # 30-55 ms without this).
        gc.freeze()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [self._spawn(self._dispatcher()), self._spawn(self._housekeeping()),
                              tg.create_task(self._heartbeats()), self._spawn(self.observer.run()),
                              tg.create_task(self.observer.metrics.lag.run()), self._spawn(self._identify())]
                if self.cfg.alerts.webhook is not None:
                    background.append(self._spawn(self._alerts()))
                early, self._early = self._early, []
                for reader, writer, key in early:
                    self._start_connection(reader, writer, key)
                await self._stop.wait()
                for task in background:
                    task.cancel()
                server.close()
                if self._done:
                    for s in list(self.sessions.values()):
                        try:
                            await asyncio.wait_for(s.conn.send(p.Shutdown("crawl finished")), 2)
                        except (TimeoutError, ConnectionClosed):
                            pass
                for task in list(self._connections):   # each closes its connection as it ends
                    task.cancel()
        finally:
            server.close()
            if web is not None:
                await web.close()
            self._commit()
            self._snapshot_bloom()
            self._fill_summary(time.monotonic() - t0)
            self.observer.write_snapshot(running=False)
            self.catalogue.close()
            self.store.close()
            if self._archive_writer is not None:
                try:
                    self._archive_writer.close()
                except OSError as e:
                    log.warning("archive not closed: %s", e.strerror or e)
        return self.summary

    async def _start_web(self) -> WebServer | None:
        """The status page, /api/status and /metrics on web.listen (not at all when it is off)."""
        if self.cfg.web.listen is None:
            return None
        from crawler.master.web import WebServer

        web = WebServer(self.observer, self.cfg.store_location, self.cfg.web.token, guard=self._guard_request,
                        hosts=self.cfg.web.allowed_hosts)
        addr = await web.start(*self.cfg.web.listen)
        self.observer.web_addr = addr
        return web

    def _fill_summary(self, elapsed: float) -> None:
        st = self.store.status()
        counts = st.get("states", {})
        self.summary.pages = counts.get("done", 0)
        self.summary.run_pages = self.crawl.totals.pages
        self.summary.files_with_page = self.crawl.totals.files_with_page
        self.summary.outcomes_apart = self.crawl.totals.outcomes_apart
        self.summary.errors = counts.get("error", 0)
        self.summary.audio = sum(st["audio"].values())
        self.summary.frontier = st.get("frontier", 0)
        self.summary.discards = dict(st.get("discards", {}))
        self.summary.stale_results = self.crawl.totals.stale_results
        self.summary.links = self.crawl.totals.links_seen
        self.summary.new_urls = self.crawl.totals.links_new
        self.summary.elapsed = elapsed
        self.summary.loop_lag_worst = self.observer.metrics.lag.worst

    async def _dispatcher(self) -> None:
        """Hands work out when something may be sendable: on an event (_wake), or when the earliest politeness
        gate opens, to the millisecond rather than on a tick, so a polite host gets its full rate. Reports and
        credit are dispatched at once by their handlers; this covers the gates that open with time."""
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            self._sleep_until = -math.inf   # this pass looks at every gate itself
            self._dispatch_all()
            self._fetch_robots()
            now = self.clock()
            self._send_grants(self.downloads.pump(now))
            wake_at = min(self.crawl.next_wake(now), self.downloads.next_wake(now))
            if wake_at == math.inf:
                self._sleep_until = math.inf
                await self._wake.wait()
                continue
            # The crawl's clock is the master's (wall) clock; the sleep is on the loop's monotonic one.
            delay = max(0.0, wake_at - self.clock())
            self._sleep_until = wake_at
            if delay > 0:
                timer = loop.call_later(delay, self._wake.set)
                try:
                    await self._wake.wait()
                finally:
                    timer.cancel()
            else:
                await asyncio.sleep(0)   # a gate due already: go round again, letting the other tasks run first

    async def _housekeeping(self) -> None:
        """Commits and the slow checks, on their own cadence, off the dispatch path."""
        last_snapshot = time.monotonic()
        while True:
            try:   # a crawl that may be done is looked at now, not at the next round
                await asyncio.wait_for(self._maybe_done.wait(), COMMIT_INTERVAL)
            except TimeoutError:
                pass
            self._maybe_done.clear()
            now = self.clock()
            self.crawl.expire(now)
            self.crawl.expire_away(now)
            self._check_heartbeats(now)
            for node in self.downloads.faulted_past(now):
                self.crawl.fault_outlasted(node, self.cfg.scheduling.fault_timeout)
            self._send_download_work()
            if self.crawl.revisit is not None:
                for _ in self._refresh(now):
                    await asyncio.sleep(0)   # a big site's backlog goes in batches, the workers served between
            for _ in self._apply_commands():
                await asyncio.sleep(0)
            for req in self.evidence.expire(now):
                self._finish_evidence(req)
            self._wake.set()   # whatever the checks freed or requeued is handed out by the dispatcher
            self._fetch_robots()
            await asyncio.sleep(0)   # the checks above and the commit below each take the loop for a while
            await self._commit_off_loop()
            sdnotify.watchdog()
            if time.monotonic() - last_snapshot >= self.cfg.dedup.snapshot_interval:
                last_snapshot = time.monotonic()
                await self._snapshot_bloom_off_loop()
            self.crawl.check_limits(now)
            if (reached := self.crawl.limit_news()) is not None:
                self._limit_reached(reached)
            if self.cfg.exit_when_done and self.crawl.done() and self._fingerprints_in():
                log.info("the crawl is done, at its limit" if self.crawl.limit is not None else
                         "frontier empty and nothing in flight: the crawl is done")
                self._done = True
                self._stop.set()
                return

    def _may_have_ended(self) -> None:
        """After a report or an idle worker's heartbeat: a crawl that is done now is ended by the housekeeping at
        once, not at its next round (nothing leased is checked first; the rest is asked only then)."""
        if self.cfg.exit_when_done and not self.crawl.leases and self.crawl.done():
            self._maybe_done.set()

    def _fingerprints_in(self) -> bool:
        """Whether a crawl that is done may end: every connected worker has sent the fingerprints of the files
        it stored (outcomes go without them while its pool is busy, the fingerprints after). A limit that ends
        the crawl at once does not wait for them."""
        if self.crawl.limit is not None and self.crawl.limit != MAX_PAGES:
            return True
        waiting = [s.node for s in self.sessions.values() if not s.fingerprints_in]
        if waiting and not self._said_fingerprints:
            self._said_fingerprints = True
            log.info("the crawl is done; waiting for the fingerprints of %s", ", ".join(sorted(waiting)))
        return not waiting

    async def _identify(self) -> None:
        """Match the fingerprints the workers send, and those a new reference makes due, batch after batch
        (crawler/master/matching.py); idle, look again every IDENTIFY_IDLE seconds."""
        matcher = self.matcher = Matcher(self.store, self._new_index, alert=self.cfg.alerts.webhook is not None)
        try:
            await matcher.load()
            while True:
                n, rows = await matcher.step(self.clock())
                for row in rows:
                    log.info("identified: %s is a copy of %s (score %.3g, from %.1f s), on %s", row["url"],
                             row["work"], row["score"], row["offset"], row["page"])
                await asyncio.sleep(0 if n else IDENTIFY_IDLE)
        finally:
            matcher.close()

    async def _alerts(self) -> None:
        """Deliver the alerts' outbox to the webhook (crawler/master/alerts.py): what is due, round after round."""
        from crawler.master import alerts

        url, secret = self.cfg.alerts.webhook, self.cfg.alerts.secret
        assert url is not None and secret is not None
        # The operator's own address: no crawl target policy, no redirect followed.
        async with build_stack(max_connections=2, dns_ttl=60, max_body=64 * 1024, total_timeout=alerts.TIMEOUT,
                               user_agent=self.cfg.politeness.user_agent, connect_timeout=10, read_timeout=10,
                               max_redirects=0) as http:
            while True:
                n = await alerts.deliver_due(self.store, http.client, url, secret, self.clock)
                await asyncio.sleep(0 if n >= alerts.BATCH else ALERTS_IDLE)

    def _limit_reached(self, key: str) -> None:
        """A limit ends the crawl (with exit_when_done) or pauses it; the log and `status --json` name its key."""
        self.store.set_meta(LIMIT_META, key)
        if self.cfg.exit_when_done:
            log.warning("limit %s reached: the crawl ends %s", key,
                        "once what is in flight is done" if key == MAX_PAGES else
                        "now (what is in flight goes back in line for the next start)")
        else:
            self.paused = True
            self.store.set_meta("paused", True)
            log.warning("limit %s reached: the crawl is paused (raise the limit, restart the master and resume "
                        "to go on)", key)

    def _refresh(self, now: float) -> Iterator[None]:
        """Every page whose next visit is due goes back in line, a batch at a time through the next-visit
        index, until none is due: no cap per tick, so a big site catches up. Yields between batches."""
        total, late = 0, 0.0
        while True:
            lags = self.store.requeue_due(now, self.crawl.route, REFRESH_BATCH)
            if lags:
                total += len(lags)
                late = max(late, lags[0])
            if len(lags) < REFRESH_BATCH:
                break
            yield
        if total:
            log.debug("refresh: %d pages requeued (the most overdue by %.1f s)", total, late)
        # Said once a cycle, when it closes: the scan above runs every tick and finds a few pages each time.
        if self.store.roll_cycle(now, self.cfg.crawl.refresh_interval or 0, total):
            last = self.store.get_meta("last_cycle") or {}
            if last.get("first"):
                log.info("refresh: the first visit of the site is over; revisits begin")
            else:
                log.info("refresh cycle: %d pages due again; %d new, %d changed, %d removed audio items",
                         last.get("due", 0), last.get("new", 0), last.get("changed", 0), last.get("removed", 0))

    def _check_heartbeats(self, now: float) -> None:
        timeout = self.cfg.scheduling.heartbeat_timeout
        for s in list(self.sessions.values()):
            if now - s.last_seen > timeout:
                log.warning("worker %s silent for %.1f s: declaring it dead", s.node, now - s.last_seen)
                self._detach(s, dead=True)
                if s.tasks:
                    s.tasks.cancel()
                s.conn.abort()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.scheduling.heartbeat_interval)
            now = self.clock()
            for s in list(self.sessions.values()):
                try:
                    s.conn.send_nowait(p.Heartbeat(now))
                except ConnectionClosed:
                    pass

    # ------------------------------------------------------------------ robots.txt
    def _route(self, host: str, port: int) -> tuple[Proxy, ...]:
        site = self.cfg.sites.lookup(host, port)
        if site is not None and site.proxies is not None:
            return site.proxies
        return self.cfg.proxies

    def _fetch_robots(self) -> None:
        for origin in self.crawl.robots_to_fetch():
            self._spawn(self._robots_one(origin))

    async def _robots_one(self, origin: str) -> None:
        # The workers' HTTP stack: the body cut at the cap after decoding (stacked encodings refused), a total
        # deadline, and every address of every redirect hop checked against the crawl's targets.
        status = body = parsed = None
        try:
            async with asyncio.timeout(self.cfg.politeness.robots_timeout), \
                    build_stack(max_connections=2, dns_ttl=60, max_body=ROBOTS_MAX_BYTES + 1,
                                total_timeout=self.cfg.politeness.robots_timeout, policy=self.targets,
                                user_agent=self.cfg.politeness.user_agent, connect_timeout=10, read_timeout=10,
                                max_redirects=5, archive=self.archive, role="robots", clock=self.clock,
                                egress=self.egress) as http:
                status, body = await fetch_robots(http, robots_url(origin))
            if 200 <= status < 300:
                # Parsing a large file takes a while (pure Python): off the event loop, which serves workers.
                parsed = await asyncio.to_thread(parse_robots, body, self.cfg.politeness.user_agent)
        except (httpx.HTTPError, TimeoutError, ProxiesUnavailable) as e:
            status = body = parsed = None
            log.info("robots.txt of %s not fetched: %s", origin, str(e) or type(e).__name__)
        self.crawl.robots_fetched(origin, status, body, self.clock(), parsed)
        self._wake.set()

    # ------------------------------------------------------------------ workers
    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stop.is_set():
            writer.transport.abort()
            return
        # Decided at once, before any task or buffer exists for the peer: a flood costs an accept and a close.
        peer = writer.get_extra_info("peername")
        key = next(self._conn_ids)
        verdict = self._admission.offer(key, source_of(peer[0] if isinstance(peer, tuple) else str(peer)),
                                        time.monotonic())
        if not verdict.admit:
            writer.transport.abort()
            self._excess_refused += 1
            self._turned_away(peer, f"refused: {verdict.reason}")
            return
        if verdict.evict is not None:
            evicted = self._strangers.pop(verdict.evict, None)
            if evicted is not None:
                evicted.transport.abort()
            self._turned_away(peer, "took the handshake slot of an older one")
        self._strangers[key] = writer
        if self._tg is None:
            self._early.append((reader, writer, key))
        else:
            self._start_connection(reader, writer, key)

    def _turned_away(self, peer: Any, what: str) -> None:
        """Refusals and evictions are said once in a while with their counts, never a line a connection."""
        now = time.monotonic()
        if now - self._excess_logged_at >= 10:
            self._excess_logged_at = now
            log.warning("connection from %s %s (%d unauthenticated connections refused, %d evicted so far)",
                        _hostport(peer), what, self._excess_refused, self._admission.evicted)

    def _start_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        task = self._spawn(self._connection(reader, writer, key))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    def _end_handshake(self, key: int) -> None:
        self._admission.release(key)
        self._strangers.pop(key, None)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        try:
            await self._handle(reader, writer, key)
        except Exception:
            # A fault of ours while serving one peer ends that connection, said loudly, and not the crawl.
            log.exception("connection from %s: unexpected error; closing it",
                          _hostport(writer.get_extra_info("peername")))
        finally:
            self._end_handshake(key)
            if not writer.is_closing():   # cancelled mid-handshake by a stop, or the error above
                writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int) -> None:
        hs = p.MasterHandshake(self.cfg.secret)
        conn = FramedConnection(reader, writer, self.cfg.max_frame, recv_limit=hs.recv_limit)
        try:
            # wait_for runs the handshake as a task of its own: guarded like every task that may use the store.
            hello = await asyncio.wait_for(self.store_gate.guard(self._handshake(conn, hs, key)), HANDSHAKE_TIMEOUT)
        except p.HandshakeFailed as e:
            log.warning("connection from %s refused: %s", conn.peer, e)
            if e.reply is not None:
                with contextlib.suppress(TimeoutError, ConnectionClosed):
                    await asyncio.wait_for(conn.send(e.reply), 2)
            await conn.close()
            return
        except TimeoutError:
            log.warning("connection from %s refused: no handshake within %.0f s", conn.peer, HANDSHAKE_TIMEOUT)
            conn.abort()
            return
        except (p.ProtocolError, ConnectionClosed) as e:
            if key in self._strangers:     # an evicted one is counted in _accept's line, not said one by one
                log.warning("connection from %s refused: %s", conn.peer, e)
            await conn.close()
            return
        finally:
            self._end_handshake(key)
        if hello is None:
            await conn.close()
            return
        conn.recv_limit = hs.recv_limit
        s = Session(hello.worker_id, conn, hello.capacity, last_seen=self.clock())
        s.tasks = asyncio.current_task()
        self._attach(s)
        try:
            while True:
                msg = hs.receive(await conn.recv())
                s.last_seen = self.clock()
                if isinstance(msg, p.Fetched):
                    if self.crawl.fetched(s.node, msg.fetches, s.last_seen):
                        self._dispatch_all()     # the host slots it freed may be waited on by any node
                    continue
                if isinstance(msg, p.DownloadAsk):
                    self._send_grants(self.downloads.ask(s.node, msg.asks, s.last_seen))
                    continue
                if isinstance(msg, p.DownloadDone):
                    self._send_grants(self.downloads.done(s.node, msg.ends, s.last_seen))
                    continue
                if isinstance(msg, p.EvidenceRecords):
                    if (req := self.evidence.piece(s.node, msg)) is not None:
                        self._finish_evidence(req)
                    continue
                if isinstance(msg, (p.DownloadReport, p.Report)):
                    s.fingerprints_in = False      # until a heartbeat after it says the pool is empty
                if isinstance(msg, p.DownloadReport):
                    try:
                        settled = self.crawl.settle(s.node, msg.outcomes, s.last_seen)
                    except ReportRejected as e:
                        raise p.ProtocolError(str(e)) from None
                    if settled:
                        self.catalogue.add(settled)
                        self.observer.downloads_settled(s.node, settled)
                    continue
                if isinstance(msg, p.Report):
                    await self._record(s, msg.results)
                elif isinstance(msg, p.Credit):
                    at_worker = self.crawl.in_flight(s.node) - len(s.resend)
                    if s.credit + msg.n + at_worker > s.capacity:
                        raise p.ProtocolError(f"credit beyond the announced capacity of {s.capacity}")
                    s.credit += msg.n
                    if s.fault is not None:
                        s.fault = None
                        log.info("worker %s can store again: it takes work again", s.node)
                        self.crawl.node_up(s.node)   # its own slot's URLs come back to it
                        self._send_grants(self.downloads.node_ok(s.node, s.last_seen))
                        self._send_download_work()
                elif isinstance(msg, p.Fault):
                    self._fault(s, msg)
                    msg = p.Report(())      # its work may now route to any node
                elif isinstance(msg, p.SiteWait):
                    # A site the worker cannot log into: the site waits (crawl.site_wait says so, once), not the
                    # node, and nothing is counted against the URLs.
                    self.crawl.site_wait(s.node, msg.leases, msg.reason, msg.retry_in, self.clock())
                    msg = p.Report(())      # what the site held of the level no longer holds the others
                elif isinstance(msg, p.Heartbeat):
                    self.observer.heartbeat(s.node, msg)
                    s.fingerprints_in = msg.fingerprint_backlog == 0
                    if msg.leases:   # the work in progress at the worker keeps its leases
                        self.crawl.renew(s.node, msg.leases, s.last_seen)
                    elif s.fingerprints_in:
                        self._may_have_ended()
                    continue
                if isinstance(msg, p.Report):
                    self._may_have_ended()
                    self._dispatch_all()     # its links may route to any node
                    # A frame already in the buffer is read without a pause: the other connections, the
                    # dispatcher and the timers get their turn between reports.
                    await asyncio.sleep(0)
                else:
                    self._dispatch(s)
        except p.ProtocolError as e:
            log.warning("worker %s (%s) broke the protocol: %s; closing its connection", s.node, conn.peer, e)
        except ConnectionClosed as e:
            log.info("worker %s disconnected: %s", s.node, e)
        finally:
            try:
                self._detach(s)
            finally:
                await conn.close()

    async def _record(self, s: Session, results: tuple[p.Result, ...]) -> None:
        """A worker's report, a part at a time (report_parts) with the loop served between the parts."""
        for i, part in enumerate(report_parts(results)):
            if i:
                await asyncio.sleep(0)
                s.last_seen = self.clock()
            try:
                rows = self.crawl.complete(s.node, part, s.last_seen)
            except ReportRejected as e:
                raise p.ProtocolError(str(e)) from None
            if rows:
                # The file takes a row once its download ended (a DownloadReport for pending ones).
                self.catalogue.add([r for r in rows if r.get("status") != PENDING])
            self.observer.report(s.node, part, rows, s.last_seen)
            if self.site_stats:
                self.site_stats.pages(part)
                self.site_stats.audio(rows)

    async def _handshake(self, conn: FramedConnection, hs: p.MasterHandshake, key: int) -> p.Hello | None:
        """The worker proves the secret first (see protocol.py); only then does this master prove its own."""
        challenge = hs.receive_hello(await conn.recv())
        self._admission.greeted(key)       # no longer idle: evicted after its source's idle ones
        await conn.send(challenge)
        conn.recv_limit = hs.recv_limit    # an Auth carries the worker's fragment rules: a little more room
        hello = hs.receive_auth(await conn.recv())
        if hello.worker_id not in self.cfg.nodes:
            log.warning("connection from %s refused: unknown node id %r", conn.peer, hello.worker_id)
            await conn.send(hs.refuse(f"node id {hello.worker_id!r} is not in the master's nodes list", p.UNKNOWN_ID))
            return None
        old = self.sessions.get(hello.worker_id)
        if old is not None and self.clock() - old.last_seen <= self._alive_within():
            # Two machines with one id (a cloned VM) would knock each other off for ever: the first one keeps it.
            # A session silent for longer is taken to be this worker's own dead connection and is replaced.
            log.warning("connection from %s refused: node id %r is already connected from %s", conn.peer,
                        hello.worker_id, old.conn.peer)
            await conn.send(hs.refuse(f"node id {hello.worker_id!r} is already connected from {old.conn.peer}",
                                      p.DUPLICATE_ID))
            return None
        if hs.keep_fragment:
            try:
                self._add_fragment_rules(hello.worker_id, hs.keep_fragment)
            except ValueError as e:
                log.warning("connection from %s refused: worker %r brings a fragment rule the crawl cannot take: %s",
                            conn.peer, hello.worker_id, e)
                await conn.send(hs.refuse(f"a fragment rule of this worker's resolvers: {e}"))
                return None
        await conn.send(hs.welcome(self.cfg.scheduling.heartbeat_interval, self.crawl.norm.keep_fragment,
                                   self.cfg.max_frame, self.cfg.crawl.max_depth,
                                   tuple(f"{h}:{port}" for h, port in sorted(self.targets.origins)),
                                   self.cfg.crawl.allowed_networks, self.cfg.crawl.sort_query,
                                   tuple(self.cfg.crawl.drop_params), tuple(x.wire for x in self.cfg.proxies),
                                   self.site_wire))
        conn.start_session(hs.session_keys())
        return hello

    def _add_fragment_rules(self, node: str, rules: tuple[str, ...]) -> None:
        """A joining worker's resolvers name URLs whose fragment matters that the crawl did not know: the rules
        the operator approved key those URLs with their fragment from now on, and the workers already connected
        are told. The others are ignored (each logged once): never compiled, kept or passed on."""
        new, ignored = self.crawl.add_fragment_rules(node, rules)
        if ignored:
            log.warning("worker %s brought fragment rules not in crawl.approved_fragment_rules, ignored: %s", node,
                        ", ".join(repr(r[:100]) for r in ignored))
        if not new:
            return
        log.info("worker %s brought fragment rules the crawl lacked: %s (kept from now on)", node, ", ".join(new))
        told = p.FragmentRules(self.crawl.norm.keep_fragment)
        for s in self.sessions.values():
            try:
                s.conn.send_nowait(told)
            except ConnectionClosed:
                pass

    def _fault(self, s: Session, msg: p.Fault) -> None:
        """A local fault on the worker: its leases go back to the frontier without an attempt, and its work to the
        live nodes, until it grants credit again. Counted against the node, never against the URLs."""
        if s.fault is None:
            log.warning("worker %s cannot store what it fetches (%s): its work goes to the other nodes",
                        s.node, msg.reason)
            self.store.note_node(s.node, faults=1)
        s.fault = msg.reason
        leases = [t.lease for t in s.resend] + list(msg.leases)
        s.resend = []
        back = self.crawl.node_fault(s.node, leases, self.clock())
        if back:
            self.store.note_node(s.node, handed_back=back)
        # Its download asks wait aside; its pending downloads stay its own for scheduling.fault_timeout.
        self._send_grants(self.downloads.node_fault(s.node, self.clock()))

    def _alive_within(self) -> float:
        """A session heard from this recently is alive: a worker speaks at least once a heartbeat interval."""
        sch = self.cfg.scheduling
        return max(2 * sch.heartbeat_interval, sch.heartbeat_timeout / 2)

    def _attach(self, s: Session) -> None:
        old = self.sessions.get(s.node)
        if old is not None:
            log.warning("worker %s connected again from %s: replacing its old connection", s.node, s.conn.peer)
            self._detach(old)
            if old.tasks:
                old.tasks.cancel()
        self.sessions[s.node] = s
        self.observer.joined(s.node, s.last_seen)
        s.resend = self.crawl.node_up(s.node)
        log.info("worker %s joined from %s (capacity %d%s)", s.node, s.conn.peer, s.capacity,
                 f", {len(s.resend)} of its leases sent again" if s.resend else "")
        self._send_download_work()
        self._wake.set()

    def _detach(self, s: Session, dead: bool = False) -> None:
        if self.sessions.get(s.node) is not s:
            return
        del self.sessions[s.node]
        self.observer.left(s.node, s.last_seen)
        for req in self.evidence.gone(s.node):
            self._finish_evidence(req)
        self._send_grants(self.downloads.node_gone(s.node, self.clock()))
        if dead:   # silent past the heartbeat timeout: it had its grace already
            self.crawl.node_down(s.node, self.clock())
        else:
            self.crawl.node_away(s.node, self.clock(), self.cfg.scheduling.heartbeat_timeout)
        self._send_download_work()
        self._dispatch_all()

    def _send_download_work(self) -> None:
        """Pending downloads the crawl handed to nodes (a dead node's, or a node's own after it rejoined), as
        download-only work. A node that is not connected (or cannot store now) gets its share when it is back:
        the store still names it as the holder, and node_up() hands them over again."""
        for node, items in self.crawl.take_download_work().items():
            s = self.sessions.get(node)
            if s is None or s.fault is not None:
                continue
            step = 32   # items carry up to a few hundred KiB of text each: frames stay far below the limit
            try:
                s.conn.send_nowait(*(p.DownloadWork(tuple(items[i:i + step])) for i in range(0, len(items), step)))
            except ConnectionClosed:
                pass

    def _send_grants(self, grants: list[tuple[str, p.Grant]]) -> None:
        """One DownloadGrant frame per node. A grant to a node that is gone is given back at once."""
        by_node: dict[str, list[p.Grant]] = {}
        for node, g in grants:
            by_node.setdefault(node, []).append(g)
        while by_node:
            node, mine = by_node.popitem()
            s = self.sessions.get(node)
            if s is not None:
                try:
                    s.conn.send_nowait(p.DownloadGrant(tuple(mine)))
                    continue
                except ConnectionClosed:
                    pass
            back = self.downloads.done(node, tuple(p.DownloadEnd(g.ticket) for g in mine
                                                   if g.verdict == p.GRANT_GO), self.clock())
            for other, g in back:
                by_node.setdefault(other, []).append(g)
        if self.downloads.next_wake(self.clock()) < self._sleep_until:
            self._wake.set()   # a download host's spacing ends before the dispatcher would look again

    def _dispatch(self, s: Session) -> None:
        if s.credit <= 0 or s.fault is not None or self.paused or self._stop.is_set():
            self.crawl.wake_at.pop(s.node, None)   # it can take nothing: no reason to wake for it
            return
        tasks = []
        if s.resend:
            tasks, s.resend = s.resend[:s.credit], s.resend[s.credit:]
        now = self.clock()
        tasks += self.crawl.take(s.node, s.credit - len(tasks), now)
        if self.crawl.wake_at.get(s.node, math.inf) < self._sleep_until:
            self._wake.set()   # a gate opens before the dispatcher would look again
        if not tasks:
            return
        if log.isEnabledFor(logging.DEBUG):   # when each request was let go: politeness checks read this
            log.debug("assigned %d to %s at %.6f: %s", len(tasks), s.node, now, " ".join(t.url for t in tasks))
        s.credit -= len(tasks)
        step = 512
        try:
            s.conn.send_nowait(*(p.Assign(tuple(tasks[i:i + step])) for i in range(0, len(tasks), step)))
        except ConnectionClosed:
            pass

    def _dispatch_all(self) -> None:
        # Each pass starts from the next session: when a host's gate opens, the nodes waiting on it take turns
        # (each with the URLs the double hash gave it) instead of the first-connected one taking every start.
        sessions = list(self.sessions.values())
        if not sessions:
            return
        self._turn = (self._turn + 1) % len(sessions)
        for s in sessions[self._turn:] + sessions[:self._turn]:
            self._dispatch(s)


async def fetch_robots(http: Getter, url: str) -> tuple[int, bytes]:
    """The status and body of a robots.txt: redirects followed up to the client's limit, the body cut at the
    stack's cap (bodies past it end there, as a browser would stop reading)."""
    async with http.client.stream("GET", url, extensions={"cut_body": True}) as r:
        return r.status_code, b"".join([chunk async for chunk in r.aiter_raw()])


def _references(value: object) -> list[Reference]:
    """The works of an add-references command (crawler-master references add wrote it)."""
    import base64
    import binascii

    from crawler.identify import MAX_FINGERPRINT_BYTES

    if not isinstance(value, list):
        raise steering.CommandError("add-references: expected a list of references")
    refs = []
    for r in value:
        if not isinstance(r, dict) or not isinstance(r.get("work"), str) or not r["work"] \
                or not isinstance(r.get("fingerprint"), str):
            raise steering.CommandError("add-references: each reference needs a work id and a fingerprint")
        try:
            fp = base64.b64decode(r["fingerprint"], validate=True)
        except (binascii.Error, ValueError):
            raise steering.CommandError(f"add-references: the fingerprint of {r['work']!r} is not base64") from None
        if not fp or len(fp) > MAX_FINGERPRINT_BYTES:
            raise steering.CommandError(f"add-references: the fingerprint of {r['work']!r} is empty or too big")
        text = {k: r.get(k) if isinstance(r.get(k), str) else None for k in ("title", "artist", "source")}
        refs.append(Reference(r["work"], fp, **text))
    return refs
