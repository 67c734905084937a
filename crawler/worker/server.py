"""The worker daemon: connect to the master, take tasks within the credit it granted, report results.

One session per connection. Everything a session starts (reader, task runners, reporter, heartbeats) lives in
that session's TaskGroup; when the connection goes, the group is cancelled and the master re-leases whatever
was unfinished. The worker reconnects by itself, with backoff, until the master sends Shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import msgspec

from crawler import items as it
from crawler import protocol as p
from crawler import sdnotify
from crawler.archive import NO_ARCHIVE, Archive
from crawler.archive.writer import ArchiveWriter
from crawler.config import ConfigError
from crawler.connection import ConnectionClosed, FramedConnection
from crawler.http.egress import Egress, ProxiesUnavailable, exits_used, pinned
from crawler.http.proxies import Proxy, parse_wire
from crawler.http.targets import TargetPolicy, parse_network
from crawler.http.getter import build_stack
from crawler.http.recording import recorded_as
from crawler.identify import fingerprint_file
from crawler.metrics import WorkerMetrics, serve_metrics
from crawler.politeness import THROTTLE_STATUSES, parse_retry_after
from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    ResolverUnavailable,
)
from crawler.resolvers.registry import followers, load_resolvers, pick
from crawler.sites import DepthLimits, SiteTable
from crawler.worker import siterules
from crawler.worker.siterules import SiteRules
from crawler.sites import from_wire as sites_from_wire
from crawler.web import html
from crawler.web.links import audio_candidates, count_links, extract_links
from crawler.web.media import is_audio_url, is_playlist_url
from crawler.web.page import FetchedPage
from crawler.web.urls import NormalizeOptions, normalize_many
from crawler.worker.config import WorkerConfig
from crawler.worker.downloader import Downloader, Started
from crawler.worker.faults import RESUME_HEADROOM, LocalFault, check_data_dir, describe, is_local
from crawler.worker.fetcher import SNIFF_BYTES, FetchError, PageFetcher
from crawler.worker.fingerprints import OUTCOMES as FINGERPRINT_OUTCOMES
from crawler.worker.fingerprints import Fingerprinter, FingerprintPool, file_seconds
from crawler.worker import page_plan
from crawler.worker.ledger import DownloadLedger, Key, Outgoing
from crawler.worker.linkcache import LinkCache
from crawler.worker.revisit import PageAudio, content_digest
from crawler.worker.sessions import SessionGetter, Sessions, SessionUnavailable, Verdict
from crawler.worker.pagestore import open_page_store, page_exchange

log = logging.getLogger("crawler.worker")

REPORT_BATCH = 64
REPORT_BYTES = 2 * 1024 * 1024
# Links longer than this are not reported: no crawl policy keeps them, and they would only bloat frames.
MAX_LINK_LENGTH = 4096
MAX_VALIDATOR = 256   # characters of an ETag or a Last-Modified date kept for the next visit
REPORT_DELAY = 0.02
ENDED_KEPT = 4096   # page requests whose outcome is remembered for tasks chained after them
# How often the data dir is checked for free space, and, after a local fault, whether it can be written again.
DISK_CHECK_INTERVAL = 1.0
# A worker left with nothing to do after a report says so in a heartbeat at once (the master holds the end of a
# crawl until a heartbeat after the last report says no fingerprint is pending), but at most this often.
QUIET_HEARTBEAT_GAP = 0.05
# A download no proxy could carry tries again after this long (a failed proxy's first backoff is 5 s).
PROXY_WAIT = 2.0


@dataclass(frozen=True, slots=True)
class SiteBack:
    """A task handed back because its site cannot be logged into here (protocol.SiteWait): the site waits at the
    master, this node goes on with other work."""

    lease: int
    site: str
    reason: str
    retry_in: float


# What a task's run ends in: its Result, its lease id when a local fault hands it back, or a SiteBack.
Outcome = p.Result | int | SiteBack


def _wire_size(r: Outcome) -> int:
    """A cheap upper estimate of a result's encoded size, to keep report frames well under the limit."""
    if isinstance(r, int):
        return 16
    if isinstance(r, SiteBack):
        return 64 + len(r.site) + len(r.reason)
    return (512 + sum(len(u) + 4 for u in r.links) + 1024 * len(r.audio) + sum(len(u) + 16 for u, _ in r.lastmod)
            + sum(len(a.fingerprint) for a in r.audio if a.fingerprint)
            + sum(len(u) + 4 for u in r.refs)
            + sum(len(u) + 64 + sum(len(v or "") for v in (m.title, m.artist, m.album)) for u, m in r.link_meta))


def _site_wait_frames(backs: list[SiteBack], max_frame: int) -> bytes:
    """One SiteWait a site for these handed-back tasks, with the latest word on its login (the soonest retry)."""
    by_site: dict[str, list[SiteBack]] = {}
    for b in backs:
        by_site.setdefault(b.site, []).append(b)
    out = b""
    for site, group in by_site.items():
        last = min(group, key=lambda b: b.retry_in)
        out += p.encode(p.SiteWait(site[:it.MAX_NAME], last.reason[:it.MAX_TEXT], min(last.retry_in, 1e9),
                                   tuple(b.lease for b in group)), max_frame)
    return out


def _report_frames(batch: list[p.Result], max_frame: int) -> bytes:
    """Encoded report frames for a batch; a result that fits in no frame is reported as an error instead."""
    try:
        return p.encode(p.Report(tuple(batch)), max_frame)
    except ValueError:
        pass
    out = []
    for r in batch:
        try:
            out.append(p.encode(p.Report((r,)), max_frame))
            continue
        except ValueError:
            pass
        try:
            # Fingerprints first: the master hears of the items without them (the frame limit is below them).
            out.append(p.encode(p.Report((_without_fingerprints(r),)), max_frame))
            log.warning("result for %s is larger than a frame; reporting its audio without fingerprints", r.url)
        except ValueError:
            log.warning("result for %s is larger than a frame; reporting it without its links and audio", r.url)
            out.append(p.encode(p.Report((p.Result(r.lease, r.url, p.ERROR, r.http_status, r.final_url,
                                                   r.content_type, r.size, "result larger than the frame limit"),))))
    return b"".join(out)


def _without_fingerprints(r: p.Result) -> p.Result:
    if not any(a.fingerprint for a in r.audio):
        return r
    return msgspec.structs.replace(r, audio=tuple(a.replace(fingerprint=None) if a.fingerprint else a
                                                  for a in r.audio))


def _within_limits(r: p.Result) -> p.Result:
    """The result as the master will take it. The master refuses a report with a value past the wire's limits
    (a hostile page's megabyte title, a NaN duration) and closes the connection; the page would come back and
    fail the same way for ever. So what does not fit is dropped here: the audio items that fail the checks, or
    failing that everything but an error status."""
    try:
        p.check_result(r)
        return r
    except p.ProtocolError as e:
        why = str(e)[:200]
    audio = []
    for a in r.audio:
        try:
            p.check_result(p.Result(r.lease, r.url, r.status, audio=(a,)))
            audio.append(a)
        except p.ProtocolError:
            pass
    fitted = msgspec.structs.replace(r, audio=tuple(audio))
    try:
        p.check_result(fitted)
        log.warning("result for %s: %d audio items out of the wire's limits dropped (%s)", r.url,
                    len(r.audio) - len(audio), why)
        return fitted
    except p.ProtocolError:
        log.warning("result for %s is out of the wire's limits (%s): reported as an error", r.url, why)
        return p.Result(r.lease, r.url, p.ERROR, error=f"result out of the wire's limits: {why}")


def _now() -> float:
    """The loop's clock, which the ledger's times are in (the flush timer runs on it)."""
    return asyncio.get_running_loop().time()


class MasterRefused(Exception):
    """The master refused this worker (bad secret, unknown id, id in use): retrying will not help without a fix."""

    def __init__(self, reason: str, code: str = "") -> None:
        super().__init__(reason)
        self.code = code


class _Shutdown(Exception):
    pass


@dataclass
class WorkerStats:
    pages: int = 0
    errors: int = 0
    audio: int = 0
    bytes: int = 0
    in_flight: int = 0
    # Pages refused for what the site sent, by reason: "page too complex", "body refused", "address refused".
    refused: Counter[str] = field(default_factory=Counter)
    handed_back: int = 0      # tasks given back unfinished after a local fault (disk full ...)


def progress_line(interval: float, now: WorkerStats, before: WorkerStats) -> str:
    """The worker's periodic log line: its own work over the last interval."""
    per_min = 60.0 / interval if interval > 0 else 0.0
    mib = (now.bytes - before.bytes) / interval / (1 << 20) if interval > 0 else 0.0
    return (f"progress: {(now.pages - before.pages) * per_min:.0f} pages/min, "
            f"{(now.audio - before.audio) * per_min:.0f} audio/min, {now.errors - before.errors} errors, "
            f"{now.in_flight} in flight, {mib:.2f} MiB/s")


class Worker:
    def __init__(self, cfg: WorkerConfig, fingerprinter: Fingerprinter | None = None) -> None:
        """fingerprinter: what the fingerprint pool runs on each stored audio file (absent:
        crawler.identify.fingerprint_file); it must be picklable, a module's function."""
        self.cfg = cfg
        self.stats = WorkerStats()
        self.metrics = WorkerMetrics(cfg.id)
        # Every stored audio file is fingerprinted off the loop, in processes of the pool's own (fingerprints.py).
        self.fingerprints: FingerprintPool | None = None
        if cfg.identify.enabled:
            outcomes = {o: self.metrics.fingerprints.labels(cfg.id, o) for o in FINGERPRINT_OUTCOMES}
            self.fingerprints = FingerprintPool(fingerprinter or fingerprint_file, processes=cfg.identify.processes,
                                                max_backlog=cfg.identify.max_backlog,
                                                on_outcome=lambda o: outcomes[o].inc())
            pool = self.fingerprints
            self.metrics.fingerprint_backlog.set_function(lambda: pool.backlog)
        self.metrics_addr: str | None = None
        self._debug = log.isEnabledFor(logging.DEBUG)
        self._stop = asyncio.Event()
        self.resolvers: list[Resolver] = load_resolvers(cfg.resolvers)
        self.links = LinkCache(cfg.link_cache)
        self.page_audio = PageAudio()     # the audio pages listed, for their visits answered 304 (revisit.py)
        # Until a master says how the crawl keys URLs (its Welcome, see _serve_session), the resolvers' fragment
        # rules: a task run on its own keeps the fragments its resolvers need. The master is told them in the
        # handshake.
        self._fragment_rules = tuple(dict.fromkeys(pat for r in self.resolvers for pat in r.keep_fragment))
        if len(self._fragment_rules) > p.MAX_RULES or any(len(r) > p.MAX_RULE for r in self._fragment_rules):
            raise ResolverConfigError(f"resolvers: their fragment rules must be at most {p.MAX_RULES}, each at most "
                                      f"{p.MAX_RULE} characters (the master takes no more in a handshake)")
        self.norm = NormalizeOptions(keep_fragment=self._fragment_rules)
        self.max_depth: int | None = None   # the crawl's depth limit, from the master's Welcome
        # The crawl's proxies and the sites' policies, from the master's Welcome (this node's own proxies, in
        # cfg.proxies, win over both).
        self.crawl_proxies: tuple[Proxy, ...] = ()
        self.sites = SiteTable()
        self.depths = DepthLimits(None, self.sites)
        # The sites' cookie jars and logins (sessions.py), for the sites of the Welcome that have a session.
        self.sessions = Sessions(lambda: self.http.client)
        # Every request of this node leaves through the egress (crawler/http/egress.py): its route is set once
        # the proxies that may apply are known (None while none does: no per-request work then).
        self.egress = Egress()
        self._set_route()
        self.metrics.watch_proxies(self.egress.snapshot)
        self.targets = TargetPolicy()          # public addresses only, until the Welcome names the crawl's own
        # Downloads, as the master must hear of them (ledger.py): what is asked, ended, pending, settled. Here
        # the asyncio side of it: the asks waiting for their grant, by ticket; the jobs, by download (they
        # outlive a session: a short absence of the master costs none of them); the flush arranged.
        self.ledger = DownloadLedger(cfg.pending_downloads,
                                     fingerprint_of=self.fingerprints.cached if self.fingerprints else None)
        self._grants: dict[int, asyncio.Future[p.Grant | None]] = {}   # None: its session ended, ask again
        self._jobs: dict[Key, asyncio.Task[None]] = {}
        # The downloads whose outcomes a page's result carries, by the task's lease, until its report is sent.
        self._carried: dict[int, set[Key]] = {}
        self._flush_timer: asyncio.Handle | None = None
        self._session: Session | None = None    # the connection to the master, while one is up
        self._session_up = asyncio.Event()
        self._tg: asyncio.TaskGroup   # serve()'s, which the download jobs belong to
        # Chained tasks (protocol.Task.after): how recent page requests ended (lease -> the next may start),
        # and the tasks waiting for a request still out.
        self._ended: OrderedDict[int, bool] = OrderedDict()
        self._waiting: dict[int, asyncio.Future[bool]] = {}
        self._running: set[int] = set()
        self.fault: str | None = None       # why this node's storage cannot take work now (see faults.py)
        # Why tasks were last handed back for want of a proxy (sent in the Fault that hands them back).
        self._handed_back: str | None = None
        self.refusal: MasterRefused | None = None  # the master's final answer, for the CLI's exit status
        self._was_connected = False

    def stop(self) -> None:
        self._stop.set()

    def proxy_counts(self) -> tuple[p.ProxyCount, ...]:
        return tuple(p.ProxyCount(c.label[:it.MAX_NAME], min(c.requests, it.INT64_MAX), min(c.failures, it.INT64_MAX))
                     for c in self.egress.snapshot())[:p.MAX_PROXY_COUNTS]

    def _set_route(self) -> None:
        """The egress's route: None when no proxy can apply to any request (this node's own ``proxies`` key is
        empty, or absent and neither the crawl nor any site names one)."""
        own = self.cfg.proxies
        if own is not None:
            self.egress.route = self.route if own else None
        elif self.crawl_proxies or any(s.proxies for s in self.sites.policies):
            self.egress.route = self.route
        else:
            self.egress.route = None

    def route(self, host: str, port: int) -> tuple[Proxy, ...]:
        """The proxies a request to host:port may leave through (): direct): this node's own ``proxies`` key
        wins, else the site's (when it names any, () meaning direct), else the crawl's."""
        own = self.cfg.proxies
        if own is not None:
            return own
        site = self.sites.lookup(host, port)
        if site is not None and site.proxies is not None:
            return site.proxies
        return self.crawl_proxies

    # ------------------------------------------------------------------ lifecycle
    async def serve(self) -> int:
        """Runs until the master says the crawl is over or stop() is called (returns 0), or the master refuses
        this worker for good (returns 2; the reason is in self.refusal)."""
        cfg = self.cfg
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        self._open_archive()
        # Pages and API answers: bodies bounded by the page cap (cut for pages, refused for API answers), a total
        # deadline per exchange. Both clients reach only public addresses and those the master's Welcome names.
        self.http = build_stack(max_connections=cfg.concurrency * 2, dns_ttl=cfg.dns_ttl,
                                max_body=cfg.max_page_bytes, total_timeout=cfg.fetch_timeout, policy=self.targets,
                                user_agent=cfg.user_agent, connect_timeout=cfg.connect_timeout,
                                read_timeout=cfg.read_timeout, max_redirects=cfg.max_redirects,
                                archive=self.archive, egress=self.egress)
        # Requests to a site with a session wait for its login and carry its cookies, on both paths (sessions.py).
        self.sessions.install(self.http.client)
        page_http = SessionGetter(self.http, self.sessions)
        self.fetcher = PageFetcher(page_http)
        # The sites' own request headers (siterules.py), one object every request path holds: set at each Welcome.
        self.site_rules = SiteRules()
        self.fetcher.sites = self.site_rules
        # Downloads: the downloader holds the size cap and a deadline that grows with the size.
        self.dl_http = build_stack(max_connections=cfg.downloads * 2, dns_ttl=cfg.dns_ttl,
                                   max_body=cfg.max_audio_bytes + 1, policy=self.targets,
                                   user_agent=cfg.user_agent, connect_timeout=cfg.connect_timeout,
                                   read_timeout=cfg.read_timeout, max_redirects=cfg.max_redirects,
                                   archive=self.archive, egress=self.egress)
        self.sessions.install(self.dl_http.client)
        self.ctx = ResolveContext(http=page_http, user_agent=cfg.user_agent, fetch_page=self._fetch_other_page,
                                  targets=self.targets, archive=self.archive,
                                  site_user_agent=self.site_rules.user_agent)
        # The downloader holds the download limits itself (overall and per host), so a queue for one busy CDN
        # never blocks downloads from other hosts: one host takes at most downloads_per_host. It reads each file's
        # own tags too, from memory when it can.
        self.downloader = Downloader(SessionGetter(self.dl_http, self.sessions), cfg.data_dir,
                                     cfg.download_config(),
                                     file_tags=True, archive=self.archive,
                                     audio_payload=getattr(getattr(cfg, "archive", None), "audio_payload", False))
        self.downloader.sites = self.site_rules
        self.page_sem = asyncio.Semaphore(cfg.concurrency)
        self.dl_slots = asyncio.Semaphore(2 * cfg.downloads)   # asks and downloads under way here (_download)
        metrics_runner = None
        if cfg.metrics_listen is not None:
            try:
                metrics_runner, self.metrics_addr = await serve_metrics(self.metrics, *cfg.metrics_listen)
            except OSError as e:   # a taken port is a mistake in that key, not a crash
                host, port = cfg.metrics_listen
                reason = os.strerror(e.errno) if e.errno else str(e)   # asyncio's strerror repeats the address
                raise ConfigError("metrics_listen", f"cannot listen on {host}:{port}: {reason}") from None
            (cfg.data_dir / "metrics.addr").write_text(f"{self.metrics_addr}\n")
            log.info("worker %s metrics on http://%s/metrics", cfg.id, self.metrics_addr)
        if self.fingerprints is not None and cfg.download_audio:
            # Started now, not at the first file (its process takes a while to start); a worker that downloads
            # nothing of its own has it start at the first file it stores (a download the master hands it).
            self.fingerprints.start()
        sdnotify.ready(f"worker {cfg.id} started")
        # What start-up built (modules, clients, resolvers) lives as long as the process: out of the collector's
        # sight, so a full collection scans only what the crawl allocates (one held the loop 50-70 ms).
        gc.freeze()
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                background = [tg.create_task(self.metrics.lag.run()), tg.create_task(self._progress()),
                              tg.create_task(self._keepalive())]
                try:
                    return await self._run()
                finally:
                    for t in background:
                        t.cancel()
                    # Downloads still pending stop here; their partial files resume when the master hands
                    # them to this node again, or another node takes them over.
                    for job in list(self._jobs.values()):
                        job.cancel()
        finally:
            if metrics_runner is not None:
                await metrics_runner.cleanup()
            if self.fingerprints is not None:
                self.fingerprints.close()
            for resolver in self.resolvers:
                await resolver.aclose()
            try:
                self.pages.close()
            except OSError as e:   # the last index lines on a full disk: those pages are fetched again elsewhere
                log.warning("page index not flushed: %s", describe(e))
            if self.archive_writer is not None:
                try:
                    self.archive_writer.close()
                except OSError as e:
                    log.warning("archive not closed: %s", describe(e))
            await self.http.aclose()
            await self.dl_http.aclose()
            if self._was_connected:
                log.info("worker %s stopped: %d pages, %d errors, %d audio items; downloads: %s; pages refused: %s",
                         cfg.id, self.stats.pages, self.stats.errors, self.stats.audio, self.downloader.stats,
                         ", ".join(f"{k} {v}" for k, v in sorted(self.stats.refused.items())) or "none")

    def _open_archive(self) -> None:
        """Every exchange this node makes, as WARC records in data_dir/archive (crawler/archive/), and the page
        store. With archiving off, WARC pages still go there (the page store's format), alone."""
        cfg = self.cfg
        writer = None
        if cfg.archive.enabled or (cfg.store_pages and cfg.page_format == "warc"):
            writer = ArchiveWriter.from_config(cfg.archive, cfg.data_dir / "archive", "worker")
        self.archive_writer = writer
        self.archive: Archive = writer if writer is not None and cfg.archive.enabled else NO_ARCHIVE
        self.pages = open_page_store(cfg.data_dir, cfg.page_format, archive=writer)

    async def _progress(self) -> None:
        interval = self.cfg.log_interval
        before = WorkerStats(**vars(self.stats))
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(interval)
            log.info("%s", progress_line(time.monotonic() - t0, self.stats, before))
            before = WorkerStats(**vars(self.stats))

    async def _keepalive(self) -> None:
        # The watchdog is told the loop still turns; whether the master is reachable is not its business.
        while True:
            sdnotify.watchdog()
            await asyncio.sleep(1.0)

    async def _run(self) -> int:
        delay = 0.2
        host, port = self.cfg.master
        while not self._stop.is_set():
            conn = None
            try:
                reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
                hs = p.WorkerHandshake(self.cfg.secret, self.cfg.id, self.cfg.max_tasks,
                                       keep_fragment=self._fragment_rules)
                # The send limit is lowered by the Welcome; until the master proved the secret, reads are small.
                conn = FramedConnection(reader, writer, p.DEFAULT_MAX_FRAME, recv_limit=hs.recv_limit)
                welcome = await asyncio.wait_for(self._handshake(conn, hs), 10)
                conn.recv_limit = hs.recv_limit
                delay = 0.2
                self._was_connected = True
                log.info("worker %s connected to master %s:%d", self.cfg.id, host, port)
                if await self._serve_session(conn, hs, welcome):
                    return 0
            except MasterRefused as e:
                if e.code == p.DUPLICATE_ID and self._was_connected:
                    # Our own previous connection, not yet noticed gone by the master: it will be soon.
                    log.info("master still holds this worker's previous connection; trying again")
                else:
                    self.refusal = e
                    log.error("worker %s cannot join master %s:%d: %s", self.cfg.id, host, port, e)
                    return 2
            except (TimeoutError, OSError) as e:   # OSError: the connect; ConnectionClosed is one too
                log.info("master %s:%d not reachable: %s", host, port, str(e) or type(e).__name__)
            except p.ProtocolError as e:
                log.warning("master broke the protocol: %s", e)
            finally:
                if conn is not None:
                    await conn.close()
            if self._stop.is_set():
                break
            wait = delay * (0.5 + random.random())
            delay = min(delay * 2, self.cfg.reconnect_max_delay)
            try:
                await asyncio.wait_for(self._stop.wait(), wait)
            except TimeoutError:
                pass
        return 0

    async def _handshake(self, conn: FramedConnection, hs: p.WorkerHandshake) -> p.Welcome:
        """This worker proves the secret first; the master's Welcome carries its own proof (see protocol.py)."""
        try:
            await conn.send(hs.hello())
            await conn.send(hs.receive_challenge(await conn.recv()))
            welcome = hs.receive_welcome(await conn.recv())
            conn.start_session(hs.session_keys())
            return welcome
        except p.PeerRefused as e:
            raise MasterRefused(e.reason, e.code) from None

    async def _serve_session(self, conn: FramedConnection, hs: p.WorkerHandshake, welcome: p.Welcome) -> bool:
        """Serve one connection. True when the master ended the crawl."""
        self._normalise_as(welcome)
        self.links.forget()
        self.crawl_proxies = parse_wire(welcome.proxies)
        self.sites = sites_from_wire(welcome.sites)
        # A page's links may lead to a site with a deeper limit than the crawl's: they are extracted up to the
        # deepest limit, and the master holds each link to its own site's.
        self.depths = DepthLimits(welcome.max_depth, self.sites)
        self.site_rules.set_table(self.sites)
        for client in (self.http.client, self.dl_http.client):   # API calls, playlists, HLS/DASH segments
            siterules.install(client, self.site_rules)
        self.max_depth = self.depths.ceiling
        self.sessions.update(self.sites)
        self._set_route()
        self._allow_targets(welcome)
        conn.max_frame = min(conn.max_frame, welcome.max_frame)
        session = Session(self, conn, hs, welcome)
        await session.open()
        self._session = session
        self._session_up.set()
        self._arrange(self.ledger.connect(_now()))   # downloads that ended while the master was away
        try:
            return await session.run()
        finally:
            self._session = None
            self._session_up.clear()
            self._carried.clear()     # their reports are lost with the session: the ledger lets them go
            self.ledger.disconnect()
            if self._flush_timer is not None:
                self._flush_timer.cancel()
                self._flush_timer = None
            # Asks this session will never answer: their downloads ask the next one.
            for waiter in self._grants.values():
                if not waiter.done():
                    waiter.set_result(None)

    def _granted(self, grants: Iterable[p.Grant]) -> None:
        """The master's answers to asks (_grant): each wakes the download that waits for it."""
        for g in grants:
            waiter = self._grants.pop(g.ticket, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(g)

    def _allow_targets(self, welcome: p.Welcome) -> None:
        origins, networks = [], []
        for entry in welcome.allowed_origins:
            host, _, port = entry.rpartition(":")
            if host and port.isdigit():
                origins.append((host.strip("[]"), int(port)))
        for entry in welcome.allowed_networks:
            try:
                networks.append(parse_network(entry))
            except ValueError:
                log.warning("master named an allowed network that is none: %r", entry[:100])
        self.targets.allow(origins, networks)

    def _page_fetched(self, lease: int, status: int | None, retry_after: str | None, latency: float) -> bool:
        """Tell the master at once that a page request ended (see protocol.Fetched), in one frame per loop turn,
        and release the task chained after it, if any (then True: the caller should let it start first)."""
        woke = self._request_ended(lease, status not in THROTTLE_STATUSES)
        if self._session is not None:
            wait = parse_retry_after(retry_after, time.time()) if status in THROTTLE_STATUSES else None
            self._session.page_fetched(p.PageFetch(lease, status, wait, latency))
        return woke

    def _request_ended(self, lease: int, go: bool) -> bool:
        if lease in self._ended:
            return False
        self._ended[lease] = go
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        waiter = self._waiting.pop(lease, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(go)
            return True
        return False

    async def _wait_for(self, lease: int) -> bool:
        """Wait until the page request of an earlier task ends; False when its host answered 429/503."""
        go = self._ended.get(lease)
        if go is not None:
            return go
        if lease not in self._running:
            return True   # not here (a restarted worker): the master counts its slot as ours already
        waiter = self._waiting.get(lease)
        if waiter is None:
            waiter = self._waiting[lease] = asyncio.get_running_loop().create_future()
        return await asyncio.shield(waiter)

    # ------------------------------------------------------------------ one task
    def _enter_fault(self, reason: str) -> None:
        if self.fault is None:
            self.fault = reason
            log.error("worker %s stops taking tasks and hands them back: %s (data dir %s)", self.cfg.id, reason,
                      self.cfg.data_dir)

    async def _run_task(self, task: p.Task, results: asyncio.Queue[Outcome]) -> None:
        self._running.add(task.lease)    # renewed by the heartbeats until its report is queued
        try:
            result = await self._result_of(task)
            if result is None:
                results.put_nowait(task.lease)    # handed back after a local fault
                return
            if isinstance(result, SiteBack):
                results.put_nowait(result)        # handed back: its site waits for its login
                return
            self._count(result)     # before its downloads' outcomes join it: those count as they end
            result = await self._with_outcomes(result)
        finally:
            self._running.discard(task.lease)
        fitted = _within_limits(result)
        if fitted is not result and result.audio:
            # Items dropped to fit the wire are not pending at the master: their outcomes need not wait.
            self._page_reported(_pending_keys([result]) - _pending_keys([fitted]))
        result = fitted
        if result.status == p.DONE:
            self.stats.pages += 1
        else:
            self.stats.errors += 1
        if self._debug:   # one line a page for an operator who asks for it (--log-level debug)
            log.debug("%s %s %s%s", result.status, result.http_status or "-", task.url,
                      f" ({result.error})" if result.error else "")
        results.put_nowait(result)

    async def _result_of(self, task: p.Task) -> p.Result | SiteBack | None:
        """The task's result; None after a local fault, a SiteBack when its site cannot be logged into (either
        way the task goes back to the master, no attempt counted)."""
        self.stats.in_flight += 1
        try:
            return await self.process(task)
        except LocalFault as e:
            self._enter_fault(str(e))
            return None
        except SessionUnavailable as e:   # the site's URLs wait for its login: handed back, no attempt counted
            return SiteBack(task.lease, e.site, e.reason, max(0.0, e.retry_at - time.monotonic()))
        except ProxiesUnavailable as e:   # no proxy could carry it: this node's fault, not the URL's
            self._handed_back = str(e)[:200]
            log.warning("handing back %s: %s", task.url, e)
            # Not at once: handed back now, the task could come straight back while every proxy is still out.
            await asyncio.sleep(PROXY_WAIT)
            return None
        except Exception as e:   # a bug must cost one task, not the worker
            log.exception("task %s failed unexpectedly", task.url)
            return p.Result(task.lease, task.url, p.RETRY, error=f"worker error: {type(e).__name__}: {e}")
        finally:
            self.stats.in_flight -= 1
            self._request_ended(task.lease, True)   # no page request (a resolver's own), or it failed early

    async def _with_outcomes(self, result: p.Result) -> p.Result:
        """The page's result with the outcomes of its downloads that ended within cfg.report_wait in place of
        their pending items. An item reported with its outcome is recorded by the master once, as it stands;
        a pending one takes a row kept until its outcome comes apart (DownloadReport), which costs the master
        several times as much. The page's lease stays renewed meanwhile, and the wait holds the task's credit,
        not a page fetch slot: a worker whose downloads fall behind takes new pages only as fast as they end."""
        keys = _pending_keys([result])
        if not keys or self.cfg.report_wait <= 0:
            return result
        jobs = [job for key in keys if (job := self._jobs.get(key)) is not None]
        if jobs:
            await asyncio.wait(jobs, timeout=self.cfg.report_wait)
        ended = self.ledger.outcomes_of(keys)
        if not ended:
            return result
        self._carried[result.lease] = set(ended)
        audio = tuple(ended.get((a.page, a.url), a) if a.status == it.PENDING else a for a in result.audio)
        return msgspec.structs.replace(result, audio=audio)

    def _count(self, result: p.Result) -> None:
        m = self.metrics
        m.count_page(result.status, result.size)
        if result.size:
            self.stats.bytes += result.size
        for a in result.audio:
            if a.status == it.PENDING:
                continue   # counted when its download ends (_ended_download)
            m.count_audio(a.status)
            if a.sha256 and a.size and "stored_on" not in a.extra:
                m.audio_bytes.inc(a.size)
                self.stats.bytes += a.size

    async def process(self, task: p.Task) -> p.Result:
        url = task.url
        if task.after is not None and not await self._wait_for(task.after):
            # The request this one was chained after was answered 429/503: the host is paused for everyone.
            return p.Result(task.lease, url, p.RETRY, 429, error="not started: the host asked to slow down")
        # At the crawl's depth limit the page's links would only be dropped by the master: not even extracted.
        # Its audio references (a playlist, a stream) are still reported: resolving its audio is part of the page.
        # Past the limit a task is itself such a reference: what it names in turn is one too.
        where = page_plan.depth(task.depth, self.max_depth)
        if self.depths.per_site:   # past its own site's limit a task is a reference, whatever the deepest is
            where = page_plan.Depth(where.follow, page_plan.depth(task.depth, self.depths.limit(url)).beyond)
        follow, beyond = where.follow, where.beyond
        refs: list[str] = []
        resolver = pick(self.resolvers, url)
        page: FetchedPage | None = None
        links: list[str] = []
        cut = 0   # links not followed at the depth limit, for the master's discard figures
        if self.fault is not None:
            raise LocalFault(self.fault)
        if resolver.needs_page(url):
            if (site := self.sessions.of(url)) is not None:
                await site.ready()     # a login, or a hold before a hand-back, takes no page slot
            async with self.page_sem:
                if self.fault is not None:   # it came while this task waited its turn
                    raise LocalFault(self.fault)
                started = time.monotonic()
                try:
                    # A page whose audio this worker does not know is fetched in full: its audio is then both
                    # listed and revalidated (a 304 would leave it unlooked at).
                    known = self.page_audio.known(url, task.validators) is not None
                    page, truncated = await self._fetch_page(url, max_bytes=self.cfg.max_page_bytes,
                                                             referrer=task.parent,
                                                             validators=task.validators if known else None)
                except FetchError as e:
                    if e.reason:
                        self.stats.refused[e.reason] += 1
                    self._page_fetched(task.lease, None, None, time.monotonic() - started)
                    return p.Result(task.lease, url, p.RETRY if e.transient else p.ERROR, error=str(e))
                finally:
                    self.metrics.fetch_seconds.observe(time.monotonic() - started)
                if self._page_fetched(task.lease, page.status, page.headers.get("retry-after"),
                                      time.monotonic() - started):
                    await asyncio.sleep(0)   # the chained request goes out before this page is parsed
            page.link_meta = task.link_meta   # what the linking page said: names audio found here
            answer = page_plan.Answer(page.status, page.final_url, page.headers.get("location", "").strip(),
                                      page.is_html())
            action = page_plan.decide(answer, where)
            if isinstance(action, page_plan.Check):
                refused = await self._too_complex(page.body)
                action = page_plan.decide(page_plan.checked(answer, refused), where)
                if refused and isinstance(action, page_plan.Report):
                    self.stats.refused[refused.split(":", 1)[0]] += 1
            # Every page fetch is archived; the HTML pages parsed are the stored ones (pages/index.tsv).
            self._keep_page(url, page, self.cfg.store_pages and isinstance(action, page_plan.Parse)
                            and page.is_html())
            if isinstance(action, page_plan.Unchanged):
                # Its audio, as its last full answer listed it, goes through the downloader again: revalidated
                # once revalidate_after has passed, and a change at its address found (revisit.py).
                again = self._revalidate(self.page_audio.known(url, task.validators) or ())
                return p.Result(task.lease, url, p.DONE, 304, page.final_url, page.content_type, 0, audio=again,
                                validators=(_header_value(page.headers.get("etag")),
                                            _header_value(page.headers.get("last-modified")), None))
            if isinstance(action, page_plan.Report):
                return p.Result(task.lease, url, action.status, page.status, page.final_url, page.content_type,
                                len(page.body), action.error)
            if isinstance(action, page_plan.Redirect):
                # The target is the same resource, at the same depth (the master queues it there).
                target = [action.target] if action.target else []
                links = self._links_to_report([] if action.ref else target, [], task.depth)
                refs = self._links_to_report(target if action.ref else [], [], task.depth)
                return p.Result(task.lease, url, p.DONE, page.status, page.final_url, page.content_type,
                                len(page.body), action.error, tuple(links), refs=tuple(refs))
            if len(page.body) > html.PARSE_INLINE_BYTES and page.is_html():
                await asyncio.to_thread(page.tree)     # the parse releases the GIL: the loop goes on
            tree = page.tree()
            if tree is not None:
                if follow:
                    # At most max_links_per_page are reported; a few times that many elements leave room for
                    # the navigation the link cache filters out, and bound the work on a page of 100,000 links.
                    links = extract_links(tree, page.final_url, 4 * self.cfg.max_links_per_page, source=page.text())
                else:
                    cut = count_links(tree)
                    if not beyond:
                        # Named audio is the resolver's (an item, not a link); streams named like pages are
                        # followed as references.
                        refs = [u for u in audio_candidates(tree, page.final_url, 4 * self.cfg.max_links_per_page)
                                if not is_audio_url(u)]
                        cut = max(0, cut - len(refs))
        try:
            resolution, error = await self._resolve(resolver, url, page)
            for later in followers(self.resolvers, resolver, url, page, resolution):
                more, more_error = await self._resolve(later, url, page)
                resolution, error = _merged(resolution, more), error or more_error
        except ResolverUnavailable as e:   # this node's fault, not the page's: the master leases it again
            log.warning("%s: %s", url, e)
            return p.Result(task.lease, url, p.RETRY, error=f"resolver unavailable: {e}")
        items = list(resolution.items) if resolution else []
        if page is not None and 200 <= page.status < 300 and error is None:
            self.page_audio.remember(url, (_header_value(page.headers.get("etag")),
                                           _header_value(page.headers.get("last-modified"))), items)
        else:
            self.page_audio.forget(url)
        if resolution and resolution.links:
            if follow:
                links.extend(resolution.links)
            else:
                found = [u for u in resolution.links if beyond or is_playlist_url(u)]
                refs.extend(found)
                cut += len(resolution.links) - len(found)
        # What the crawl takes from the page, before the link cache holds back what it reported already.
        digest = content_digest(links, refs, items)
        links = self._links_to_report(links, items, task.depth + 1)
        if refs:
            refs = self._links_to_report(refs, items, task.depth + 1)
        lastmod = self._lastmod_of(resolution.lastmod) if follow and resolution and resolution.lastmod else ()
        named = self._link_meta_of(resolution.link_meta, links, refs) if resolution and resolution.link_meta else ()
        if items and self.cfg.download_audio:
            # Reported now as pending; each download reports its own outcome (see _download_job). Audio that
            # answered this very fetch resumes from the bytes read here, not from its first byte again.
            start = _started(page)
            items = [self._start_download(i, resolver, start if start and i.url == start.url else None)
                     if i.status == it.OK and i.url else i for i in items]
        self.stats.audio += len(items)
        return p.Result(task.lease, url, p.DONE, page.status if page else None, page.final_url if page else None,
                        page.content_type if page else None, len(page.body) if page else None, error,
                        tuple(links), tuple(items), cut, lastmod, _validators(page, digest), tuple(refs), named)

    def _link_meta_of(self, named: dict[str, it.LinkMeta], *reported: list[str]
                      ) -> tuple[tuple[str, it.LinkMeta], ...]:
        """What the page says about the links reported (under their normalised URLs, as reported): each goes
        with its link to the master, and from there with the link's task, so a link that turns out to be audio
        or a playlist needs no second fetch of this page. Links held back by the link cache were reported
        before, with their names."""
        wanted = {u for links in reported for u in links}
        raw = [u for u in named if len(u) <= MAX_LINK_LENGTH]
        return tuple((key, named[u]) for u, key in zip(raw, normalize_many(raw, self.norm))
                     if key and key in wanted)

    async def _too_complex(self, body: bytes) -> str | None:
        """Why a page must not be parsed (a permanent error of its URL), or None. Never long on the loop."""
        cfg = self.cfg
        refused, scan = html.precheck(body, max_tags=cfg.max_page_tags, max_depth=cfg.max_page_depth)
        if scan:
            if len(body) <= html.SCAN_INLINE_BYTES:
                refused = html.too_deep(body, cfg.max_page_depth)
            else:
                refused = await asyncio.to_thread(html.too_deep, body, cfg.max_page_depth)
        return refused

    async def _resolve(self, resolver: Resolver, url: str,
                       page: FetchedPage | None) -> tuple[Resolution | None, str | None]:
        try:
            # The resolver's API calls are exchanges of this page's chain (crawler/http/recording.py).
            with recorded_as("api", url), exits_used() as used:
                resolution = await resolver.resolve(url, page, self.ctx)
            if used and resolution.items:
                # The addresses go out where they were resolved (a signed address may be bound to its exit).
                resolution.items = [_pinned_to(a, used[-1].label) for a in resolution.items]
            return resolution, None
        except (ResolverUnavailable, SessionUnavailable, ProxiesUnavailable):
            raise
        except Exception as e:
            log.exception("resolver %s failed on %s", resolver.name, url)
            return None, f"resolver {resolver.name}: {type(e).__name__}"

    def _lastmod_of(self, lastmod: dict[str, float]) -> tuple[tuple[str, float], ...]:
        """Sitemap dates under the normalised URLs the master knows. All of them, not only those of the links
        reported this time: a sitemap read again lists links the link cache holds back, and their new dates
        are what tells the master a page changed."""
        raw = [u for u in lastmod if len(u) <= MAX_LINK_LENGTH]
        return tuple((u, lastmod[r]) for r, u in zip(raw, normalize_many(raw, self.norm)) if u)

    async def _fetch_other_page(self, url: str) -> FetchedPage | None:
        """A page a resolver needs besides its task's own, within the same limits as any page fetch."""
        async with self.page_sem:
            page, _ = await self._fetch_page(url, max_bytes=self.cfg.max_page_bytes)
        try:
            self._keep_page(url, page, False)
        except LocalFault:
            pass    # a full disk: the task's own page meets it too, and the worker's fault is entered there
        return page

    async def _fetch_page(self, url: str, *, max_bytes: int, referrer: str | None = None,
                          validators: tuple[str | None, str | None] | None = None) -> tuple[FetchedPage, bool]:
        """A page GET (fetcher.py). For a site with a login its answer is judged (sessions.py; 401/403 and a
        redirect to the login form on the way, in SessionGetter, the success text here): a page that shows the
        session gone is fetched again once the site is logged into again, in the same task (no attempt
        counted). SessionUnavailable when the site cannot be logged into."""
        site = self.sessions.of(url)
        if site is None:
            return await self.fetcher.fetch(url, max_bytes=max_bytes, referrer=referrer, validators=validators)
        generation = await site.ready()
        page, cut = await self.fetcher.fetch(url, max_bytes=max_bytes, referrer=referrer, validators=validators)
        if site.machine.judge_body(url, generation, page.status, page.body) is Verdict.EXPIRED:
            log.info("site %s: %s no longer shows the session: logging in again", site.policy.pattern, url)
            generation = await site.renew(generation)
            page, cut = await self.fetcher.fetch(url, max_bytes=max_bytes, referrer=referrer,
                                                 validators=validators)
            site.machine.judge_body(url, generation, page.status, page.body, again=True)
        return page, cut

    def _keep_page(self, url: str, page: FetchedPage, store: bool) -> None:
        """A fetched page into the archive (as a request and a response record) and, when ``store``, into the
        page store (which archives it as it stores it)."""
        try:
            if store:
                self.pages.save(url, page.final_url, page.status, page.content_type, page.body, page.raw_headers,
                                page.cut, sent=page.sent, started=page.started)
            elif self.archive is not NO_ARCHIVE:
                self.archive.exchange(page_exchange(page.final_url, page.status, page.body, page.raw_headers,
                                                    page.cut, page.sent, page.started))
        except OSError as e:
            if is_local(e):
                raise LocalFault(describe(e)) from None
            raise

    def _normalise_as(self, welcome: p.Welcome) -> None:
        """Links are normalised once, on the worker, with the crawl's own options (the master sends them): the
        keys the master deduplicates by, so a report holds one spelling of each URL (its utm_* variants too)."""
        # The crawl's fragment rules hold this worker's own: its Auth told the master, which took them in.
        self.norm = NormalizeOptions(sort_query=welcome.sort_query, drop_params=frozenset(welcome.drop_params),
                                     keep_fragment=welcome.keep_fragment)

    def _links_to_report(self, links: list[str], items: list[it.AudioItem], depth: int) -> list[str]:
        # The link cache goes first, on the links as found: the site's navigation, the bulk of every page,
        # then costs one dict lookup a link instead of normalisation and the audio check. It lets a link
        # through again when found at a smaller depth than before (a shorter path the master must hear of).
        fresh = self.links.fresh(links, depth)
        if not fresh:
            return []
        audio = {i.url for i in items}
        generic = self.resolvers[-1]
        normed = dict.fromkeys(u for u in normalize_many([u for u in fresh if len(u) <= MAX_LINK_LENGTH], self.norm)
                               if u and u not in audio and not generic.audio_link(u))
        return list(normed)[: self.cfg.max_links_per_page]

    def _arrange(self, at: float | None) -> None:
        """Have what the ledger holds for the master go out by `at` (the loop's time, None: a flush is arranged
        already): at the end of this loop turn when it is due, else on a timer."""
        if at is None:
            return
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        loop = asyncio.get_running_loop()
        self._flush_timer = loop.call_soon(self._flush) if at <= loop.time() else loop.call_at(at, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        out = self.ledger.flush()
        if not (out.ends or out.asks or out.outcomes):
            return
        if self._session is not None:
            self._session.send_downloads(out)
        else:
            self.ledger.unsent(out.outcomes)

    async def _grant(self, url: str) -> tuple[int | None, p.Grant]:
        """The master's leave to download url (its host has a free slot), or the place of the copy another node
        already has. The asks of one loop turn share a frame. While the master is away the ask waits for it
        (and is made again: the session that did not answer is gone). Without a master (a task run on its own)
        the answer is yes at once."""
        while True:
            if not self.ledger.connected:
                if not self._was_connected:
                    return None, p.Grant(0, p.GRANT_GO)
                await self._session_up.wait()
                continue
            ticket, at = self.ledger.ask(url, _now())
            waiter = self._grants[ticket] = asyncio.get_running_loop().create_future()
            self._arrange(at)
            try:
                grant = await waiter
            finally:
                self._grants.pop(ticket, None)
            if grant is not None:
                return ticket, grant

    def _download_ended(self, ticket: int | None, done: it.AudioItem | None) -> None:
        self._arrange(self.ledger.end(ticket, done, _now()))

    # ------------------------------------------------------------------ downloads, apart from their pages
    def _start_download(self, item: it.AudioItem, resolver: Resolver, start: Started | None = None) -> it.AudioItem:
        """Start item's download as a job of this worker's own; returns the item as its page reports it.
        start: the file's first bytes, when the page fetch was the file (held until the download starts: at most
        fetcher.SNIFF_BYTES for each of cfg.pending_downloads)."""
        reported, fresh = self.ledger.start(item)
        if fresh:
            key = (item.page, item.url)
            self._jobs[key] = self._tg.create_task(self._download_job(key, item, resolver, start))
        return reported

    def _revalidate(self, items: Iterable[it.AudioItem]) -> tuple[it.AudioItem, ...]:
        """A page answered 304: the audio its last full answer listed, its downloads started again (the
        downloader asks nothing while revalidate_after has not passed), as the page's report lists it."""
        if not self.cfg.download_audio:
            return tuple(items)
        generic = self.resolvers[-1]
        return tuple(self._start_download(i, generic) if i.status == it.OK and i.url else i for i in items)

    def _take_download(self, item: it.AudioItem) -> None:
        """Download-only work from the master (protocol.DownloadWork): another node's pending download, or one
        of this node's own sent again after it rejoined (a job still running, or ended already, is not
        started twice)."""
        fresh, at = self.ledger.take(item, _now())
        self._arrange(at)
        if not fresh:
            return
        key = (item.page, item.url)
        resolver = next((r for r in self.resolvers if r.name == item.resolver), self.resolvers[-1])
        self._jobs[key] = self._tg.create_task(self._download_job(key, item.replace(status=it.OK), resolver))

    async def _download_job(self, key: Key, item: it.AudioItem, resolver: Resolver,
                            start: Started | None = None) -> None:
        done: it.AudioItem | None = None
        try:
            got: it.AudioItem | None = None
            while got is None:
                try:
                    with pinned(item.identity.exit if item.identity is not None else None):
                        got = await self._download(item, resolver, start)
                except SessionUnavailable as e:
                    # The site's login fails: the download waits for its next attempt and resumes then.
                    await asyncio.sleep(max(1.0, e.retry_at - time.monotonic()))
                except ProxiesUnavailable as e:
                    # No proxy can carry it now: the download waits for one (a proxy's backoff) and resumes.
                    log.warning("download of %s waits for a proxy: %s", item.url, e)
                    await asyncio.sleep(PROXY_WAIT)
                except OSError as e:
                    if not is_local(e):
                        raise
                    # This node's disk, not the file: the download waits for the disk (no credit is granted
                    # meanwhile) and resumes from its partial file.
                    self._enter_fault(describe(e))
                    while self.fault is not None:
                        await asyncio.sleep(DISK_CHECK_INTERVAL)
            done = await self._fingerprinted(key, got)
        except Exception as e:   # a bug must cost one download, not the worker
            log.exception("download of %s failed unexpectedly", item.url)
            done = item.replace(status=it.FAILED, reason=f"worker error: {type(e).__name__}: {e}"[:500])
        finally:
            self._jobs.pop(key, None)
            if done is None:   # cancelled: the worker stops
                self.ledger.dropped(key)
        self._ended_download(key, done)

    async def _fingerprinted(self, key: Key, done: it.AudioItem) -> it.AudioItem:
        """The outcome with its stored file's fingerprint, when the pool makes it within identify.wait (and
        starts on it at once: behind a backlog the outcome does not wait). A fingerprint made later follows
        the outcome (_late_fingerprint). A copy on another node, a failure, a file skipped: as it is."""
        if done.fingerprint is not None:    # one the item came with is not this file's: the pool's own, or none
            done = done.replace(fingerprint=None)
        pool = self.fingerprints
        if pool is None or done.status != it.OK or not done.path or not done.sha256 or "stored_on" in done.extra:
            return done
        try:
            wait = 0.0 if pool.busy() else self.cfg.identify.wait
            # A file its own tags say is too short to match is decided here, without the pool (fingerprints.py).
            job = pool.submit(done.sha256, self.cfg.data_dir / done.path, seconds=file_seconds(done),
                              size=done.size)
        except Exception:   # a bug here must cost the fingerprint, never the download
            log.exception("fingerprint of %s not made", done.path)
            return done
        if job is None:
            return done
        if not job.done() and wait > 0:
            await asyncio.wait([job], timeout=wait)
        if not job.done():
            job.add_done_callback(lambda j: self._late_fingerprint(key, done, j))
            return done
        fp = job.result()
        return done.replace(fingerprint=fp) if fp else done

    def _late_fingerprint(self, key: Key, done: it.AudioItem, job: asyncio.Future[bytes | None]) -> None:
        """A fingerprint made after its outcome went (or was held for its page's report): the outcome again,
        with it."""
        fp = None if job.cancelled() else job.result()
        if fp:
            self._arrange(self.ledger.refined(key, done.replace(fingerprint=fp), _now()))

    def _ended_download(self, key: Key, done: it.AudioItem) -> None:
        done, at = self.ledger.ended(key, done, _now())
        self.metrics.count_audio(done.status)
        if done.sha256 and done.size and "stored_on" not in done.extra:
            self.metrics.audio_bytes.inc(done.size)
            self.stats.bytes += done.size
        self._arrange(at)
        if self._session is not None:
            self._session.room()

    def _page_reported(self, keys: set[Key]) -> None:
        """The reports naming these downloads as pending were sent: their outcomes may follow."""
        self._arrange(self.ledger.reported(keys, _now()))

    async def _download(self, item: it.AudioItem, resolver: Resolver, start: Started | None = None) -> it.AudioItem:
        async def reresolve(item: it.AudioItem) -> it.AudioItem | None:
            with recorded_as("api", item.page):
                return await resolver.reresolve(item, self.ctx)

        # A job asks the master only once it holds one of this worker's ask slots (twice its downloads): a grant
        # is a slot of the audio host for the whole cluster, and a worker holding many it cannot use yet would
        # starve the others; a few more asks than downloads keep one slow host's line from idling the worker.
        # The ask slot is given up once the file's bytes are in: storing it needs no slot of the host's.
        await self.dl_slots.acquire()
        held = True

        def transferred() -> None:
            nonlocal held
            if held:
                held = False
                self.dl_slots.release()

        go = False
        ticket: int | None = None
        done: it.AudioItem | None = None
        try:
            # The master paces downloads per audio host over all workers, and knows which addresses a node
            # already has: then only the place is recorded.
            ticket, grant = await self._grant(item.url)
            if grant.verdict == p.GRANT_COPY:
                return item.replace(sha256=grant.sha256, size=grant.size, path=grant.path,
                                    extra={**item.extra, "stored_on": grant.node})
            go = True
            done = await self.downloader.fetch(item, reresolve, transferred=transferred, start=start)
            backup = item.extra.get("backup_url")
            if done.status == it.FAILED and isinstance(backup, str) \
                    and backup.startswith(("http://", "https://")) and backup != item.url:
                # The site named a second address for the same file: try it before giving the item up.
                log.info("download of %s failed (%s); trying its backup address", item.url, done.reason)
                done = await self.downloader.fetch(
                    item.replace(url=backup, extra={**item.extra, "primary_url": item.url}), reresolve)
            return done
        finally:
            transferred()
            if go:
                self._download_ended(ticket, done)


class Session:
    """One connection to the master, from its Welcome to its end: the state its tasks share (the results to
    report, the credit held back, when the master was last heard) and the tasks themselves (reader, reporter,
    heartbeat, disk watch, stopper), all in one TaskGroup cancelled when the connection goes. The worker sends
    through the session up (Worker._session) what its page requests and downloads produce."""

    def __init__(self, worker: Worker, conn: FramedConnection, hs: p.WorkerHandshake, welcome: p.Welcome) -> None:
        self.worker = worker
        self.conn = conn
        self.hs = hs
        self.welcome = welcome
        # A Result to report, or the lease id of a task handed back unfinished after a local fault.
        self.results: asyncio.Queue[Outcome] = asyncio.Queue()
        # Credit this worker owes the master but holds back while it cannot store anything, or while as many
        # downloads as it may hold are pending.
        self.withheld = 0
        self.fetched: list[p.PageFetch] = []   # page requests that ended this loop turn, not sent yet
        self.last_heard = time.monotonic()
        self.timeout = max(3 * welcome.heartbeat_interval, 5.0)
        self.evidence_task: asyncio.Task[None] | None = None   # the master's evidence ask being answered
        self.quiet = asyncio.Event()   # set: the worker went idle after a report; the heartbeat goes now

    async def open(self) -> None:
        """The master's first credit, or (the worker cannot take tasks) the fault and the credit held back."""
        w = self.worker
        if w.fault is None and not w.ledger.full:
            await self.conn.send(p.Credit(w.cfg.max_tasks))
        else:
            self.withheld = w.cfg.max_tasks
            if w.fault is not None:
                await self.conn.send(p.Fault(w.fault))

    async def run(self) -> bool:
        """Until the connection ends: True when the master ended the crawl."""
        w = self.worker
        ended = False
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.reader(tg))
                tg.create_task(self.reporter())
                tg.create_task(self.heartbeat())
                tg.create_task(self.disk_watch())
                tg.create_task(self.stopper())
        except* _Shutdown:
            ended = True
        except* p.ProtocolError as eg:      # a frame that fails its tag too: something on the path spoke
            log.warning("master broke the protocol: %s; connecting again", eg.exceptions[0])
        except* (ConnectionClosed, OSError) as eg:   # OSError: a local fault (disk) ends it too
            if w._stop.is_set():
                log.info("worker %s stopping: connection to the master closed", w.cfg.id)
            else:
                log.info("connection to the master lost: %s", eg.exceptions[0])
        return ended

    # ------------------------------------------------------------------ what the worker sends through it
    def room(self) -> None:
        """A pending download ended: the credit held back for them goes out once there is room again."""
        w, conn = self.worker, self.conn
        if self.withheld and w.fault is None and not w.ledger.full and not conn.writer.is_closing():
            n, self.withheld = self.withheld, 0
            try:
                conn.send_nowait(p.Credit(n))
            except (OSError, ConnectionError):
                pass

    def page_fetched(self, fetch: p.PageFetch) -> None:
        """Every page request that ends in this turn of the event loop shares one frame."""
        if not self.fetched:
            asyncio.get_running_loop().call_soon(self._send_fetched)
        self.fetched.append(fetch)

    def _send_fetched(self) -> None:
        batch, self.fetched = self.fetched, []
        if batch and not self.conn.writer.is_closing():
            try:
                self.conn.send_nowait(p.Fetched(tuple(batch)))
            except (OSError, ConnectionError):
                pass

    def send_downloads(self, out: Outgoing) -> None:
        """Asks and ends go unsent with a closing connection (their asks are made again); outcomes stay for the
        next session. The outcomes that ended in this turn of the event loop share a frame (or a few)."""
        conn, ledger = self.conn, self.worker.ledger
        if conn.writer.is_closing():
            ledger.unsent(out.outcomes)
            return
        try:
            if out.ends:
                conn.send_nowait(p.DownloadDone(out.ends))
            if out.asks:
                conn.send_nowait(p.DownloadAsk(out.asks))
            if out.outcomes:
                conn.send_bytes_nowait(_outcome_frames(list(out.outcomes), conn.max_frame))
                self.reported()
        except (OSError, ConnectionError):
            ledger.unsent(out.outcomes)

    def reported(self) -> None:
        """After a report or outcomes went: a worker with nothing left to work on or send has its heartbeat
        go now rather than at the next interval, so a crawl that is done ends without waiting for it."""
        w = self.worker
        if not w._running and self.results.empty() and not (w.fingerprints and w.fingerprints.backlog):
            self.quiet.set()

    # ------------------------------------------------------------------ its tasks
    async def reader(self, tg: asyncio.TaskGroup) -> None:
        w = self.worker
        while True:
            msg = self.hs.receive(await self.conn.recv())
            self.last_heard = time.monotonic()
            if isinstance(msg, p.Assign):
                for task in msg.tasks:
                    tg.create_task(w._run_task(task, self.results))
            elif isinstance(msg, p.DownloadWork):
                for item in msg.items:
                    w._take_download(item)
            elif isinstance(msg, p.FragmentRules):
                # A worker joined whose resolvers brought rules: links are keyed with them from now on, and
                # those seen already are reported again under their new keys.
                w.norm = replace(w.norm, keep_fragment=msg.keep_fragment)
                w.links.forget()
            elif isinstance(msg, p.DownloadGrant):
                w._granted(msg.grants)
            elif isinstance(msg, p.EvidenceAsk):
                self.evidence(msg, tg)
            elif isinstance(msg, p.Shutdown):
                log.info("master ended the crawl: %s", msg.reason)
                raise _Shutdown()

    def evidence(self, ask: p.EvidenceAsk, tg: asyncio.TaskGroup) -> None:
        """The master asks for items' archived chains (crawler/worker/evidence.py): one answer at a time."""
        from crawler.worker import evidence

        if self.evidence_task is not None and not self.evidence_task.done():
            self.conn.send_nowait(p.EvidenceRecords(ask.request, p.EVIDENCE_CHAINS, last=True, error=evidence.BUSY))
            return
        self.evidence_task = tg.create_task(evidence.answer(
            self.conn.send, ask, self.worker.cfg.data_dir, max_bytes=self.worker.cfg.evidence_max_bytes,
            max_frame=self.conn.max_frame))

    async def reporter(self) -> None:
        w, conn, results = self.worker, self.conn, self.results
        while True:
            batch = [await results.get()]
            if w._running:
                await asyncio.sleep(REPORT_DELAY)   # let a burst of results share one frame
            # else nothing is being worked on (a breadth-first level's last pages, say): no result to wait for,
            # and the master waits for these to hand out the next level
            size = _wire_size(batch[0])
            while len(batch) < REPORT_BATCH and size < REPORT_BYTES and not results.empty():
                batch.append(results.get_nowait())
                size += _wire_size(batch[-1])
            pending = _pending_keys(r for r in batch if isinstance(r, p.Result))
            for r in batch:
                pending |= w._carried.pop(r if isinstance(r, int) else r.lease, set())
            try:
                w.pages.flush()   # the index lines of these pages reach the disk before the master hears
            except OSError as e:
                if not is_local(e):
                    raise
                w._enter_fault(describe(e))
                # Their pages may not be indexed: the whole batch is fetched again elsewhere. The link cache
                # took their links as reported: it forgets, or a page fetched again here (its slot's node)
                # would hold back the links the master never heard of (a song's playlist, and its audio).
                if any(isinstance(r, p.Result) for r in batch):
                    w.links.forget()
                batch = [r if isinstance(r, int) else r.lease for r in batch]
            done = [r for r in batch if isinstance(r, p.Result)]
            back = [r for r in batch if isinstance(r, int)]
            frames = _report_frames(done, conn.max_frame) if done else b""
            if back:
                w.stats.handed_back += len(back)
                frames += p.encode(p.Fault((w.fault or w._handed_back or "local fault")[:1000], tuple(back)),
                                   conn.max_frame)
            frames += _site_wait_frames([r for r in batch if isinstance(r, SiteBack)], conn.max_frame)
            if w.fault is None and not w.ledger.full:
                frames += p.encode(p.Credit(len(batch) + self.withheld))
                self.withheld = 0
            else:
                self.withheld += len(batch)
            await conn.send_bytes(frames)
            if pending:   # their outcomes may follow now
                w._page_reported(pending)
            if done:
                self.reported()

    async def disk_watch(self) -> None:
        w, cfg = self.worker, self.worker.cfg
        # A fault a download ran into is said here too: the master times how long a node cannot store, and
        # past scheduling.fault_timeout hands its pending downloads on.
        told = w.fault is not None
        while True:
            need = cfg.min_free_bytes + (RESUME_HEADROOM if w.fault is not None else 0)
            reason = await asyncio.to_thread(check_data_dir, cfg.data_dir, need)
            if reason is not None and (w.fault is None or not told):
                w._enter_fault(reason)
                told = True
                await self.conn.send(p.Fault(w.fault or reason))
            elif reason is None and w.fault is not None:
                log.info("worker %s can store again: taking tasks", cfg.id)
                w.fault = None
                told = False
                # A Credit, of none while pending downloads hold it back, tells the master the fault is over
                # (its clock stops: the downloads stay this node's).
                credit = 0
                if not w.ledger.full:
                    credit, self.withheld = self.withheld, 0
                await self.conn.send(p.Credit(credit))
            await asyncio.sleep(DISK_CHECK_INTERVAL)

    async def heartbeat(self) -> None:
        interval = self.welcome.heartbeat_interval
        gap = min(QUIET_HEARTBEAT_GAP, interval)
        while True:
            await asyncio.sleep(gap)
            try:
                await asyncio.wait_for(self.quiet.wait(), interval - gap)
            except TimeoutError:
                pass
            self.quiet.clear()
            if time.monotonic() - self.last_heard > self.timeout:
                raise ConnectionClosed(f"master silent for {time.monotonic() - self.last_heard:.1f} s")
            # The leases still worked on, so the master renews them: a slow resolve keeps its page's.
            pool = self.worker.fingerprints
            await self.conn.send(p.Heartbeat(time.time(), tuple(self.worker._running),
                                             min(pool.backlog if pool else 0, p.MAX_CAPACITY),
                                             self.worker.proxy_counts()))

    async def stopper(self) -> None:
        await self.worker._stop.wait()
        raise ConnectionClosed("worker stopping")


def _pending_keys(results: Iterable[p.Result]) -> set[Key]:
    return {(a.page, a.url) for r in results for a in r.audio if a.status == it.PENDING}


def _outcome_frames(batch: list[tuple[str, it.AudioItem]], max_frame: int) -> bytes:
    """DownloadReport frames for a batch of outcomes: one frame when it fits, else one an outcome."""
    try:
        return p.encode(p.DownloadReport(tuple(batch)), max_frame)
    except ValueError:
        pass
    out = []
    for url, item in batch:
        try:
            out.append(p.encode(p.DownloadReport(((url, item),)), max_frame))
        except ValueError:
            if not item.fingerprint:
                raise
            # Below the frame limit only without its fingerprint (a master with a small max_frame).
            log.warning("outcome of %s is larger than a frame; reporting it without its fingerprint", url)
            out.append(p.encode(p.DownloadReport(((url, item.replace(fingerprint=None)),)), max_frame))
    return b"".join(out)


def _validators(page: FetchedPage | None, digest: int) -> tuple[str | None, str | None, int | None] | None:
    """What the master keeps of a 2xx page for its next visit: its validators and the digest of what the crawl
    took from it (revisit.content_digest: a page without validators still tells whether it changed)."""
    if page is None or not 200 <= page.status < 300:
        return None
    h = page.headers
    return _header_value(h.get("etag")), _header_value(h.get("last-modified")), digest


def _started(page: FetchedPage | None) -> Started | None:
    """The first bytes of a file that answered a page fetch, for its download to resume after: only from a whole
    200 answer sent without a content coding (a coded body's bytes are not the file's, and ranges over it mean
    nothing)."""
    if page is None or page.status != 200 or not page.body or page.headers.get("content-encoding", "identity") \
            .strip().lower() not in ("", "identity"):
        return None
    length = page.headers.get("content-length", "").strip()
    size = int(length) if length.isdigit() else len(page.body) if len(page.body) < SNIFF_BYTES else None
    if size is not None and size < len(page.body):
        return None
    return Started(url=page.url, body=page.body, size=size, etag=_header_value(page.headers.get("etag")),
                   last_modified=_header_value(page.headers.get("last-modified")), content_type=page.content_type)


def _header_value(v: str | None) -> str | None:
    # Sent back verbatim next time: only what is a valid header value, and short (a hostile site's 1 MiB ETag,
    # or one with control characters, would break every later request for the page).
    return v if v and len(v) <= MAX_VALIDATOR and v.isascii() and v.isprintable() else None


def _merged(first: Resolution | None, more: Resolution | None) -> Resolution | None:
    """Both resolutions' items and links, one item per address (the first resolver's wins)."""
    if first is None or more is None:
        return more if first is None else first
    seen = {i.url for i in first.items}
    return Resolution(items=first.items + [i for i in more.items if i.url not in seen],
                      links=first.links + more.links, lastmod={**more.lastmod, **first.lastmod},
                      link_meta={**more.link_meta, **first.link_meta})


def _pinned_to(item: it.AudioItem, exit: str) -> it.AudioItem:
    """The item with the proxy it was resolved through as its exit (RequestIdentity.exit)."""
    if item.identity is not None and item.identity.exit is not None:
        return item
    identity = item.identity or it.RequestIdentity()
    return item.replace(identity=msgspec.structs.replace(identity, exit=exit))
