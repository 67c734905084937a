"""The master's observation shell: feeds the live figures and the Prometheus metrics from what the server
handles, writes the progress line and the status snapshot, and answers the web server's questions.

The server calls in at four places (a report, a worker joining or leaving, a commit); everything else runs in
background tasks of the master's TaskGroup, off the report path. The observer never holds the master: it
reads a ``MasterStatistics`` snapshot from the callable it is given and the store through a read-only
``StoreView`` (statistics.py), and hands the figures to save back to the master's commit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from crawler import protocol as p
from crawler.items import PENDING
from crawler.master.live import LIVE_FILE, LiveStats, build_status, progress_line
from crawler.master.statistics import MasterStatistics, StoreView
from crawler.metrics import MasterMetrics

log = logging.getLogger("crawler.master")

SNAPSHOT_INTERVAL = 2.0      # seconds between writes of <data_dir>/live.json
FIGURES_META = "figures"


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


class Observer:
    def __init__(self, statistics: Callable[[], MasterStatistics], *, clock: Callable[[], float],
                 nodes: tuple[str, ...], data_dir: Path, log_interval: float) -> None:
        """statistics: the master's figures now; clock: wall-clock seconds; nodes: the configured nodes;
        log_interval: seconds between progress lines. The master runs `run` through its store gate, so the
        store it hands to `opened` is never read mid-commit."""
        self.statistics = statistics
        self.clock = clock
        self.nodes = nodes
        self.data_dir = data_dir
        self.log_interval = log_interval
        self._store: StoreView | None = None
        self.metrics = MasterMetrics()
        # Each node's proxy counters as its last heartbeat said (crawler_proxy_*_total{proxy,node}).
        self.proxy_counts: dict[str, tuple[p.ProxyCount, ...]] = {}
        self.metrics.watch_proxies(lambda: self.proxy_counts)
        self.live = LiveStats(started=clock())
        self.web_addr: str | None = None

    def opened(self, store: StoreView) -> None:
        """The store is open: carry the crawl's cumulative figures over from the last run; read it from now
        on."""
        self._store = store
        self.live.load_figures(store.get_meta(FIGURES_META))

    @property
    def store(self) -> StoreView:
        if self._store is None:
            raise RuntimeError("the observer reads the store only once the master has opened it")
        return self._store

    # ------------------------------------------------------------------ hooks from the server
    def report(self, node: str, results: tuple[p.Result, ...], new_rows: list[dict[str, Any]], now: float) -> None:
        outcomes = self.live.report(node, results, new_rows, now)
        m = self.metrics
        for outcome, n in outcomes.items():
            m.pages.labels(node, outcome).inc(n)
        page_bytes = sum(r.size or 0 for r in results)
        if page_bytes:
            m.download_bytes.labels(node, "page").inc(page_bytes)
        # (a copy brings none: another node downloaded it)
        audio_bytes = sum(a.size or 0 for r in results for a in r.audio if a.sha256 and "stored_on" not in a.extra)
        if audio_bytes:
            m.download_bytes.labels(node, "audio").inc(audio_bytes)
        if new_rows:
            # A pending item is counted once its download ended, under the status it ended with.
            for status, n in Counter(row.get("status") or "ok" for row in new_rows).items():
                if status != PENDING:
                    m.audio.labels(node, status).inc(n)

    def downloads_settled(self, node: str, rows: list[dict[str, Any]]) -> None:
        """Downloads reported apart from their pages ended (rows no longer pending): their items by status, and the
        audio bytes they brought (a copy brings none)."""
        m = self.metrics
        for status, n in Counter(r.get("status") or "ok" for r in rows).items():
            m.audio.labels(node, status).inc(n)
        audio_bytes = sum(r.get("size") or 0 for r in rows
                          if r.get("sha256") and not (r.get("extra") or {}).get("stored_on"))
        if audio_bytes:
            m.download_bytes.labels(node, "audio").inc(audio_bytes)

    def heartbeat(self, node: str, msg: p.Heartbeat) -> None:
        """A worker's heartbeat: its fingerprint backlog, for the status and /metrics."""
        self.live.fingerprint_backlog(node, msg.fingerprint_backlog)
        self.metrics.fingerprint_backlog.labels(node).set(msg.fingerprint_backlog)
        if msg.proxies or node in self.proxy_counts:
            # Bounded: one entry per node of the config, each at most MAX_PROXY_COUNTS long (the wire's bound).
            self.proxy_counts[node] = msg.proxies

    def joined(self, node: str, now: float) -> None:
        self.live.seen(node, now, connected=True)

    def left(self, node: str, last_seen: float) -> None:
        self.live.seen(node, last_seen, connected=False)

    def committing(self, discards: Mapping[str, int]) -> dict[str, Any] | None:
        """Called before the server commits, with the discards of this window. Returns the figures to save
        under FIGURES_META in that transaction, or None when they have not changed since the last save."""
        for reason, n in discards.items():
            if n:
                self.metrics.discarded.labels(reason).inc(n)
        return self.live.figures() if self.live.dirty else None

    # ------------------------------------------------------------------ views
    def view(self, now: float) -> dict[str, Any]:
        m = self.statistics()
        for s in m.sessions:
            self.live.seen(s.node, s.last_seen, connected=True, fault=s.fault)
        view = self.live.view(now, held=m.held, at_workers=m.at_workers, in_flight=dict(m.in_flight),
                              web=self.web_addr, lag=self.metrics.lag.last, lag_worst=self.metrics.lag.worst,
                              run_pages=m.run_pages, paused=m.paused, sites=m.sites)
        view["dedup"] = dict(m.dedup)
        return view

    def status(self, now: float | None = None) -> dict[str, Any]:
        """The status object, as /api/status serves it and `status --json` prints it."""
        now = self.clock() if now is None else now
        return build_status(self.store.status(), self.view(now), self.nodes, now, running=True)

    def chart(self, now: float | None = None) -> dict[str, Any]:
        now = self.clock() if now is None else now
        live = self.live
        series, end = live.chart_view(now)
        return {"bucket_s": live.chart.width, "end": end, "pages": series,
                "errors": list(live.recent_errors)[::-1]}

    def render_metrics(self) -> bytes:
        m, met = self.statistics(), self.metrics
        met.frontier.set(self.store.frontier_size())
        met.in_flight.labels("master").set(m.held)
        met.in_flight.labels("workers").set(m.at_workers)
        met.nodes_connected.set(m.connected)
        met.nodes_faulted.set(m.faulted)
        met.paused.set(1 if m.paused else 0)
        met.set_urls(self.store.url_counts())
        met.count_dedup(dict(m.dedup_counts))
        met.set_bloom(dict(m.dedup))
        met.count_matches(self.store.match_count())
        met.count_recordings(self.store.recordings_stored())
        return met.render()

    # ------------------------------------------------------------------ background tasks
    async def run(self) -> None:
        """Progress lines every log_interval seconds and the status snapshot every few seconds."""
        interval = self.log_interval
        live_path = self.data_dir / LIVE_FILE
        next_line = time.monotonic() + interval
        last_line = time.monotonic()
        last_waiting: int | None = None
        while True:
            wait = min(SNAPSHOT_INTERVAL, max(0.0, next_line - time.monotonic()))
            await asyncio.sleep(wait)
            now_mono = time.monotonic()
            if now_mono >= next_line:
                span = now_mono - last_line
                last_line, next_line = now_mono, now_mono + interval
                m = self.statistics()
                waiting = self.store.frontier_size() + m.held
                shrink = (last_waiting - waiting) / span if last_waiting is not None and span > 0 else None
                last_waiting = waiting
                pages, audio, errors = self.live.take_interval()
                log.info("%s", progress_line(span, pages, audio, errors, queued=self.store.frontier_size(),
                                             held=m.held, at_workers=m.at_workers,
                                             connected=m.connected, nodes=len(self.nodes), shrink=shrink,
                                             paused=m.paused))
            self.write_snapshot(live_path)

    def write_snapshot(self, path: Path | None = None, *, running: bool = True) -> None:
        path = path or self.data_dir / LIVE_FILE
        view = self.view(self.clock())
        view["running"] = running
        try:
            write_json_atomic(path, view)
        except OSError as e:
            log.warning("status snapshot not written: %s", e)
