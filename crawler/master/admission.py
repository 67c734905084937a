"""Which unauthenticated connections the master's port takes: pure, time passed in, no sockets.

Until a peer has proved the secret it is a stranger, and strangers share a few handshake slots. Shared as one
pool, one source could hold them all (it opens connections and says nothing until the handshake timeout), and
a worker that restarts meanwhile could not get in. So each source address has its own share:

    a connection from source S arrives at `now`
    S's token bucket is empty (more than `rate` a second on average, `burst` at once)  -> refused
    S holds `per_source` slots already                     -> S's own least useful slot is evicted, it is taken
    all `total` slots are held, S holds fewer than the busiest source B
                                                           -> B's least useful slot is evicted, it is taken
    all `total` slots are held, S is among the busiest     -> refused
    otherwise                                              -> taken

The least useful slot of a source is its oldest that has not sent a valid Hello yet (an idle connection), else
its oldest: a peer that greets at once and goes on is never the one evicted while another of its source only
waits. A source is the IPv4 address, or the /64 of an IPv6 address (one host's usual allocation: counting each
address would give one host 2**64 sources). A slot is released when its handshake ends, whatever the outcome.

Memory: at most `total` slots, and the buckets of at most `sources` addresses (past the bound the least
recently used is forgotten: most likely full again, the same as a new one).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Limits:
    total: int = 64           # unauthenticated connections at once, all sources together
    per_source: int = 8       # of which one source may hold
    rate: float = 10.0        # connections a second a source may open, on average ...
    burst: int = 40           # ... and at once (many workers behind one address, reconnecting together)
    sources: int = 4096       # sources whose rate is remembered

    def __post_init__(self) -> None:
        if not (1 <= self.per_source <= self.total and self.rate > 0 and self.burst >= 1 and self.sources >= 1):
            raise ValueError(f"admission limits out of range: {self}")


@dataclass(frozen=True)
class Verdict(Generic[K]):
    admit: bool
    evict: K | None = None    # an unauthenticated connection to close to make room for this one
    reason: str = ""          # why refused, for the log


def source_of(host: str) -> str:
    """The source a peer address counts under: the IPv4 address, or the /64 of an IPv6 one."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host               # not an IP (a Unix socket): one source
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Slot:
    source: str
    opened: float
    greeted: bool = False


class Admission(Generic[K]):
    """The master's handshake slots. `offer` a new connection, `greeted` when it sent a valid Hello, `release`
    when its handshake ended; the caller closes what a Verdict evicts or refuses."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._slots: dict[K, _Slot] = {}                      # in the order taken: oldest first
        self._held: dict[str, int] = {}                       # slots per source
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()   # source -> (tokens, at)
        self.refused = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._slots)

    def held(self, source: str) -> int:
        return self._held.get(source, 0)

    def offer(self, key: K, source: str, now: float) -> Verdict[K]:
        if key in self._slots:
            raise ValueError(f"connection {key!r} offered twice")
        if not self._take_token(source, now):
            self.refused += 1
            return Verdict(False, reason=f"more than {self.limits.rate:g} connections a second from {source}")
        lim = self.limits
        evict: K | None = None
        if self.held(source) >= lim.per_source:
            evict = self._least_useful(source)
        elif len(self._slots) >= lim.total:
            busiest = max(self._held, key=lambda s: self._held[s])
            if self._held[busiest] <= self.held(source):
                self.refused += 1
                return Verdict(False, reason=f"all {lim.total} handshake slots held")
            evict = self._least_useful(busiest)
        if evict is not None:
            self.release(evict)
            self.evicted += 1
        self._slots[key] = _Slot(source, now)
        self._held[source] = self.held(source) + 1
        return Verdict(True, evict)

    def greeted(self, key: K) -> None:
        """The connection sent a valid Hello: it is no longer idle."""
        slot = self._slots.get(key)
        if slot is not None:
            slot.greeted = True

    def release(self, key: K) -> None:
        """The connection's handshake ended (or it was evicted): its slot is free. Unknown keys are ignored."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return
        n = self._held[slot.source] - 1
        if n:
            self._held[slot.source] = n
        else:
            del self._held[slot.source]

    def _least_useful(self, source: str) -> K:
        oldest: K | None = None
        for key, slot in self._slots.items():       # oldest first; at most `total` slots
            if slot.source != source:
                continue
            if not slot.greeted:
                return key
            if oldest is None:
                oldest = key
        assert oldest is not None
        return oldest

    def _take_token(self, source: str, now: float) -> bool:
        lim = self.limits
        tokens, at = self._buckets.pop(source, (float(lim.burst), now))
        tokens = min(float(lim.burst), tokens + max(0.0, now - at) * lim.rate)
        ok = tokens >= 1.0
        if ok:
            tokens -= 1.0
        self._buckets[source] = (tokens, now)             # the most recently used last
        if len(self._buckets) > lim.sources:
            self._buckets.popitem(last=False)
        return ok
