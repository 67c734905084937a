"""Audio downloads across the cluster: one download per address, under per-host politeness of their own.

Synchronous and free of sockets, like crawl.py: the server feeds it the workers' asks and ends and sends the
grants it returns. A worker asks before each download (protocol.DownloadAsk, batched); the answer
(protocol.DownloadGrant) is either "go", given when the audio host's gate (`politeness.audio_max_per_host`,
`politeness.audio_min_delay`, held across all workers) lets one more download start, or "copy": the address is
already downloaded by a node, whose place (node, path, sha256, size) the worker records instead of fetching it.
An ask for an address another node is downloading waits for that download to end: a copy if it succeeded, else
that ask goes next. A worker's end of a download (protocol.DownloadDone) frees its host's slot.

A node that cannot store (protocol.Fault: disk full, read-only) gets no grant until it can again (its Credit):

| the ask, or the event                          | what the board does                                          |
|------------------------------------------------|--------------------------------------------------------------|
| an address another node has downloaded         | "copy" now (none to the node holding it, none past max_age)  |
| an address another node is downloading         | waits for that download: then a copy, or (it failed) next    |
| its host's gate is open                        | "go" now                                                     |
| its host's gate is shut                        | waits in its host's line, in order                           |
| an ask of a faulted node                       | held aside: no grant, no host slot, no turn in a line        |
| a node faults                                  | its waiting asks are held aside; its downloads running end   |
|                                                | as the node reports them (a full disk fails them at once)    |
| the node can store again                       | its held asks are asked again, in order, as above            |
| a node faulted for fault_timeout or longer     | faulted_past() names it (every call while it stays faulted): |
|                                                | the server hands its pending downloads to the live nodes     |
| a node leaves                                  | its downloads end, its asks (held or waiting) are void       |

Memory is bounded: the downloaded addresses are remembered up to `remembered` (oldest forgotten first: past
that, the same address may be fetched once more, and each node's content-addressed store still keeps one copy
of the same bytes); asks waiting, held ones too, are bounded by what the workers' capacity lets them ask (a
worker has at most twice its `downloads` asks out).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from crawler import protocol as p
from crawler.politeness import HostGate
from crawler.web.urls import host_url_of


@dataclass(slots=True)
class _Ask:
    node: str
    ticket: int
    url: str
    host: str


@dataclass(frozen=True, slots=True)
class _Copy:
    node: str
    sha256: str
    size: int | None
    path: str | None
    at: float


class DownloadBoard:
    def __init__(self, gate: HostGate, remembered: int = 200_000, max_age: float | None = None,
                 fault_timeout: float = math.inf) -> None:
        self.gate = gate
        self.remembered = remembered
        self.fault_timeout = fault_timeout
        # A refreshing crawl looks at its audio again: a copy older than this is not offered (None: any age).
        self.max_age = max_age
        self._done: OrderedDict[str, _Copy] = OrderedDict()    # url -> where a finished download of it is
        self._running: dict[str, _Ask] = {}                   # url -> the download of it in progress
        self._by_ticket: dict[tuple[str, int], _Ask] = {}     # (node, ticket) -> a download in progress
        self._followers: dict[str, list[_Ask]] = {}           # url -> asks waiting for its download to end
        self._waiting: dict[str, deque[_Ask]] = {}            # host -> asks waiting for its gate, in order
        self._faulted: dict[str, float] = {}                  # node -> since when it cannot store
        self._held: dict[str, list[_Ask]] = {}                # node (faulted) -> its asks, held aside in order
        self.copies = 0                                       # downloads saved this run

    # ------------------------------------------------------------------ input
    def ask(self, node: str, asks: tuple[tuple[int, str], ...], now: float) -> list[tuple[str, p.Grant]]:
        """A worker wants to download these (ticket, url). Returns (node, grant) for those decided now."""
        out: list[tuple[str, p.Grant]] = []
        for ticket, url in asks:
            a = _Ask(node, ticket, url, host_url_of(url))
            if (node, ticket) in self._by_ticket:
                continue   # asked twice: the first ask stands
            if node in self._faulted:
                self._held.setdefault(node, []).append(a)
                continue
            self._route(a, now, out)
        return out

    def done(self, node: str, ends: tuple[p.DownloadEnd, ...], now: float) -> list[tuple[str, p.Grant]]:
        """The node's downloads ended (sha256 set: with the file). Frees their hosts' slots; returns the grants
        that this makes possible."""
        out: list[tuple[str, p.Grant]] = []
        hosts: set[str] = set()
        for e in ends:
            a = self._by_ticket.pop((node, e.ticket), None)
            if a is None:
                continue
            self._end(a, now, e.sha256, e.size, e.path, out)
            hosts.add(a.host)
        for host in hosts:
            self._serve(host, now, out)
        return out

    def node_gone(self, node: str, now: float) -> list[tuple[str, p.Grant]]:
        """The node left: its downloads will never report (their slots come back), its asks are void."""
        out: list[tuple[str, p.Grant]] = []
        self._faulted.pop(node, None)
        self._held.pop(node, None)
        for key in [k for k in self._by_ticket if k[0] == node]:
            a = self._by_ticket.pop(key)
            self._end(a, now, None, None, None, out)
        self._take_asks_of(node)
        for host in list(self._waiting):
            self._serve(host, now, out)
        return out

    def node_fault(self, node: str, now: float) -> list[tuple[str, p.Grant]]:
        """The node cannot store: its asks are held aside until node_ok(). A fault reported again keeps the
        time of the first. Returns the grants its leaving the lines makes possible."""
        out: list[tuple[str, p.Grant]] = []
        if node in self._faulted:
            return out
        self._faulted[node] = now
        held = self._held.setdefault(node, [])
        held.extend(self._take_asks_of(node))
        if not held:
            del self._held[node]
        for host in list(self._waiting):
            self._serve(host, now, out)
        return out

    def node_ok(self, node: str, now: float) -> list[tuple[str, p.Grant]]:
        """The node can store again: its held asks are asked again, in order."""
        out: list[tuple[str, p.Grant]] = []
        if self._faulted.pop(node, None) is None:
            return out
        for a in self._held.pop(node, []):
            self._route(a, now, out)
        return out

    def faulted_past(self, now: float) -> list[str]:
        """The nodes that have not been able to store for fault_timeout or longer: their pending downloads are
        for the live nodes to take over."""
        return [node for node, since in self._faulted.items() if now - since >= self.fault_timeout]

    def pump(self, now: float) -> list[tuple[str, p.Grant]]:
        """Grants for hosts whose spacing has passed (the server calls this when next_wake() is due)."""
        out: list[tuple[str, p.Grant]] = []
        for host in list(self._waiting):
            self._serve(host, now, out)
        return out

    def next_wake(self, now: float) -> float:
        """When a host's gate next opens for an ask waiting on time (inf: only an end can help)."""
        wake = math.inf
        for host in self._waiting:
            t = self.gate.ready_at(host, now)
            wake = min(wake, t)
        return wake

    def waiting(self) -> int:
        return (sum(len(line) for line in self._waiting.values()) + sum(len(x) for x in self._followers.values())
                + sum(len(x) for x in self._held.values()))

    # ------------------------------------------------------------------ inside
    def _take_asks_of(self, node: str) -> list[_Ask]:
        """The node's asks, out of the host lines and the followers (in the order they were asked, per line)."""
        taken: list[_Ask] = []
        for host, line in list(self._waiting.items()):
            kept = deque(a for a in line if a.node != node)
            taken.extend(a for a in line if a.node == node)
            if kept:
                self._waiting[host] = kept
            else:
                del self._waiting[host]
        for url, asks in list(self._followers.items()):
            kept_asks = [a for a in asks if a.node != node]
            taken.extend(a for a in asks if a.node == node)
            if kept_asks:
                self._followers[url] = kept_asks
            else:
                del self._followers[url]
        return taken

    def _route(self, a: _Ask, now: float, out: list[tuple[str, p.Grant]]) -> None:
        copy = self._fresh_copy(a, now)
        if copy is not None:
            self._done.move_to_end(a.url)
            self.copies += 1
            out.append((a.node, p.Grant(a.ticket, p.GRANT_COPY, copy.node, copy.sha256, copy.size, copy.path)))
            return
        if a.url in self._running:
            self._followers.setdefault(a.url, []).append(a)
            return
        line = self._waiting.get(a.host)
        if line is None and self.gate.try_acquire(a.host, now):
            self._start(a, out)
            return
        if line is None:
            line = self._waiting[a.host] = deque()
        line.append(a)

    def _fresh_copy(self, a: _Ask, now: float) -> _Copy | None:
        """The copy to offer a: none to the node that holds it (its own store checks the file, conditionally,
        and sees a change), nor one older than max_age."""
        copy = self._done.get(a.url)
        if copy is None or copy.node == a.node or (self.max_age is not None and now - copy.at > self.max_age):
            return None
        return copy

    def _start(self, a: _Ask, out: list[tuple[str, p.Grant]]) -> None:
        self._running[a.url] = a
        self._by_ticket[(a.node, a.ticket)] = a
        out.append((a.node, p.Grant(a.ticket, p.GRANT_GO)))

    def _end(self, a: _Ask, now: float, sha256: str | None, size: int | None, path: str | None,
             out: list[tuple[str, p.Grant]]) -> None:
        self.gate.release(a.host, now)
        if self._running.get(a.url) is a:
            del self._running[a.url]
        if sha256:
            self._done[a.url] = _Copy(a.node, sha256, size, path, now)
            self._done.move_to_end(a.url)
            while len(self._done) > self.remembered:
                self._done.popitem(last=False)
        # Those waiting for this address: copies now, or (it failed) back in line for the host's gate.
        for f in self._followers.pop(a.url, []):
            self._route(f, now, out)

    def _serve(self, host: str, now: float, out: list[tuple[str, p.Grant]]) -> None:
        line = self._waiting.get(host)
        while line:
            a = line[0]
            if self._fresh_copy(a, now) is not None or a.url in self._running:
                line.popleft()
                self._route_known(a, now, out)
                continue
            if not self.gate.try_acquire(host, now):
                return
            line.popleft()
            self._start(a, out)
        self._waiting.pop(host, None)

    def _route_known(self, a: _Ask, now: float, out: list[tuple[str, p.Grant]]) -> None:
        """An ask that waited for its host while the same address was taken up by another: copy or follow."""
        copy = self._fresh_copy(a, now)
        if copy is not None:
            self.copies += 1
            out.append((a.node, p.Grant(a.ticket, p.GRANT_COPY, copy.node, copy.sha256, copy.size, copy.path)))
        else:
            self._followers.setdefault(a.url, []).append(a)
