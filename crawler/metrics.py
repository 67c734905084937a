"""Prometheus metrics of both daemons: one registry per daemon, the metric names operators' dashboards use.

The names are a contract (configs/grafana-dashboard.json reads them):

master  crawler_pages_total{node,outcome}      results reported by workers: done, error, retry
        crawler_audio_items_total{node,status}  catalogue rows added: ok, unavailable, failed
        crawler_discarded_urls_total{reason}    URLs dropped by policy (depth, out_of_scope, robots ...)
        crawler_dedup_urls_total{result}        discovered URLs through the Bloom filter: offered, batch_repeats,
                                                new, seen, whitelist_checked, rescued (false positives caught)
        crawler_download_bytes_total{node,kind} bytes fetched by the workers: page bodies and audio files
        crawler_recordings_total                windows recorded of live streams that the master stored
        crawler_bloom_urls                      URLs in the Bloom filter (the seen-set)
        crawler_bloom_capacity_urls             URLs its layers take before it grows again
        crawler_bloom_fp_estimate               its estimated false-positive rate now
        crawler_frontier_urls                   URLs queued in the frontier
        crawler_in_flight_urls{where}           held at the master (politeness gate, robots.txt) or at workers
        crawler_nodes_connected                 workers connected now
        crawler_nodes_faulted                   workers connected but unable to store (a full disk): no work
        crawler_paused                          1 while the operator has the crawl paused
        crawler_urls{state}                     URLs by state: queued, leased, done, failed, discarded
        crawler_proxy_requests_total{proxy,node}  requests sent through each proxy, as the node's heartbeat said
        crawler_proxy_failures_total{proxy,node}  of them, the proxy's own failures (unreachable, 407, refused)
worker  crawler_pages_total{node,outcome}, crawler_audio_items_total{node,status},
        crawler_download_bytes_total{node,kind}, crawler_fetch_seconds{node} (histogram of page fetch times),
        crawler_proxy_requests_total{proxy}, crawler_proxy_failures_total{proxy}
both    crawler_event_loop_lag_seconds          how late a timer fires: a busy or blocked event loop

Counters are counted where the daemon handles a whole report or task, never per link; gauges are set when
/metrics is read, from figures the master keeps in memory (no table is scanned per scrape). Each process
counts from zero when it starts, as Prometheus expects of counters. No `_created` series: a dashboard has no
use for them and they double every counter's lines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from crawler.web.memo import Memo

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger("crawler.metrics")

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide: both daemons' registries
# The URL states crawler_urls has, in this order.
URL_STATES = ("queued", "leased", "done", "failed", "discarded")

# Lag buckets: a healthy loop fires within a millisecond; a page parse is a few; a blocked loop is seconds.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PAGE_OUTCOMES = ("done", "error", "retry")      # protocol.DONE, ERROR, RETRY: a page task's outcomes
FETCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# The probe's period. A block of the loop longer than this is seen at no less than its length minus the period, so
# the worst lag bounds the longest block from below within 50 ms; 20 wake-ups a second cost nothing measurable.
LAG_INTERVAL = 0.05


class LoopLag:
    """Measures the event loop's lag: how late a short sleep wakes up. Keeps the last value and the worst since the
    start for the status and the exit summary."""

    def __init__(self, hist: Histogram) -> None:
        self.hist = hist
        self.last = 0.0
        self.worst = 0.0

    async def run(self, interval: float = LAG_INTERVAL) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(interval)
            lag = max(0.0, time.monotonic() - t0 - interval)
            self.hist.observe(lag)
            self.last = lag
            self.worst = max(self.worst, lag)


def _lag_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("crawler_event_loop_lag_seconds", "How late a timer on the daemon's event loop fires",
                     buckets=LAG_BUCKETS, registry=registry)


class ProxyFigures(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def requests(self) -> int: ...

    @property
    def failures(self) -> int: ...


class _ProxyCollector(Collector):
    """Requests and failures per proxy, read from the egress's counters (or the heartbeats') when /metrics is:
    nothing is counted per request here. ``figures`` gives (node, counts) pairs; node None for a worker's own."""

    def __init__(self, figures: Callable[[], Sequence[tuple[str | None, Sequence[ProxyFigures]]]]) -> None:
        self._figures = figures

    def collect(self) -> Iterator[CounterMetricFamily]:
        figures = self._figures()
        labels = ["proxy"] if all(node is None for node, _ in figures) else ["proxy", "node"]
        requests = CounterMetricFamily("crawler_proxy_requests", "Requests sent through each proxy", labels=labels)
        failures = CounterMetricFamily("crawler_proxy_failures", "Requests a proxy failed as a proxy (unreachable, "
                                       "407, a refused tunnel)", labels=labels)
        for node, counts in figures:
            for c in counts:
                values = [c.label] if node is None else [c.label, node]
                requests.add_metric(values, c.requests)
                failures.add_metric(values, c.failures)
        yield requests
        yield failures


class MasterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.pages = Counter("crawler_pages", "Page results reported by workers", ["node", "outcome"], registry=r)
        self.audio = Counter("crawler_audio_items", "Audio items added to the catalogue", ["node", "status"],
                             registry=r)
        self.discarded = Counter("crawler_discarded_urls", "URLs dropped by the crawl policy", ["reason"],
                                 registry=r)
        self.download_bytes = Counter("crawler_download_bytes", "Bytes fetched by the workers",
                                      ["node", "kind"], registry=r)
        self.frontier = Gauge("crawler_frontier_urls", "URLs queued in the frontier", registry=r)
        self.in_flight = Gauge("crawler_in_flight_urls", "URLs handed out of the frontier and not yet reported",
                               ["where"], registry=r)
        self.nodes_connected = Gauge("crawler_nodes_connected", "Workers connected to the master", registry=r)
        self.nodes_faulted = Gauge("crawler_nodes_faulted",
                                   "Workers connected but unable to store what they fetch (taking no work)",
                                   registry=r)
        self.paused = Gauge("crawler_paused", "1 while the crawl is paused by the operator", registry=r)
        self.fingerprint_backlog = Gauge("crawler_fingerprint_backlog", "Stored audio files waiting for a "
                                         "worker's fingerprint pool, as its last heartbeat said", ["node"],
                                         registry=r)
        self.urls = Gauge("crawler_urls", "The crawl's URLs by state", ["state"], registry=r)
        self.dedup = Counter("crawler_dedup_urls", "Discovered URLs through the Bloom filter, by result", ["result"],
                             registry=r)
        self._dedup_counted: dict[str, int] = {}
        self.matches = Counter("crawler_matches", "Copies of the references' works found: (audio URL, work) pairs",
                               registry=r)
        self._matches_counted = 0
        self.recordings = Counter("crawler_recordings", "Windows recorded of live streams (live HLS, DASH, "
                                  "radio) that the master stored", registry=r)
        self._recordings_counted = 0
        self.bloom_urls = Gauge("crawler_bloom_urls", "URLs in the Bloom filter", registry=r)
        self.bloom_capacity = Gauge("crawler_bloom_capacity_urls", "URLs the Bloom filter's layers take before it "
                                    "adds another", registry=r)
        self.bloom_fp = Gauge("crawler_bloom_fp_estimate", "The Bloom filter's estimated false-positive rate",
                              registry=r)
        self.lag = LoopLag(_lag_histogram(r))

    def count_dedup(self, totals: Mapping[str, int]) -> None:
        """Bring the dedup counters up to the filter's running totals (read when /metrics is)."""
        for result, total in totals.items():
            counted = self._dedup_counted.get(result, 0)
            if total > counted:
                self.dedup.labels(result).inc(total - counted)
                self._dedup_counted[result] = total

    def count_matches(self, total: int) -> None:
        """Bring the matches counter up to the store's count (read when /metrics is)."""
        if total > self._matches_counted:
            self.matches.inc(total - self._matches_counted)
            self._matches_counted = total

    def count_recordings(self, total: int) -> None:
        """Bring the recordings counter up to the store's count of windows stored (read when /metrics is)."""
        if total > self._recordings_counted:
            self.recordings.inc(total - self._recordings_counted)
            self._recordings_counted = total

    def set_bloom(self, figures: Mapping[str, float]) -> None:
        """The seen-set's gauges, from Dedup.figures()."""
        self.bloom_urls.set(figures["urls"])
        self.bloom_capacity.set(figures["capacity"])
        self.bloom_fp.set(figures["fp_estimate"])

    def watch_proxies(self, figures: Callable[[], Mapping[str, Sequence[ProxyFigures]]]) -> None:
        """crawler_proxy_*_total{proxy,node}, from each node's last heartbeat (figures: node -> counts)."""
        self.registry.register(_ProxyCollector(lambda: sorted(figures().items())))

    def set_urls(self, counts: Mapping[str, int]) -> None:
        """The URL-state gauges, every state present (0 when none): from MasterStore.url_counts()."""
        for state in URL_STATES:
            self.urls.labels(state).set(counts.get(state, 0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class WorkerMetrics:
    def __init__(self, node: str) -> None:
        self.node = node
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.pages = Counter("crawler_pages", "Page tasks finished by this worker", ["node", "outcome"], registry=r)
        self.audio = Counter("crawler_audio_items", "Audio items this worker found", ["node", "status"],
                             registry=r)
        self.download_bytes = Counter("crawler_download_bytes", "Bytes fetched by this worker", ["node", "kind"],
                                      registry=r)
        self.fetch_seconds = Histogram("crawler_fetch_seconds", "Page fetch time, request to last body byte",
                                       ["node"], buckets=FETCH_BUCKETS, registry=r).labels(node)
        self.lag = LoopLag(_lag_histogram(r))
        # Children by label value, looked up once: these are counted on every task.
        self.pages_by_outcome = {o: self.pages.labels(node, o) for o in PAGE_OUTCOMES}
        self.page_bytes = self.download_bytes.labels(node, "page")
        self.audio_bytes = self.download_bytes.labels(node, "audio")
        # The audio counter's children by status (there are four; bounded all the same).
        self._audio_by_status: Memo[str, Counter] = Memo(16)
        # A task's page is counted in plain integers (count_page), added to the counters when they are read
        # (render): a counter's inc takes a lock, twice a page.
        self._pages_due = dict.fromkeys(PAGE_OUTCOMES, 0)
        self._page_bytes_due = 0
        self.fingerprint_backlog = Gauge("crawler_fingerprint_backlog", "Stored audio files waiting for this "
                                         "worker's fingerprint pool", ["node"], registry=r).labels(node)
        self.fingerprints = Counter("crawler_fingerprints", "Stored audio files through the fingerprint pool, by "
                                    "outcome (done, error, skipped: the backlog was full, short: its tags say it is too short to match)", ["node", "outcome"],
                                    registry=r)

    def watch_proxies(self, snapshot: Callable[[], Sequence[ProxyFigures]]) -> None:
        """crawler_proxy_*_total{proxy}, from the egress's counters (crawler/http/egress.py)."""
        self.registry.register(_ProxyCollector(lambda: [(None, snapshot())]))

    def count_page(self, outcome: str, size: int | None) -> None:
        """One task's page: its outcome (one of PAGE_OUTCOMES) and the bytes of its body."""
        self._pages_due[outcome] += 1
        if size:
            self._page_bytes_due += size

    def count_audio(self, status: str) -> None:
        """One audio item of this status (an item found, or a download's outcome)."""
        child = self._audio_by_status.get(status)
        if child is None:
            child = self._audio_by_status.keep(status, self.audio.labels(self.node, status))
        child.inc()

    def _settle(self) -> None:
        """The pages counted since the last read, into their counters."""
        due = self._pages_due
        for outcome, n in due.items():
            if n:
                self.pages_by_outcome[outcome].inc(n)
                due[outcome] = 0
        if self._page_bytes_due:
            self.page_bytes.inc(self._page_bytes_due)
            self._page_bytes_due = 0

    def render(self) -> bytes:
        self._settle()
        return generate_latest(self.registry)


def metrics_response(body: bytes) -> web.Response:
    from aiohttp import web   # a worker serves /metrics only when configured to: aiohttp is loaded then

    # CONTENT_TYPE_LATEST carries a charset parameter, which aiohttp wants apart from the media type.
    media, _, charset = CONTENT_TYPE_LATEST.partition("; charset=")
    return web.Response(body=body, content_type=media, charset=charset or "utf-8")


async def serve_metrics(metrics: WorkerMetrics, host: str, port: int) -> tuple[web.AppRunner, str]:
    """A worker's /metrics endpoint on host:port (0: a free port). Returns the runner and the bound address."""
    from aiohttp import web

    async def handle(_request: web.Request) -> web.Response:
        return metrics_response(metrics.render())

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0]
    return runner, f"{bound[0]}:{bound[1]}"
