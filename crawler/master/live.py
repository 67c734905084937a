"""What the master knows about the crawl right now, for the progress line, the status command and the web page.

Pure: the server feeds it each report as a whole and passes the time in. Everything here is bounded: rates are
rings of fixed-width buckets, recent errors and audio items are short deques, error reasons are capped. The
cumulative HTTP status and error reason counts survive restarts through the store's meta table ("figures").

`build_status` is the one definition of the status object: the master serves it as /api/status and the
`status` command prints it (from the store and the snapshot the master writes to <data_dir>/live.json).
"""

from __future__ import annotations

import math
import os
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from crawler import protocol as p
from crawler.logs import iso_utc
from crawler.master.store_identify import alert_row

RATE_BUCKET = 5.0            # seconds; 120 of them cover the 10-minute rate
RATE_BUCKETS = 120
CHART_BUCKET = 60.0          # one bar a minute over the last 6 hours
CHART_BUCKETS = 360
RECENT = 20
MAX_FAULT = 120              # characters of a worker's fault reason shown
MAX_REASONS = 64             # distinct error reasons kept; the rest count as "other"
LIVE_FILE = "live.json"


class Buckets:
    """Counts in fixed-width time buckets over a sliding window: add O(1), sums O(buckets)."""

    def __init__(self, width: float, count: int) -> None:
        self.width = width
        self.count = count
        self.values = [0] * count
        self.index = [-1] * count     # which absolute bucket each slot holds now

    def add(self, now: float, n: int = 1) -> None:
        i = int(now // self.width)
        slot = i % self.count
        if self.index[slot] != i:
            self.index[slot] = i
            self.values[slot] = 0
        self.values[slot] += n

    def series(self, now: float) -> list[int]:
        """The last `count` buckets, oldest first; the last one is the bucket now runs in."""
        last = int(now // self.width)
        out = []
        for i in range(last - self.count + 1, last + 1):
            slot = i % self.count
            out.append(self.values[slot] if self.index[slot] == i else 0)
        return out

    def per_second(self, now: float, seconds: float, since: float) -> float:
        """The rate over the last `seconds` (whole buckets, the current one included), or since `since` when
        that is later: a run younger than the window is not diluted by the time before it started."""
        n = max(1, min(self.count, math.ceil(seconds / self.width)))
        covered = min(now - (int(now // self.width) - n + 1) * self.width, now - since)
        return sum(self.series(now)[-n:]) / max(covered, 1.0)


def error_reason(error: str | None, http_status: int | None) -> str:
    """A short, low-cardinality reason for an error text: the part before the first colon."""
    if not error:
        return f"HTTP {http_status}" if http_status else "unknown"
    return error.split(":", 1)[0].strip()[:48] or "unknown"


# A node's state, as status --json, the table and the page name it: connected and taking work; connected but
# unable to store anything (its disk), so it gets no work; not connected.
CONNECTED, FAULT, DISCONNECTED = "connected", "fault", "disconnected"


@dataclass
class NodeLive:
    connected: bool = False
    last_heartbeat: float | None = None
    fault: str | None = None      # why the node cannot store, while it cannot
    fingerprint_backlog: int = 0  # stored files waiting for the node's fingerprint pool, as its last heartbeat said


@dataclass
class LiveStats:
    started: float
    pid: int = field(default_factory=os.getpid)
    pages: Buckets = field(default_factory=lambda: Buckets(RATE_BUCKET, RATE_BUCKETS))
    audio: Buckets = field(default_factory=lambda: Buckets(RATE_BUCKET, RATE_BUCKETS))
    errors: Buckets = field(default_factory=lambda: Buckets(RATE_BUCKET, RATE_BUCKETS))
    chart: Buckets = field(default_factory=lambda: Buckets(CHART_BUCKET, CHART_BUCKETS))
    http_status: Counter[str] = field(default_factory=Counter)      # cumulative over the crawl
    error_reasons: Counter[str] = field(default_factory=Counter)    # cumulative over the crawl
    interval_errors: Counter[str] = field(default_factory=Counter)  # since the last progress line
    interval_pages: int = 0
    interval_audio: int = 0
    recent_errors: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT))
    recent_audio: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT))
    nodes: dict[str, NodeLive] = field(default_factory=dict)
    dirty: bool = False           # figures changed since they were last saved

    def load_figures(self, saved: Mapping[str, Any] | None) -> None:
        if saved:
            self.http_status.update({str(k): int(v) for k, v in saved.get("http_status", {}).items()})
            self.error_reasons.update({str(k): int(v) for k, v in saved.get("errors", {}).items()})
            # The recent errors too: a restarted master still shows what went wrong just before it stopped.
            recent = saved.get("recent_errors", [])[-RECENT:]
            self.recent_errors.extend(e for e in recent if isinstance(e, dict))

    def figures(self) -> dict[str, Any]:
        self.dirty = False
        return {"http_status": dict(self.http_status), "errors": dict(self.error_reasons),
                "recent_errors": list(self.recent_errors)}

    def seen(self, node: str, now: float, connected: bool = True, fault: str | None = None) -> None:
        n = self.nodes.setdefault(node, NodeLive())
        n.connected = connected
        n.last_heartbeat = now
        n.fault = fault if connected else None

    def fingerprint_backlog(self, node: str, backlog: int) -> None:
        self.nodes.setdefault(node, NodeLive()).fingerprint_backlog = backlog

    def gone(self, node: str) -> None:
        if node in self.nodes:
            self.nodes[node].connected = False

    def report(self, node: str, results: Iterable[p.Result], new_rows: list[dict[str, Any]], now: float) -> Counter[str]:
        """One report's results and the catalogue rows it added. Returns the outcome counts (for metrics)."""
        outcomes: Counter[str] = Counter()
        for r in results:
            outcomes[r.status] += 1
            if r.http_status is not None:
                self.http_status[str(r.http_status)] += 1
            if r.status != p.DONE:
                reason = error_reason(r.error, r.http_status)
                if reason not in self.error_reasons and len(self.error_reasons) >= MAX_REASONS:
                    reason = "other"
                self.error_reasons[reason] += 1
                self.interval_errors[reason] += 1
                self.recent_errors.append({"time": iso_utc(now), "node": node, "url": r.url,
                                           "outcome": r.status, "error": (r.error or reason)[:200]})
        done = outcomes.get(p.DONE, 0)
        bad = sum(outcomes.values()) - done
        if done:
            self.pages.add(now, done)
            self.chart.add(now, done)
            self.interval_pages += done
        if bad:
            self.errors.add(now, bad)
        if new_rows:
            self.audio.add(now, len(new_rows))
            self.interval_audio += len(new_rows)
            for row in new_rows[-RECENT:]:
                self.recent_audio.append({k: row.get(k) for k in ("title", "artist", "url", "page", "status",
                                                                   "node")} | {"time": iso_utc(now)})
        self.dirty = True
        return outcomes

    def rates(self, now: float) -> dict[str, float]:
        """Per-minute rates over the last 1 and 10 minutes (over the run's time when it is shorter)."""
        out = {}
        for minutes in (1, 10):
            for name, b in (("pages", self.pages), ("audio", self.audio), ("errors", self.errors)):
                out[f"{name}_per_min_{minutes}m"] = round(b.per_second(now, 60.0 * minutes, self.started) * 60, 1)
        return out

    def chart_view(self, now: float) -> tuple[list[int], float]:
        """Pages per minute for the chart and the time its last bar ends: whole minutes only, so the chart
        never ends in the drop of a minute still under way. An hour of bars at least, more for an older run."""
        end = (now // self.chart.width) * self.chart.width
        series = self.chart.series(end - self.chart.width / 2)     # the last bucket: the minute just ended
        minutes = min(len(series), max(60, int((end - self.started) // self.chart.width) + 1))
        return series[-minutes:], end

    def take_interval(self) -> tuple[int, int, Counter[str]]:
        out = (self.interval_pages, self.interval_audio, self.interval_errors)
        self.interval_pages = self.interval_audio = 0
        self.interval_errors = Counter()
        return out

    def view(self, now: float, *, held: int, at_workers: int, in_flight: Mapping[str, int],
             web: str | None, lag: float, run_pages: int, lag_worst: float = 0.0,
             paused: bool = False, sites: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The live half of the status object (JSON-able); build_status joins it with the store's figures."""
        elapsed = max(now - self.started, 1e-9)
        return {
            "running": True,
            "paused": paused,
            "pid": self.pid,
            "written_at": now,
            "started": iso_utc(self.started),
            "web": web,
            "event_loop_lag_s": round(lag, 4),
            "event_loop_lag_worst_s": round(lag_worst, 4),   # since the start: the longest the loop was held
            "held_at_master": held,
            "at_workers": at_workers,
            "this_run": {"pages": run_pages, "elapsed_s": round(elapsed, 1),
                         "pages_per_s": round(run_pages / elapsed, 2)},
            "rates": self.rates(now),
            "nodes": {n: {"connected": s.connected, "fault": s.fault,
                          "last_heartbeat": iso_utc(s.last_heartbeat), "in_flight": in_flight.get(n, 0),
                          "fingerprint_backlog": s.fingerprint_backlog}
                      for n, s in self.nodes.items()},
            "http_status": dict(self.http_status),
            "errors": dict(self.error_reasons),
            "sites": dict(sites or {}),
        }


def stale(live: Mapping[str, Any] | None, now: float, max_age: float) -> bool:
    return not live or not live.get("running") or now - float(live.get("written_at", 0)) > max_age


def build_status(db: Mapping[str, Any], live: Mapping[str, Any] | None, nodes: Iterable[str], now: float,
                 *, running: bool) -> dict[str, Any]:
    """The status object. db: MasterStore.status() plus "figures" from the meta table; live: a view() (or the
    last one the master wrote); running: whether that view is the running master's."""
    live = dict(live or {})
    states = db["states"]
    held = live.get("held_at_master", 0) if running else 0
    at_workers = live.get("at_workers", 0) if running else 0
    urls = {
        "queued": states.get("queued", 0),
        "held_at_master": held,
        "waiting_at_master": states.get("queued", 0) + held,
        "at_workers": at_workers,
        "done": states.get("done", 0),
        "error": states.get("error", 0),
        "total": sum(states.values()),
    }
    if not running:
        # Leases of a stopped master go back in line when it starts again.
        urls["leased_when_stopped"] = states.get("leased", 0)
    unrouted = db.get("frontier_by_node", {}).get("None", 0)
    if unrouted:
        urls["not_routed"] = unrouted
    live_nodes = live.get("nodes", {})
    table = []
    for node in dict.fromkeys([*nodes, *db.get("nodes", {})]):
        d = db.get("nodes", {}).get(node, {})
        ln = live_nodes.get(node, {})
        connected = bool(running and ln.get("connected"))
        # The worker's own words, printed on terminals: bounded, and no control characters.
        fault = "".join(c if c.isprintable() else "?" for c in str(ln["fault"])[:MAX_FAULT]) \
            if connected and ln.get("fault") else None
        table.append({
            "node": node,
            "state": FAULT if fault else CONNECTED if connected else DISCONNECTED,
            "fault": fault,
            "connected": connected,
            "last_heartbeat": ln.get("last_heartbeat"),
            "in_flight": ln.get("in_flight", 0) if running else 0,
            "fingerprint_backlog": ln.get("fingerprint_backlog", 0) if connected else 0,
            "queued": d.get("queued", 0),
            "pages": d.get("done", 0),
            "errors": d.get("error", 0),
            "audio": d.get("audio", 0),
            "bytes": d.get("bytes", 0),
            "links": d.get("links", 0),
            # Local faults (disk full ...) and the tasks the node handed back for them: the node's, not the URLs'.
            "faults": d.get("faults", 0),
            "handed_back": d.get("handed_back", 0),
        })
    figures = db.get("figures") or {}
    http_status = live.get("http_status", figures.get("http_status", {})) if running else \
        figures.get("http_status", {})
    errors = live.get("errors", figures.get("errors", {})) if running else figures.get("errors", {})
    # The store's flag first: it is committed before `pause` returns, while the master's view on disk can be
    # a snapshot interval old. A stopped crawl can be paused too (it starts paused).
    paused = bool(db.get("paused", live.get("paused", False) if running else False))
    return {
        "time": iso_utc(now),
        "paused": paused,
        # The limit that ended or paused the crawl (its key: "crawl.max_bytes" ...), or None.
        "limit": db.get("limit"),
        "master": {"running": running, "pid": live.get("pid") if running else None,
                   "started": live.get("started"), "web": live.get("web") if running else None,
                   "event_loop_lag_s": live.get("event_loop_lag_s") if running else None,
                   "event_loop_lag_worst_s": live.get("event_loop_lag_worst_s") if running else None},
        "urls": urls,
        "nodes": table,
        "nodes_connected": sum(1 for n in table if n["connected"]),
        "nodes_faulted": sum(1 for n in table if n["state"] == FAULT),
        "rates": live.get("rates", {}) if running else {},
        "this_run": live.get("this_run", {}),
        "errors": dict(sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))[:10]),
        "http_status": dict(sorted(http_status.items())),
        "discards": dict(sorted(db.get("discards", {}).items())),
        "audio": dict(sorted(db.get("audio", {}).items())),
        # Downloads found on pages already reported, still under way at the workers (items "pending").
        "downloads_pending": db.get("downloads_pending", 0),
        "changes": _changes(db.get("changes")),
        # Copies of the references' works found: (audio URL, work) pairs, and the latest of them.
        "matches": _matches(db.get("matches")),
        # The seen-set as the master last saw it (its state is saved with the master's, so a stopped master's
        # last view still holds).
        "dedup": live.get("dedup"),
        # The sites of the sites: table, by pattern (crawler/master/sitestats.py): this run's figures, and the
        # gates' now; those of a stopped master's last view.
        "sites": live.get("sites") or {},
    }


def _matches(matches: Mapping[str, Any] | None) -> dict[str, Any]:
    m = matches or {}
    latest = [alert_row(row) for row in m.get("latest", [])]
    return {"count": int(m.get("count", 0)), "latest": latest}


def _changes(changes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The catalogue's new, changed and removed items in the last refresh cycle and in the one under way."""
    out: dict[str, Any] = {}
    for name, c in (changes or {}).items():
        if c and c.get("start") is not None:   # no cycle has started: refresh is off
            out[name] = {**{k: c.get(k, 0) for k in ("new", "changed", "removed")},
                         **{k: iso_utc(c[k]) for k in ("start", "end") if c.get(k) is not None}}
    return out


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def progress_line(interval: float, pages: int, audio: int, errors: Counter[str], *, queued: int, held: int,
                  at_workers: int, connected: int, nodes: int, shrink: float | None,
                  paused: bool = False) -> str:
    """The master's periodic log line. shrink: how fast the waiting work went down (URLs/s), if it did."""
    per_min = 60.0 / interval if interval > 0 else 0.0
    errs = ", ".join(f"{k} {v}" for k, v in errors.most_common(5)) or "none"
    waiting = queued + held
    if paused:   # not a stall: the operator holds the work back
        eta = "paused: no work is handed out until `crawler-master resume`"
    elif waiting == 0 and at_workers == 0:
        eta = "nothing left"
    elif shrink and shrink > 0:
        eta = f"about {human_duration(waiting / shrink)} left"
    else:
        eta = "queue not shrinking"
    return (f"progress{' (paused)' if paused else ''}: "
            f"{pages * per_min:.0f} pages/min, {audio * per_min:.0f} audio/min; "
            f"queued {queued}, held at the master {held}, at workers {at_workers}; "
            f"workers {connected}/{nodes}; errors: {errs}; {eta}")


def _table(head: list[str], rows: list[list[Any]], right: Collection[int] = ()) -> list[str]:
    cells = [head] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    out = []
    for r in cells:
        out.append("  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                    for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return out


def _counts(title: str, counts: Mapping[str, int], empty: str = "none") -> list[str]:
    if not counts:
        return [f"{title}: {empty}"]
    return [f"{title}:"] + _table(["", "count"], [[k, v] for k, v in counts.items()], right={1})[1:]


def _of(n: int, limit: int | None) -> str:
    """In flight against its limit: "1/2", or "1" with none."""
    return f"{n}/{limit}" if limit is not None else str(n)


def _delay(now: float, own: float | None) -> str:
    """The delay in force, and the site's own min_delay when a Crawl-delay or the adaptive delay is longer."""
    return f"{now:g}" if own is None or now == own else f"{now:g} (min {own:g})"


def node_state_text(n: Mapping[str, Any]) -> str:
    """A node's state for the table: its name, and for a fault the reason the node gave."""
    state = str(n.get("state") or (CONNECTED if n.get("connected") else DISCONNECTED))
    return f"fault: {n['fault']}" if state == FAULT and n.get("fault") else state


def status_text(st: Mapping[str, Any]) -> str:
    """The status object as the operator reads it: tables, not dicts."""
    m, u, r = st["master"], st["urls"], st.get("rates") or {}
    lines = []
    if m["running"]:
        lines.append(f"master running since {m['started']} (pid {m['pid']}), status page http://{m['web']}/"
                     if m.get("web") else f"master running since {m['started']} (pid {m['pid']})")
    else:
        lines.append("master not running (figures from its database)")
    if st.get("limit"):
        lines.append(f"crawl reached its limit: {st['limit']}")
    if st.get("paused"):
        lines.append("crawl PAUSED: no work is handed out until `crawler-master resume`")
    faulted = f", {st['nodes_faulted']} faulted (taking no work)" if st.get("nodes_faulted") else ""
    lines.append(f"at {st['time']}: {st['nodes_connected']} of {len(st['nodes'])} workers connected{faulted}")
    lines.append("")
    lines.append("URLs:")
    url_rows = [["queued (frontier)", u["queued"]],
                ["held at the master (politeness gate, robots.txt, credit)", u["held_at_master"]],
                ["  = waiting at the master", u["waiting_at_master"]],
                ["at workers", u["at_workers"]]]
    if "leased_when_stopped" in u:
        url_rows.append(["leased when the master stopped (queued again at start)", u["leased_when_stopped"]])
    if "not_routed" in u:
        url_rows.append(["not routed (no worker has joined yet)", u["not_routed"]])
    url_rows += [["done", u["done"]], ["failed", u["error"]], ["total", u["total"]]]
    lines += _table(["", ""], url_rows, right={1})[1:]
    lines.append("")
    if r:
        lines.append("rates (per minute):")
        lines += _table(["", "last 1 min", "last 10 min"],
                        [[k, r.get(f"{k}_per_min_1m", 0), r.get(f"{k}_per_min_10m", 0)]
                         for k in ("pages", "audio", "errors")], right={1, 2})
        run = st.get("this_run") or {}
        if run:
            lines.append(f"  this run: {run.get('pages', 0)} pages in {human_duration(run.get('elapsed_s', 0))}"
                         f" ({run.get('pages_per_s', 0)} pages/s)")
        lines.append("")
    lines.append("workers:")
    lines += _table(["node", "state", "last heartbeat", "in flight", "queued", "pages", "audio", "bytes",
                     "errors"],
                    [[n["node"], node_state_text(n), n["last_heartbeat"] or "never",
                      n["in_flight"], n["queued"], n["pages"], n["audio"], human_bytes(n["bytes"]), n["errors"]]
                     for n in st["nodes"]], right={3, 4, 5, 6, 7, 8})
    lines.append("")
    lines += _counts("audio items by status", st["audio"])
    if st.get("downloads_pending"):
        lines.append(f"downloads pending at the workers: {st['downloads_pending']} (the crawl ends once they do)")
        lines.append("")
    changes = st.get("changes") or {}
    if changes:
        lines.append("catalogue changes (refresh cycles):")
        lines += _table(["", "new", "changed", "removed", "from", "to"],
                        [[label, c["new"], c["changed"], c["removed"], c.get("start") or "-", c.get("end") or "now"]
                         for label, key in (("last cycle", "last_cycle"), ("this cycle", "this_cycle"))
                         if (c := changes.get(key))], right={1, 2, 3})
    d = st.get("dedup")
    if d:
        lines.append(f"seen-set (Bloom filter): {d['urls']} URLs in {d['layers']} "
                     f"layer{'s' if d['layers'] != 1 else ''} for {d['capacity']}, estimated false-positive rate "
                     f"{d['fp_estimate']:.2g} (target {d['fp_rate']:g}), {human_bytes(d['bytes'])}")
        lines.append("")
    sites = st.get("sites") or {}
    if sites:
        lines.append("sites (their own policy; this run):")
        lines += _table(["site", "done", "failed", "in flight", "audio", "audio in flight", "delay (s)"],
                        [[name, f["pages_done"], f["pages_failed"], _of(f["pages_in_flight"], f["max_per_host"]),
                          f["audio"], _of(f["audio_in_flight"], f["audio_max_per_host"]),
                          _delay(f["delay_s"], f["min_delay_s"])]
                         for name, f in sites.items()], right={1, 2, 3, 4, 5, 6})
        for name, f in sites.items():
            if w := f.get("login_waiting"):
                lines.append(f"site {name} waits for its login ({w['reason']}) for {w['waiting_s']:.0f} s: its URLs "
                             f"wait, the next attempt in {w['next_try_s']:.0f} s")
        lines.append("")
    lines += _counts("top error reasons", st["errors"])
    lines += _counts("HTTP status", st["http_status"])
    lines += _counts("discarded URLs by reason", st["discards"])
    return "\n".join(lines)
