"""The master's crawl state: what to hand to which node, what came back, and when the crawl is done.

Synchronous and free of sockets: the server calls it with the time and sends what it returns. It ties the
parts together: URL policy and normalisation, Bloom dedup, the durable store (frontier + URL table), the
double-hash node table, and global politeness. Every batch of links goes through each stage as one batch.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from crawler import protocol as p
from crawler.items import OK, PENDING, AudioItem, LinkMeta
from crawler.master.config import MasterConfig
from crawler.master.dedup import Dedup
from crawler.master.limits import MAX_BYTES, MAX_DURATION, STARTED_META, Limits, limit_reached
from crawler.master.revisit import revisit_policy
from crawler.master.store import (
    ROBOTS_BLOCKED,
    ROBOTS_REASON,
    MasterStore,
    PageOutcome,
    StoreValueError,
    is_live,
    listed_keys,
)
from crawler.politeness import THROTTLE_STATUSES, HostGate, ParsedRobots, RobotsRules, robots_url
from crawler.sites import DepthLimits
from crawler.scheduler import NodeTable
from crawler.web.urls import (
    AUDIO_REF_HOPS,
    DISCARD_TOO_DEEP,
    NormalizeOptions,
    UrlPolicy,
    host_url_of,
    normalize_many,
)

log = logging.getLogger("crawler.master")

# Pages whose address suggests audio are served first within a depth (the paper's priority within BFS).
_HINT_WORDS = r"song|music|audio|track|album|playlist|special|mp3|listen|play"
_AUDIO_HINT = re.compile(_HINT_WORDS, re.IGNORECASE)
_AUDIO_HINT_LOWER = re.compile(_HINT_WORDS).search


def audio_hint(url: str) -> int:
    """The priority of a new URL: 1 when its address suggests audio (a hint word in any case), else 0. An ASCII
    address (every normalised one but an IRI's) is searched lowercased: an ignore-case search tries each word at
    each place in every case, 2.1 us against 0.4 for a link of the sitegen site. Beyond ASCII, case folds more
    widely ("ſ" is an "s" to it), so such an address keeps the ignore-case search."""
    if url.isascii():
        return 1 if _AUDIO_HINT_LOWER(url.lower()) else 0
    return 1 if _AUDIO_HINT.search(url) else 0


# How many popped-but-not-yet-sendable entries (waiting on politeness or robots.txt) a node may hold in memory.
HELD_CAP = 2048
DISCARD_INVALID = "invalid"
DISCARD_ROBOTS = "robots"
# A redirect's target keeps the redirecting URL's depth for this many redirects in a row; past them (a site
# that redirects for ever, to a new address each time) each redirect counts as a link hop again.
MAX_REDIRECT_HOPS = 5
REDIRECTS_TRACKED = 65536   # targets whose run of redirects is remembered; the oldest are forgotten first
# A page answered 429/503 goes back in line without counting an attempt: the site asked us to wait, the page is
# not broken. Past this many such answers in a row (a page that always says 503) they count like any retry.
FREE_THROTTLED_RETRIES = 20
THROTTLED_TRACKED = 65536   # URLs whose run of 429/503 answers is remembered; the oldest are forgotten first
# Fragment rules the workers' resolvers brought (beyond crawl.keep_fragment), kept in the store's meta table: a
# restarted master keys URLs as before. At most MAX_LEARNT_RULES: past it a worker with yet more is refused.
# A worker's rule is a regex the master would run on every URL: it is taken only when the operator approved that
# exact text (crawl.approved_fragment_rules); the text is never compiled otherwise, so a rule made to backtrack
# cannot stall the master. The unapproved ones are remembered (at most MAX_IGNORED_RULES) to log each once.
FRAGMENT_RULES_META = "fragment_rules"
MAX_LEARNT_RULES = 64
MAX_IGNORED_RULES = 64
# A site whose login fails waits (Crawl.site_wait): its queued URLs are routed to a node of this name, which no
# worker has, so no node pops them and the level barrier does not count them; they are routed to the workers
# again when the site's login works.
WAITING_NODE = "(login) "
MAX_WAIT = 600.0           # the longest a waiting site goes without a probe, whatever a worker says


class ReportRejected(Exception):
    """The store refused a report's values: the report was undone and its URLs went back to the frontier."""


# What the store raises for values it cannot hold (an integer past 64 bits, a non-JSON value): the report's
# fault, not the store's. Either database's refusal arrives as StoreValueError (a ValueError; see backend.py);
# I/O errors are not among them.
_BAD_VALUES = (StoreValueError, OverflowError, ValueError, TypeError)


@dataclass(slots=True)
class Lease:
    id: int
    url: str
    depth: int
    parent: str | None
    node: str
    host: str
    deadline: float
    start: float = 0.0        # when its request started, as far as the politeness gate knows
    holds: bool = True        # it holds one of its host's slots in the gate (until its page request ends)
    after: int | None = None  # chained: the worker starts it when this lease's request ends (protocol.Task)
    next: int | None = None   # the lease chained after this one
    validators: tuple[str | None, str | None] | None = None   # for a conditional fetch (protocol.Task)
    link_meta: LinkMeta | None = None   # what the linking page said about the URL (protocol.Task)


@dataclass(slots=True)
class Held:
    url: str
    depth: int
    parent: str | None
    host: str          # scheme://netloc, the politeness and robots key
    validators: tuple[str | None, str | None] | None = None
    link_meta: LinkMeta | None = None


class HeldQueue:
    """A node's popped-but-not-yet-sendable entries, one line per host.

    Dispatch asks each host once, not each entry: when a host's gate is shut, its whole line waits at the cost
    of one check, so waking every few milliseconds for a polite host stays cheap however much is held.
    """

    __slots__ = ("_by_host", "_count", "not_before")

    def __init__(self) -> None:
        self._by_host: dict[str, deque[Held]] = {}
        self._count = 0
        # host -> the time its gate said it opens, when that was a time (a spacing or a pause, not a slot to be
        # freed): until then dispatch passes the host by with one lookup. A gate only opens later than it said
        # (a pause, a longer delay), except when an adaptive delay shrinks, which this merely defers.
        self.not_before: dict[str, float] = {}

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Held]:
        for line in self._by_host.values():
            yield from line

    def add(self, h: Held) -> None:
        line = self._by_host.get(h.host)
        if line is None:
            line = self._by_host[h.host] = deque()
        line.append(h)
        self._count += 1

    def hosts(self) -> list[str]:
        return list(self._by_host)

    def head(self, host: str) -> Held | None:
        line = self._by_host.get(host)
        return line[0] if line else None

    def pop_head(self, host: str) -> None:
        line = self._by_host[host]
        line.popleft()
        self._count -= 1
        if not line:
            del self._by_host[host]
            self.not_before.pop(host, None)


def waiting_node(site: str) -> str:
    """The node name a waiting site's queued URLs are routed to (shown as such in the frontier by node)."""
    return WAITING_NODE + site


@dataclass(slots=True)
class Waiting:
    """A site whose login fails on the workers (protocol.SiteWait): why, since when, and when one of its URLs
    next goes out as the probe that lets a worker try the login again."""

    reason: str
    since: float
    until: float


@dataclass
class Totals:
    """This run's figures that the store does not keep (it keeps pages and audio by state)."""

    pages: int = 0
    stale_results: int = 0
    links_seen: int = 0
    links_new: int = 0
    stale_downloads: int = 0   # download outcomes from a node that no longer held them (handed to another)
    # Stored files (or copies) whose outcome came in their page's report, and outcomes that came apart (their
    # page reported them pending: a row written, then settled).
    files_with_page: int = 0
    outcomes_apart: int = 0


class Crawl:
    def __init__(self, cfg: MasterConfig, store: MasterStore, dedup: Dedup, table: NodeTable,
                 gate: HostGate | None, robots: RobotsRules | None, *, first_lease: int = 1) -> None:
        self.cfg = cfg
        self.store = store
        self.dedup = dedup
        self.table = table
        self.gate = gate
        self.robots = robots
        c = cfg.crawl
        # Only approved rules: a store written before approval existed, or a rule the operator since withdrew.
        learnt = tuple(r for r in store.get_meta(FRAGMENT_RULES_META, ()) if r in c.approved_fragment_rules)
        self.ignored_rules: dict[str, str] = {}     # an unapproved rule a worker brought -> the first such node
        self.norm = NormalizeOptions(sort_query=c.sort_query, drop_params=frozenset(c.drop_params),
                                     keep_fragment=tuple(dict.fromkeys((*c.keep_fragment, *learnt))))
        # The depth limit of each URL: its site's max_depth (cfg.sites) or the crawl's. The URL policy holds
        # links to the deepest of them; add_links cuts each at its own.
        self.depths = DepthLimits(c.max_depth, cfg.sites)
        self.policy = UrlPolicy(max_length=c.max_url_length, max_depth=self.depths.ceiling,
                                max_query_params=c.max_query_params, max_separator_ratio=c.max_separator_ratio,
                                allowed_hosts=frozenset(h.lower() for h in c.allowed_hosts),
                                allow_patterns=c.allow_patterns, deny_patterns=c.deny_patterns)
        self.leases: dict[int, Lease] = {}
        self.leases_by_node: dict[str, set[int]] = {}
        self.held: dict[str, HeldQueue] = {}
        # node -> when a politeness gate next opens for something it holds (what the server sleeps until)
        self.wake_at: dict[str, float] = {}
        self._throttled: dict[str, int] = {}     # url -> 429/503 answers in a row
        self._redirected: dict[str, int] = {}    # url -> redirects in a row that led to it
        # (node, host) -> leases holding a slot of host with nothing chained after them yet, in order
        self._heads: dict[tuple[str, str], dict[int, None]] = {}
        self.away: dict[str, float] = {}          # node -> when its leases are given up
        # The core's outbox, drained by the daemon's shell: robots.txt fetches to start (robots_to_fetch) and the
        # URLs discarded by reason (take_discards). robots_wanted is every origin still waited on.
        self.robots_wanted: set[str] = set()
        self._robots_new: list[str] = []
        self.discards: Counter[str] = Counter()
        self.totals = Totals()
        self._next_lease = first_lease
        self._scheduled = 0                      # pages handed out this run (for max_pages)
        # The limits (master/limits.py): bytes fetched over the whole crawl, from the store's per-node figures,
        # and the limit reached (its key), after which no work is handed out.
        self.limits = Limits(c.max_pages, c.max_bytes, c.max_duration)
        self.bytes_fetched = store.fetched_bytes()
        self.started: float | None = None         # when the crawl first started (start())
        self.limit: str | None = None
        self._limit_said = False
        # Refresh on: each fetched page's next visit adapts to how often it changes (master/revisit.py).
        self.revisit = revisit_policy(c)
        # The level barrier (breadth first across the cluster): only entries of depth <= level are handed out,
        # and the level rises only once nothing of it is queued, held or leased anywhere. So every page of a
        # level has reported its links before any page of the next is fetched, and a URL is first seen at its
        # shortest depth (the depth it keeps). Entries queued below the level later (a seed added, a refresh)
        # are served at once: the bound is "at most", not "exactly".
        self.level = 0
        # Sites waiting for their login, by pattern (at most one per site of cfg.sites): their URLs are kept out
        # of every node's line and out of the level barrier until a result of the site comes (site_wait).
        self.waiting: dict[str, Waiting] = {}
        # Pending downloads handed to nodes (download-only work), for the server to send: node -> items.
        # Bounded by the pending downloads in the store, which the workers' own bounds keep small.
        self.download_work: dict[str, list[AudioItem]] = {}

    # ------------------------------------------------------------------ limits
    def start(self, now: float) -> float:
        """When the crawl first started: kept in the store, so that max_duration counts over restarts."""
        started = self.store.get_meta(STARTED_META)
        if not isinstance(started, (int, float)):
            started = now
            self.store.set_meta(STARTED_META, started)
        self.started = float(started)
        return self.started

    def check_limits(self, now: float) -> str | None:
        """The key of the limit reached, if any; from then on no work is handed out (for the rest of the run)."""
        if self.limit is None:
            started = self.started if self.started is not None else now
            self.limit = limit_reached(self.limits, pages=self._scheduled, bytes_fetched=self.bytes_fetched,
                                       started=started, now=now)
        return self.limit

    def limit_news(self) -> str | None:
        """The limit reached, the first time it is asked after that (for the daemon to say it once)."""
        if self.limit is None or self._limit_said:
            return None
        self._limit_said = True
        return self.limit

    # ------------------------------------------------------------------ routing
    def route(self, urls: Sequence[str]) -> list[str | None]:
        """The node each page URL goes to: the double hash, except a waiting site's URLs, which wait aside."""
        out = self.table.assign_many(list(urls))
        if self.waiting:
            for i, u in enumerate(urls):
                site = self._waiting_site(u)
                if site is not None:
                    out[i] = waiting_node(site)
        return out

    def _waiting_site(self, url: str) -> str | None:
        """The pattern of the waiting site url belongs to, or None."""
        pol = self.cfg.sites.lookup_url(url)
        return pol.pattern if pol is not None and pol.pattern in self.waiting else None

    # ------------------------------------------------------------------ sites waiting for their login
    def site_wait(self, node: str, lease_ids: Sequence[int], reason: str, retry_in: float, now: float) -> int:
        """The node cannot log into a site (protocol.SiteWait) and hands back these of its leases: not the URLs'
        fault (no attempt counted, nothing failed) nor the node's (it keeps its work). The site waits: its URLs
        are routed aside, out of every node's line and of the level barrier, until retry_in seconds from now,
        when one goes out as the probe that lets a worker try the login again; a result of the site ends the
        wait (complete). Said once a wait, not once a URL. Returns how many URLs went back."""
        mine = self.leases_by_node.get(node, set())
        urls = []
        sites: dict[str, None] = {}
        for i in lease_ids:
            if i not in mine:
                continue   # reassigned meanwhile, or not this node's
            mine.discard(i)
            lease = self.leases.pop(i)
            self._end_request(lease, now)
            urls.append(lease.url)
            pol = self.cfg.sites.lookup_url(lease.url)
            if pol is not None:
                sites[pol.pattern] = None
        until = now + min(max(retry_in, 0.0), MAX_WAIT)
        for site in sites:
            w = self.waiting.get(site)
            if w is not None:
                w.reason, w.until = reason, until
                continue
            self.waiting[site] = Waiting(reason, now, until)
            log.warning("site %s waits for its login (%s): its URLs wait, not counted against them, while the "
                        "other sites go on; a worker tries again in %.0f s", site, reason, until - now)
            self._aside_held(site)
        return self.store.unlease(urls, self.route) if urls else 0

    def _aside_held(self, site: str) -> None:
        """Entries of a site that now waits, popped but not sent yet, go aside with its other URLs."""
        back: list[str] = []
        for node, q in list(self.held.items()):
            if not any(self._waiting_site(h.url) == site for h in q):
                continue
            kept = HeldQueue()
            for h in q:
                if self._waiting_site(h.url) == site:
                    back.append(h.url)
                else:
                    kept.add(h)
            kept.not_before.update((host, t) for host, t in q.not_before.items() if kept.head(host) is not None)
            self.held[node] = kept
        if back:
            self.store.unlease(back, self.route)

    def _site_goes_on(self, site: str, now: float) -> None:
        """A result of a waiting site came: its login works again, and its URLs go back to the workers' lines."""
        w = self.waiting.pop(site)
        n = self.store.reroute([waiting_node(site)], self.route)
        log.info("site %s: its login works again after %.0f s of waiting: its %d waiting URLs go on", site,
                 now - w.since, n)

    def _probe(self, held: HeldQueue, now: float) -> None:
        """For each waiting site whose next login attempt is due: one of its URLs of the current level goes out
        to this node, so a worker tries the login again. A site with none there holds nothing of the level up;
        its deeper URLs are probed only once nothing else is left to crawl (the level cannot rise past them
        then). Until the probe's result or SiteWait answers, the next probe waits a lease's time."""
        idle: bool | None = None
        for site, w in self.waiting.items():
            if w.until > now:
                continue
            w.until = now + self.cfg.scheduling.lease_timeout
            node = waiting_node(site)
            rows = self.store.pop(node, 1, now, max_depth=self.level, validators=self.revisit is not None,
                                  link_meta=True)
            if not rows:
                if idle is None:
                    idle = not (self.leases or any(self.held.values()) or self.robots_wanted) and \
                        self.store.lowest_queued_depth([waiting_node(s) for s in self.waiting]) is None
                if idle:
                    rows = self.store.pop(node, 1, now, validators=self.revisit is not None, link_meta=True)
            for url, depth, parent, *validators, named in rows:
                held.add(Held(url, depth, parent, host_url_of(url), validators[0] if validators else None,
                              _link_meta(named)))

    def waiting_view(self, now: float) -> dict[str, dict[str, Any]]:
        """The sites waiting for their login, for the status: why, for how long, the next attempt in."""
        return {site: {"reason": w.reason, "waiting_s": round(now - w.since, 1),
                       "next_try_s": round(max(0.0, w.until - now), 1)} for site, w in self.waiting.items()}

    def node_up(self, node: str) -> list[p.Task]:
        """The node (re)joined. Returns the leases it still holds from before a short absence, to send again."""
        self.away.pop(node, None)
        self.table.set_live(node, True)
        self.leases_by_node.setdefault(node, set())
        self.held.setdefault(node, HeldQueue())
        # Only entries of this node's own slot and of dead slots can route differently now.
        live = self.table.live
        slots = [i for i, n in enumerate(self.table.nodes) if n == node or n not in live]
        moved = self.store.reroute_slots(slots, self.route) + self.store.reroute([None], self.route)
        moved += self._rehome_held(node)
        if moved:
            log.info("node %s joined: %d frontier entries routed to it", node, moved)
        # Its own pending downloads go to it again (it ignores those it still runs: a restarted worker has none
        # and starts them over, resuming their files), and those no live node held are routed now.
        own = self.store.pending_of([node], unheld=True)
        mine = [r for r in own if r[2] == node]
        if mine:
            self.download_work.setdefault(node, []).extend(_pending_item(r[3]) for r in mine)
            log.info("node %s joined: %d of its pending downloads sent to it again", node, len(mine))
        if len(mine) < len(own):
            self._hand_over([r for r in own if r[2] != node])
        return [p.Task(i, self.leases[i].url, self.leases[i].depth, self.leases[i].parent, self.leases[i].after,
                       self.leases[i].validators, self.leases[i].link_meta)
                for i in sorted(self.leases_by_node[node])]

    def _rehome_held(self, joined: str) -> int:
        """Entries other nodes popped but could not send yet (a polite host holds back most of them) and that
        now route to the node that joined go back in line, so it gets its share now, not once the others have
        worked through what they hold."""
        back: list[str] = []
        for other, q in list(self.held.items()):
            if other == joined or not q:
                continue
            entries = list(q)
            kept = HeldQueue()
            for h, target in zip(entries, self.route([h.url for h in entries]), strict=True):
                if target == other:
                    kept.add(h)
                else:
                    back.append(h.url)
            self.held[other] = kept
        return self.store.unlease(back, self.route) if back else 0

    def node_away(self, node: str, now: float, grace: float) -> None:
        """The node's connection closed. New work goes elsewhere at once; its leases wait `grace` seconds for it
        to come back (a restarted worker resumes its partial downloads), then return to the frontier."""
        self.table.set_live(node, False)
        self.wake_at.pop(node, None)
        held = self.held.pop(node, HeldQueue())
        if held:   # never sent: back in line without counting an attempt
            self.store.unlease([h.url for h in held], self.route)
        self.store.reroute([node], self.route)
        if self.leases_by_node.get(node) or node in self.store.pending_nodes():
            self.away[node] = now + grace
        else:
            self.leases_by_node.pop(node, None)

    def node_fault(self, node: str, lease_ids: list[int], now: float) -> int:
        """The node cannot store its work (disk full, read-only): these of its leases and everything held for it
        go back to the frontier without counting an attempt, and new work routes around it until node_up().
        Returns how many URLs went back."""
        self.table.set_live(node, False)
        self.wake_at.pop(node, None)
        mine = self.leases_by_node.get(node, set())
        urls = []
        for i in lease_ids:
            if i in mine:
                mine.discard(i)
                lease = self.leases.pop(i)
                urls.append(lease.url)
                self._end_request(lease, now)
        urls.extend(h.url for h in self.held.pop(node, HeldQueue()))
        back = self.store.unlease(urls, self.route) if urls else 0
        self.store.reroute([node], self.route)
        return back

    def expire_away(self, now: float) -> None:
        for node, deadline in list(self.away.items()):
            if deadline <= now:
                log.warning("node %s did not come back: its leases return to the frontier", node)
                self.node_down(node, now)

    def node_down(self, node: str, now: float) -> int:
        """The node left or died: its leases and parked entries go back, through the second hash."""
        self.away.pop(node, None)
        self.table.set_live(node, False)
        self.wake_at.pop(node, None)
        ids = self.leases_by_node.pop(node, set())
        urls = []
        for i in ids:
            lease = self.leases.pop(i)
            urls.append(lease.url)
            lease.next = None   # its successor went with it
            self._end_request(lease, now)
        held = self.held.pop(node, HeldQueue())
        back = self.store.release(urls, self.route) if urls else 0
        if held:   # never sent: back in line without counting an attempt
            back += self.store.unlease([h.url for h in held], self.route)
        moved = self.store.reroute([node], self.route)
        pending = self.store.pending_of([node])
        if pending:
            self._hand_over(pending)
        log.info("node %s left: %d leases returned, %d frontier entries rerouted, %d pending downloads handed on",
                 node, back, moved, len(pending))
        return back

    def _hand_over(self, rows: list[tuple[str, str, str | None, str]]) -> None:
        """Pending downloads (page, url, node, item) whose node is gone: each to a live node by the double hash of
        its address, as pages are routed; with none live they wait, held by no node, for one to join."""
        targets = self.table.assign_many([r[1] for r in rows])   # audio addresses: never a waiting site's line
        for (_, _, _, item), target in zip(rows, targets, strict=True):
            if target is not None:
                self.download_work.setdefault(target, []).append(_pending_item(item))
        self.store.move_pending([(target, page, url) for (page, url, _, _), target in zip(rows, targets, strict=True)])

    def fault_outlasted(self, node: str, bound: float) -> int:
        """The node has not been able to store for `bound` seconds (DownloadBoard.faulted_past): its pending
        downloads go to the live nodes, as a gone node's do (an outcome it sends for them later is ignored).
        Called while the fault lasts, so what it reported pending after its fault follows. Returns how many."""
        pending = self.store.pending_of([node])
        if pending:
            self._hand_over(pending)
            log.warning("node %s has not been able to store for %.0f s: its %d pending downloads go to the live "
                        "nodes", node, bound, len(pending))
        return len(pending)

    def recover_pending(self, now: float, grace: float) -> int:
        """At start-up: the nodes holding pending downloads have `grace` seconds to come back for them, as for
        leases; past it their downloads go to the live nodes (expire_away). Returns how many are pending."""
        for node in self.store.pending_nodes():
            self.away.setdefault(node, now + grace)
        return self.store.pending_count()

    def take_download_work(self) -> dict[str, list[AudioItem]]:
        work, self.download_work = self.download_work, {}
        return work

    def settle(self, node: str, outcomes: tuple[tuple[str, AudioItem], ...], now: float) -> list[dict[str, Any]]:
        """Downloads the node held ended (protocol.DownloadReport): their catalogue rows take the outcome and
        they are no longer pending. Returns the rows now settled, for the catalogue file. An outcome from a node
        that no longer holds the download (it was handed on when the node was given up) is dropped: the node
        that holds it now reports it."""
        keys = [(item.page, url) for url, item in outcomes]
        holders = self.store.pending_holders(keys)
        settled: list[tuple[dict[str, Any], dict[str, Any]]] = []
        ended: list[tuple[str, str]] = []
        fingerprints: list[tuple[str, bytes]] = []
        windows: list[tuple[str, str, bytes]] = []
        for (_, item), key in zip(outcomes, keys, strict=True):
            held = holders.get(key)
            if held is None or held[0] != node:
                if item.fingerprint and item.url and item.status == OK:
                    # A fingerprint the node made after it had sent the outcome (its pool was busy): the row is
                    # settled already, the fingerprint is still the stored file's own.
                    _keep_fingerprint(item, fingerprints, windows)
                else:
                    self.totals.stale_downloads += 1
                continue
            row = item.catalogue_row()
            holder = item.extra.get("stored_on")
            row["node"] = holder if isinstance(holder, str) and holder else node
            row["found_at"] = now
            settled.append((_pending_item(held[1]).catalogue_row(), row))
            ended.append(key)
            if item.fingerprint and item.url:
                _keep_fingerprint(item, fingerprints, windows)
        if not settled and not fingerprints and not windows:
            return []
        try:
            with self.store.atomic():
                rows = self.store.settle_audio(settled) if settled else []
                self.store.drop_pending(ended)
                self.store.add_fingerprints(fingerprints, now)
                self.store.add_window_fingerprints(windows)
                audio_bytes = sum(_stored_bytes(new) for _, new in settled)
                self.store.note_node(node, audio_bytes=audio_bytes)
        except _BAD_VALUES as e:
            raise ReportRejected(f"download outcomes refused by the store ({type(e).__name__}: {e})") from None
        self.totals.outcomes_apart += len(settled)
        self.bytes_fetched += audio_bytes
        return [r for r in rows if r is not None]

    # ------------------------------------------------------------------ input
    def add_fragment_rules(self, node: str, rules: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A joining worker's fragment rules (its resolvers'): the approved ones the crawl lacks join its
        normalisation for good. Returns (those new ones, the unapproved ones not seen before: to log once).
        Raises ValueError past MAX_LEARNT_RULES."""
        approved = self.cfg.crawl.approved_fragment_rules
        rules = tuple(dict.fromkeys(rules))
        unapproved = tuple(r for r in rules if r not in self.norm.keep_fragment and r not in approved)
        fresh = tuple(r for r in unapproved if r not in self.ignored_rules)
        fresh = fresh[:max(0, MAX_IGNORED_RULES - len(self.ignored_rules))]
        self.ignored_rules.update((r, node) for r in fresh)
        new = tuple(r for r in rules if r in approved and r not in self.norm.keep_fragment)
        if not new:
            return (), fresh
        keep = (*self.norm.keep_fragment, *new)
        learnt = [r for r in keep if r not in self.cfg.crawl.keep_fragment]
        if len(learnt) > MAX_LEARNT_RULES:
            raise ValueError(f"the crawl already holds {MAX_LEARNT_RULES} fragment rules learnt from workers")
        self.store.set_meta(FRAGMENT_RULES_META, learnt)
        self.norm = replace(self.norm, keep_fragment=keep)
        return new, fresh

    def seed(self, urls: tuple[str, ...]) -> int:
        normed = [u for u in normalize_many(urls, self.norm) if u]
        new = self.dedup.filter_new(normed)
        return self.store.push([(u, 0, 1, n, None) for u, n in zip(new, self.route(new))], unseen=True)

    def seed_more(self, urls: list[str]) -> dict[str, Any]:
        """URLs an operator adds to a crawl: through normalisation, dedup and the URL policy like any link, at
        depth 0 and ahead of their depth's other pages. Returns what became of them."""
        normed = normalize_many(urls, self.norm)
        valid = list(dict.fromkeys(u for u in normed if u))
        new = self.dedup.filter_new(valid)
        discarded: Counter[str] = Counter()
        rows = []
        for u in new:
            reason = self.policy.check(u, 0)
            if reason:
                discarded[reason] += 1
            else:
                rows.append(u)
        self.discards.update(discarded)
        added = self.store.push([(u, 0, 1, n, None) for u, n in zip(rows, self.route(rows))], unseen=True)
        return {"added": added, "known": len(valid) - len(new), "invalid": len(urls) - sum(1 for u in normed if u),
                "discarded": dict(discarded)}

    def add_links(self, batches: list[tuple[str, int, tuple[str, ...]]],
                  refs: list[tuple[str, int, tuple[str, ...]]] | None = None,
                  link_meta: Sequence[tuple[str, LinkMeta]] = ()) -> int:
        """batches: (parent url, depth of the links, links); refs: the same for the audio references of pages
        (a playlist, a stream), which pass the depth limit by up to AUDIO_REF_HOPS: resolving a page's audio is
        part of that page; link_meta: what the pages say about some of those links (protocol.Result.link_meta),
        kept with the new ones for their tasks. Returns how many new URLs entered the frontier."""
        urls: list[str] = []
        meta: dict[str, tuple[int, str]] = {}
        depths = self.depths
        max_depth = depths.ceiling
        ref_limit = max_depth + AUDIO_REF_HOPS if max_depth is not None else None
        is_ref: set[str] = set()
        for kind, limit, entries in ((0, max_depth, batches), (1, ref_limit, refs or ())):
            extra = AUDIO_REF_HOPS if kind else 0
            for parent, depth, links in entries:
                self.totals.links_seen += len(links)
                if limit is not None and depth > limit:
                    self.discards[DISCARD_TOO_DEEP] += len(links)
                    continue
                # Past the shallowest limit a link is held to its own site's (or the crawl's).
                own = depths.floor is not None and depth > depths.floor + extra
                for u in normalize_many(links, self.norm):
                    if u is None:
                        self.discards[DISCARD_INVALID] += 1
                    elif own and not depths.allows(u, depth, extra):
                        self.discards[DISCARD_TOO_DEEP] += 1
                    elif u not in meta:
                        meta[u] = (depth, parent)
                        urls.append(u)
                        if kind:
                            is_ref.add(u)
        if not urls:
            return 0
        new = self.dedup.filter_new(urls)
        new_set = set(new) if link_meta else set()
        if len(new) < len(urls):
            self._lower_known(urls, new, meta)
        rows = []
        check = self.policy.check
        for u in new:
            depth, parent = meta[u]
            # A reference is held to every rule but the depth limit (its own bound was checked above).
            reason = check(u, min(depth, max_depth) if u in is_ref and max_depth is not None else depth)
            if reason:
                self.discards[reason] += 1
            else:
                rows.append((u, depth, audio_hint(u), parent))
        if not rows:
            return 0
        nodes = self.route([r[0] for r in rows])
        words: dict[str, str] = {}
        if link_meta:
            for u, (_, m) in zip(normalize_many([u for u, _ in link_meta], self.norm), link_meta):
                if u is not None and u in new_set and u not in words:
                    words[u] = msgspec.json.encode(m).decode()
        added = self.store.push([(u, d, pr, n, par) for (u, d, pr, par), n in zip(rows, nodes)], unseen=True,
                                link_meta=words)
        self.totals.links_new += added
        return added

    # ------------------------------------------------------------------ dispatch
    def take(self, node: str, n: int, now: float) -> list[p.Task]:
        """Up to n tasks for node that politeness allows now; the rest waits in the node's held queue.

        Afterwards wake_at[node] says when a politeness gate next opens for what the node holds (absent: only
        an event can help, a release or robots.txt arriving), so the server can sleep until exactly then.
        """
        out: list[p.Task] = []
        self.wake_at.pop(node, None)
        if n <= 0 or not self.table.live or node not in self.table.live or self.check_limits(now) is not None:
            return out
        max_pages = self.cfg.crawl.max_pages
        if max_pages is not None:
            n = min(n, max_pages - self._scheduled)
            if n <= 0:
                return out
        held = self.held.get(node)
        if held is None:
            held = self.held[node] = HeldQueue()
        if self.waiting:
            self._probe(held, now)
        wake = math.inf
        not_before = held.not_before
        for host in held.hosts():
            if len(out) >= n:
                break
            t = not_before.get(host)
            if t is not None and t > now:
                wake = min(wake, t)
                continue
            wake = min(wake, self._serve_host(node, held, host, n, now, out))
        batch = max(n, self.cfg.scheduling.batch_size)
        while len(out) < n and len(held) < HELD_CAP:
            rows = self.store.pop(node, batch, now, max_depth=self.level, validators=self.revisit is not None,
                                  link_meta=True)
            if not rows:
                if not self._next_level():
                    break
                continue
            fresh: dict[str, None] = {}
            aside: list[str] = []    # of a site that waits for its login: routed aside, with one batch
            for url, depth, parent, *validators, named in rows:
                if self.waiting and self._waiting_site(url) is not None:
                    aside.append(url)
                    continue
                h = Held(url, depth, parent, host_url_of(url), validators[0] if validators else None,
                         _link_meta(named))
                held.add(h)
                fresh[h.host] = None
            if aside:
                self.store.unlease(aside, self.route)
            for host in fresh:
                if len(out) >= n:
                    break
                wake = min(wake, self._serve_host(node, held, host, n, now, out))
        if wake < math.inf:
            self.wake_at[node] = wake
        self._scheduled += len(out)
        return out

    def _lower_known(self, urls: list[str], new: list[str], meta: dict[str, tuple[int, str]]) -> None:
        """Known URLs found at a depth at or below the current level may have been recorded deeper (only
        work served out of order, a seed added or a page refreshed, finds any): their depth is lowered, and a
        done page whose links are wanted at the new depth is fetched again, so they are lowered in turn (the
        workers' link caches let a link through again at a smaller depth). Links one level deeper than the
        level, the bulk of every report, are never looked up."""
        fresh = set(new)
        level = self.level
        pairs = [(u, meta[u][0]) for u in urls if meta[u][0] <= level and u not in fresh]
        if not pairs:
            return
        lowered = self.store.lower_depths(pairs)
        # Its links may be of any site: wanted while below the deepest limit (the master cuts each at its own).
        ceiling = self.depths.ceiling
        again = [(u, new_depth) for u, _, new_depth in lowered if ceiling is None or new_depth < ceiling]
        if again:
            n = self.store.requeue_refresh(again, self.route)
            log.info("%d pages found on a shorter path: fetched again for their links at the lower depth", n)

    def _next_level(self) -> bool:
        """The level barrier opens when nothing of the current level is left anywhere: no lease, nothing held
        (all of which is of the level or below) and nothing queued at it or below (the caller's pop found none
        for its node; the store is asked for every node). True when the level rose."""
        if self.leases or any(self.held.values()) or self.robots_wanted:
            return False
        # A site waiting for its login holds no level up: its URLs are served when it goes on (those below
        # the level by then at once, as any entry queued below the level is).
        lowest = self.store.lowest_queued_depth([waiting_node(s) for s in self.waiting])
        if lowest is None or lowest <= self.level:
            return False
        log.info("breadth first: level %d done, level %d begins", self.level, lowest)
        self.level = lowest
        return True

    def next_wake(self, now: float | None = None) -> float:
        """The earliest time a politeness gate opens for anything held, or (given now) a waiting site's login
        is tried again (inf: none is waiting on time)."""
        wake = min(self.wake_at.values(), default=math.inf)
        if now is not None:
            wake = min(wake, min((w.until for w in self.waiting.values() if w.until > now), default=math.inf))
        return wake

    def _serve_host(self, node: str, held: HeldQueue, host: str, n: int, now: float, out: list[p.Task]) -> float:
        """Lease the head of host's line while politeness allows; returns when to try it again (inf: on an
        event only)."""
        while len(out) < n:
            h = held.head(host)
            if h is None:
                return math.inf
            wait = self._try_lease(node, h, now, out)
            if wait is not None:
                if now < wait < math.inf:
                    held.not_before[host] = wait
                else:
                    held.not_before.pop(host, None)
                return wait
            held.pop_head(host)
        return math.inf   # stopped by the credit: new credit is an event of its own

    def _try_lease(self, node: str, h: Held, now: float, out: list[p.Task]) -> float | None:
        """None when h was consumed (leased into out, or refused by robots.txt); else when to try again."""
        if self.robots is not None:
            state = self.robots.state(h.host, now)
            if state != "known":
                if state == "unknown":
                    self.robots.mark_pending(h.host, now)
                    self.robots_wanted.add(h.host)
                    self._robots_new.append(h.host)
                return math.inf
            if not self.robots.allowed(h.url):
                self.discards[DISCARD_ROBOTS] += 1
                self.store.finish([PageOutcome(h.url, ROBOTS_BLOCKED, None, None, None, None, ROBOTS_REASON,
                                            node, now)])
                return None   # consumed: nothing to send
        gate = self.gate
        after = None
        if gate is not None and not gate.try_acquire(h.host, now):
            ready = gate.ready_at(h.host, now)
            if ready < math.inf or not self._chainable(h.host, now):
                return ready
            heads = self._heads.get((node, h.host))
            if not heads:
                return ready
            after = next(iter(heads))
            self._drop_head(node, h.host, after)
        lease = Lease(self._next_lease, h.url, h.depth, h.parent, node, h.host,
                      now + self.cfg.scheduling.lease_timeout, now, holds=after is None, after=after,
                      validators=h.validators, link_meta=h.link_meta)
        self._next_lease += 1
        self.leases[lease.id] = lease
        self.leases_by_node.setdefault(node, set()).add(lease.id)
        if after is None:
            self._heads.setdefault((node, h.host), {})[lease.id] = None
        else:
            self.leases[after].next = lease.id
        out.append(p.Task(lease.id, h.url, h.depth, h.parent, after, h.validators, h.link_meta))
        return None

    def _chainable(self, host: str, now: float) -> bool:
        """Whether host's next request may be chained after one in flight: only when the concurrency limit is
        all that holds it back (no spacing to keep, no pause), so starting it the moment a slot frees at the
        worker is what the gate would allow anyway."""
        gate = self.gate
        assert gate is not None
        cfg = gate.cfg
        return (gate.max_per_host(host) is not None and not cfg.adaptive and gate.delay(host) == 0
                and gate.paused_until(host) <= now)

    def _drop_head(self, node: str, host: str, lease_id: int) -> None:
        heads = self._heads.get((node, host))
        if heads is not None:
            heads.pop(lease_id, None)
            if not heads:
                del self._heads[(node, host)]

    def _end_request(self, lease: Lease, now: float, throttled: bool = False) -> bool:
        """lease's page request ended (or will never be waited for): its slot passes to the lease chained after
        it, which the worker starts right then, unless the host said 429/503 (the worker then returns that one
        unstarted); else the slot goes back to the gate (then True)."""
        if not lease.holds:
            return False
        lease.holds = False
        self._drop_head(lease.node, lease.host, lease.id)
        succ = self.leases.get(lease.next) if lease.next is not None else None
        if succ is not None and not throttled:
            succ.holds, succ.start = True, now
            self._heads.setdefault((succ.node, succ.host), {})[succ.id] = None
            return False
        if self.gate is not None:
            self.gate.release(lease.host, now)
        return True

    def fetched(self, node: str, fetches: tuple[p.PageFetch, ...], now: float) -> bool:
        """Page requests ended at the node: free their hosts' slots; a 429/503 pauses its host for everyone.
        True when a slot under a concurrency limit went back to the gate, so held work may now go out."""
        gate = self.gate
        freed = False
        for f in fetches:
            lease = self.leases.get(f.lease)
            if lease is None or lease.node != node or not lease.holds:
                continue
            throttled = f.http_status in THROTTLE_STATUSES
            freed |= self._end_request(lease, now, throttled)
            if gate is None:
                continue
            if throttled:
                until = gate.throttled(lease.host, lease.start, now, f.retry_after)
                log.info("%s answered %d: no request to it before %.1f s from now", lease.host, f.http_status,
                         until - now)
            elif f.http_status is not None:
                gate.responded(lease.host, lease.start, now, f.latency, ok=f.http_status < 400)
        return freed and gate is not None and gate.limited

    def robots_to_fetch(self) -> list[str]:
        """The robots.txt fetches to start now: each origin once, until robots_fetched() says how it went."""
        out, self._robots_new = self._robots_new, []
        return out

    def take_discards(self) -> Counter[str]:
        """The URLs discarded since the last call, by reason."""
        out, self.discards = self.discards, Counter()
        return out

    def robots_fetched(self, origin: str, status: int | None, body: bytes | None, now: float,
                       parsed: ParsedRobots | None = None) -> None:
        assert self.robots is not None
        delay = self.robots.store(origin, status, body, now, parsed)
        if self.gate is not None and delay:
            self.gate.set_crawl_delay(origin, delay)
        self.robots_wanted.discard(origin)
        sitemaps = self.robots.sitemaps(origin)
        if sitemaps:
            # Sitemaps enter like seeds (depth 0) through the URL policy, scope and dedup; a worker fetches each
            # as a task and reports its <loc> entries as links (a sitemap index's entries are sitemaps again).
            added = self.add_links([(robots_url(origin), 0, tuple(sitemaps))])
            if added:
                log.info("robots.txt of %s: %d sitemaps queued", origin, added)

    # ------------------------------------------------------------------ results
    def complete(self, node: str, results: tuple[p.Result, ...], now: float) -> list[dict[str, Any]]:
        """Records a report as one unit; returns the catalogue rows that are new.

        If the store refuses any of its values, the whole report is undone in the store (and only it: the rest
        of the commit window stays), its URLs go back to the frontier with an attempt counted, and
        ReportRejected is raised.
        """
        finished: list[PageOutcome] = []
        link_batches = []
        ref_batches = []
        named: list[tuple[str, LinkMeta]] = []   # what the pages say about their links to audio
        lastmod: list[tuple[str, float]] = []
        audio_rows: list[dict[str, Any]] = []
        pending: list[tuple[str, str, str | None, str, float]] = []
        fingerprints: list[tuple[str, bytes]] = []   # (audio address, fingerprint) of the files stored
        windows: list[tuple[str, str, bytes]] = []   # (address, sha256, fingerprint) of live streams' windows
        cut = 0
        with_page = 0
        mine = self.leases_by_node.get(node, set())
        if self.waiting:   # a result of a waiting site: its login passed, so the site goes on
            for r in results:
                if (site := self._waiting_site(r.url)) is not None and r.lease in mine:
                    self._site_goes_on(site, now)
                    if not self.waiting:
                        break
        for r in results:
            lease = self.leases.get(r.lease)
            if lease is None or lease.node != node:
                self.totals.stale_results += 1   # reassigned or from before a restart: counted once, elsewhere
                continue
            del self.leases[r.lease]
            mine.discard(r.lease)
            if lease.holds:   # no Fetched came first (a resolver that fetched no page)
                throttled = r.http_status in THROTTLE_STATUSES
                self._end_request(lease, now, throttled)
                if self.gate is not None and throttled:
                    self.gate.throttled(lease.host, lease.start, now)
            state = r.status
            if state == p.RETRY and r.http_status in THROTTLE_STATUSES:
                state = self._throttled_state(lease.url)
            else:
                self._throttled.pop(lease.url, None)
            first_row = len(audio_rows)
            for a in r.audio:
                row = a.catalogue_row()
                # A copy (protocol.GRANT_COPY) is on the node that downloaded it: the row names where the file is.
                holder = a.extra.get("stored_on")
                row["node"] = holder if isinstance(holder, str) and holder else node
                row["found_at"] = now
                audio_rows.append(row)
                if a.fingerprint and a.url:
                    _keep_fingerprint(a, fingerprints, windows)
                if a.status == PENDING:
                    # (a fingerprint comes with the download's outcome, not with a pending item: never kept here)
                    pending.append((a.page, a.url, node,
                                    json.dumps({**a.to_wire(), "fingerprint": None}, ensure_ascii=False), now))
                elif a.sha256:
                    with_page += 1
            if state == p.DONE:
                etag, last_modified, digest = r.validators or (None, None, None)
                # What this URL lists now, whatever page each item names (a playlist's songs name the page that
                # links the playlist). A visit whose resolver reported an error may have missed items: the store
                # takes none off the URL for it (see MasterStore._visited).
                finished.append(PageOutcome(lease.url, state, r.http_status, r.final_url, r.content_type, r.size,
                                         r.error, node, now, etag, last_modified, digest,
                                         listed_keys(audio_rows[first_row:])))
            else:
                finished.append(PageOutcome(lease.url, state, r.http_status, r.final_url, r.content_type, r.size,
                                         r.error, node, now))
            depth = self._depth_of_links(lease, r)
            if r.status == p.DONE and r.links:
                link_batches.append((lease.url, depth, r.links))
            if r.status == p.DONE and r.refs:
                ref_batches.append((lease.url, depth, r.refs))
            if r.status == p.DONE and r.link_meta:
                named.extend(r.link_meta)
            if r.status == p.DONE and r.lastmod:
                # A date in the future is a site's mistake: it would have the page fetched on every visit.
                lastmod.extend(pair for pair in r.lastmod if pair[1] <= now)
            cut += r.cut                         # links the worker did not follow at the depth limit
        if not finished:
            return []
        try:
            with self.store.atomic():
                # The rows first: finish() records which URL lists which of them.
                fresh = self.store.add_audio(audio_rows) if audio_rows else []
                self.store.add_fingerprints(fingerprints, now)
                self.store.add_window_fingerprints(windows)     # after add_audio: it made the windows
                firsts = self.store.finish(finished, self.revisit)
                self.store.add_pending(pending)
                # Per-worker figures for the status command, one row update per report.
                page_bytes = sum(f.size or 0 for f in finished)
                audio_bytes = sum(_stored_bytes(row) for row in audio_rows)
                self.store.note_node(node, bytes=page_bytes, audio_bytes=audio_bytes,
                                     links=sum(len(b[2]) for b in link_batches), audio=len(audio_rows))
                if link_batches or ref_batches:
                    # last: an add to the Bloom filter cannot be undone
                    self.add_links(link_batches, ref_batches, named)
        except _BAD_VALUES as e:
            # The leases already left memory (their request slots are free): their URLs, still leased in the
            # store after the rollback, go back in line rather than wait for a restart.
            self.store.release([f.url for f in finished], self.route)
            raise ReportRejected(f"report of {len(finished)} results refused by the store "
                                 f"({type(e).__name__}: {e}); its URLs went back to the frontier") from None
        self.bytes_fetched += page_bytes + audio_bytes
        if lastmod:
            # After the links went in, so a sitemap's new URLs have rows to take their dates.
            self._note_lastmod(lastmod)
        if cut:
            self.discards[DISCARD_TOO_DEEP] += cut
        self.totals.pages += sum(1 for f, first in zip(finished, firsts) if first and f.state == p.DONE)
        self.totals.files_with_page += with_page
        return [row for row, is_new in zip(audio_rows, fresh) if is_new]

    def _note_lastmod(self, lastmod: list[tuple[str, float]]) -> None:
        changed = self.store.note_lastmod(lastmod)
        if changed and self.cfg.crawl.refresh_interval:
            # The sitemap says these pages changed since we fetched them: no need to wait for their age.
            n = self.store.requeue_refresh(changed, self.route)
            log.info("%d pages changed since their last crawl, as their sitemap says: queued again", n)

    def _depth_of_links(self, lease: Lease, r: p.Result) -> int:
        """A redirect's target is the same resource: it keeps the depth (a link to it is one hop, not two), for
        up to MAX_REDIRECT_HOPS redirects in a row."""
        hops = self._redirected.pop(lease.url, 0)
        if r.http_status not in p.REDIRECT_STATUSES or len(r.links) != 1 or hops >= MAX_REDIRECT_HOPS:
            return lease.depth + 1
        (target,) = normalize_many(r.links, self.norm)   # the key the target's own lease will have
        if target is None:
            return lease.depth + 1
        runs = self._redirected
        runs[target] = hops + 1
        if len(runs) > REDIRECTS_TRACKED:
            del runs[next(iter(runs))]
        return lease.depth

    def _throttled_state(self, url: str) -> str:
        runs = self._throttled
        n = runs.pop(url, 0) + 1
        runs[url] = n
        if len(runs) > THROTTLED_TRACKED:
            del runs[next(iter(runs))]
        return "throttled" if n <= FREE_THROTTLED_RETRIES else p.RETRY

    def expire(self, now: float) -> int:
        """Leases past their deadline go back to the frontier."""
        expired = [lease for lease in self.leases.values() if lease.deadline <= now]
        for lease in expired:
            del self.leases[lease.id]
            self.leases_by_node.get(lease.node, set()).discard(lease.id)
            self._end_request(lease, now)
        if expired:
            self.store.release([lease.url for lease in expired], self.route)
            log.warning("%d leases expired and went back to the frontier", len(expired))
        return len(expired)

    def renew(self, node: str, lease_ids: tuple[int, ...], now: float) -> None:
        """The node says it still works on these leases (a heartbeat): their deadlines move on."""
        deadline = now + self.cfg.scheduling.lease_timeout
        leases = self.leases
        for i in lease_ids:
            lease = leases.get(i)
            if lease is not None and lease.node == node:
                lease.deadline = deadline

    def in_flight(self, node: str | None = None) -> int:
        if node is None:
            return len(self.leases)
        return len(self.leases_by_node.get(node, ()))

    def done(self) -> bool:
        """Nothing left anywhere: no lease, no node waited for, no download pending, an empty frontier."""
        if self.limit in (MAX_BYTES, MAX_DURATION):
            return True   # at once: what is in flight stays leased in the store, handed out again on the next start
        if self.leases or self.robots_wanted or self.away or self.store.pending_count():
            return False
        if self.limit is not None or (self.cfg.crawl.max_pages is not None
                                      and self._scheduled >= self.cfg.crawl.max_pages):
            return True   # what is held stays leased in the store and is handed out again on the next start
        return not any(self.held.values()) and self.store.frontier_empty()


def _keep_fingerprint(item: AudioItem, files: list[tuple[str, bytes]], windows: list[tuple[str, str, bytes]]) -> None:
    """A stored file's fingerprint is its address's; a live stream's is its window's (each visit records new
    audio at the same address), found by the window's bytes."""
    if item.fingerprint is None:
        return
    if is_live(item.extra):
        if item.sha256:
            windows.append((item.url, item.sha256, item.fingerprint))
    else:
        files.append((item.url, item.fingerprint))


def _stored_bytes(row: dict[str, Any]) -> int:
    """The audio bytes a worker reports fetched for a catalogue row: those of a file it stored."""
    size = row.get("size")
    return size if row.get("sha256") and isinstance(size, int) else 0


def _link_meta(stored: str | None) -> LinkMeta | None:
    """A URL's link_meta as the store keeps it (JSON, checked when its report came in); None if unreadable."""
    if stored is None:
        return None
    try:
        return msgspec.json.decode(stored, type=LinkMeta)
    except msgspec.MsgspecError:
        return None


def _pending_item(wire: str) -> AudioItem:
    """A pending download's item as the store keeps it (its wire form as JSON, checked when it came in)."""
    return AudioItem.from_wire(json.loads(wire))
