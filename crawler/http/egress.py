"""Which proxy a request leaves through, and what a failing proxy costs: a pure core, time passed in.

- One origin (host and port) keeps one exit while that exit works: the proxy is chosen by rendezvous hashing of
  the origin over the healthy proxies of the request's list, so the hosts of a crawl spread over the list, and
  when a proxy is taken out only its own hosts move (to the next proxy in each host's order), and come back when
  it returns. Every node ranks alike, so a host keeps its exit across the cluster too.
- A proxy that fails as a proxy (its connection refused, reset or timed out, an answer that is not a proxy's,
  407, a SOCKS refusal) is taken out for a while: BACKOFF_FIRST seconds, doubled at each failure in a row up to
  BACKOFF_MAX, back to the first after a success. Its requests go to the others; the HTTP layer sends the request
  again on another proxy (at most MAX_TRIES proxies a request), so the URL loses no attempt to a proxy's fault.
- When every proxy of a request's list is out, ``choose`` raises ProxiesUnavailable: not an HTTP error (no
  fetcher or downloader counts it against the URL) but this node's fault; the worker hands the task back.
- A pin (the proxy that resolved a signed address) wins while that proxy is in the list and healthy.
- Counters per proxy (requests, failures), at most MAX_PROXIES of them, read as a snapshot by the metrics.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from crawler.http.proxies import MAX_PROXIES, Proxy
from crawler.http.scoped import Scoped

BACKOFF_FIRST = 5.0
BACKOFF_MAX = 300.0
# Proxies one request tries before it gives up as this node's fault: more would only delay the hand-back.
MAX_TRIES = 3

# The proxies that apply to a request to (host, port): () for none (go direct).
Route = Callable[[str, int], Sequence[Proxy]]


# The proxy a request should leave through if it applies and is healthy (a signed address goes out where it was
# resolved), and the proxies a block of requests went through (what a resolver's API calls used): context, so
# they pass through the resolvers and the downloader untouched.
_PIN: ContextVar[str | None] = ContextVar("egress_pin", default=None)      # a Proxy.label
_USED: ContextVar[list[Proxy] | None] = ContextVar("egress_used", default=None)


def current_pin() -> str | None:
    return _PIN.get()


def pinned(label: str | None) -> Scoped[str | None]:
    """Requests made inside go through the proxy of this label while it applies to them and is healthy."""
    return Scoped(_PIN, label)


def exits_used() -> Scoped[list[Proxy]]:
    """The proxies the requests made inside went through, the last one last (at most a few kept)."""
    return Scoped(_USED, [])


def note_exit(proxy: Proxy) -> None:
    used = _USED.get()
    if used is not None:
        if len(used) >= 8:
            del used[0]
        used.append(proxy)


class ProxiesUnavailable(Exception):
    """Every proxy that applies to a request is out (or failed it): this node cannot reach the host now. The
    URL is not at fault; the worker hands its task back (crawler/worker/faults.py)."""


class ProxyFailed(Exception):
    """A proxy failed as a proxy (not the origin behind it): the request may go again through another."""

    def __init__(self, proxy: Proxy, reason: str) -> None:
        super().__init__(f"proxy {proxy.label}: {reason}")
        self.proxy = proxy
        self.reason = reason


class Unanswered(Exception):
    """A fresh connection through a proxy ended before any byte of the answer: the proxy dying, or the origin
    hanging up. The request goes once more through another proxy (a GET is safe to send again) without blaming
    this one, which says so on its next connection if it is dead; on the last proxy ``error``, the origin's, is
    raised."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class ProxyCount:
    label: str
    requests: int
    failures: int


class _State:
    __slots__ = ("failures", "out_until", "requests", "streak")

    def __init__(self) -> None:
        self.requests = 0
        self.failures = 0
        self.streak = 0          # failures in a row: the next backoff
        self.out_until = 0.0


def _weight(host: str, proxy: Proxy) -> bytes:
    return hashlib.blake2b(f"{proxy.label}\0{host}".encode("utf-8", "surrogatepass"), digest_size=8).digest()


class Egress:
    """The proxies' health and counters for one node, and the choice of a proxy per request. ``route`` is what
    the node's configuration says applies to a host (None: no proxy anywhere, so the HTTP layer does no per-request
    work at all)."""

    def __init__(self, route: Route | None = None, *, first: float = BACKOFF_FIRST,
                 longest: float = BACKOFF_MAX) -> None:
        self.route = route
        self._first, self._longest = first, longest
        self._state: dict[Proxy, _State] = {}

    def _of(self, proxy: Proxy) -> _State:
        state = self._state.get(proxy)
        if state is None:
            if len(self._state) >= MAX_PROXIES:
                # Bounded: a proxy no list names any more makes room (the lists are at most MAX_PROXIES long each,
                # but a site's and the crawl's may together name more). The oldest-inserted goes.
                del self._state[next(iter(self._state))]
            state = self._state[proxy] = _State()
        return state

    def healthy(self, proxy: Proxy, now: float) -> bool:
        state = self._state.get(proxy)
        return state is None or state.out_until <= now

    def choose(self, origin: str, proxies: Sequence[Proxy], now: float, *, pin: str | None = None,
               tried: Sequence[Proxy] = ()) -> Proxy:
        """The proxy for a request to origin (host:port): the pinned one (by label) when it is in the list and
        healthy, else the healthy proxy (not in ``tried``) that ranks first for this origin. ProxiesUnavailable
        when there is none."""
        if pin is not None:
            for proxy in proxies:
                if proxy.label == pin and proxy not in tried and self.healthy(proxy, now):
                    return proxy
        best: Proxy | None = None
        best_weight = b""
        for proxy in proxies:
            if proxy in tried or not self.healthy(proxy, now):
                continue
            weight = _weight(origin, proxy)
            if best is None or weight > best_weight:
                best, best_weight = proxy, weight
        if best is None:
            labels = ", ".join(p.label for p in proxies[:4]) + (" ..." if len(proxies) > 4 else "")
            raise ProxiesUnavailable(f"no proxy can take a request to {origin} now ({labels})")
        return best

    def sent(self, proxy: Proxy) -> None:
        self._of(proxy).requests += 1

    def succeeded(self, proxy: Proxy) -> None:
        note_exit(proxy)
        state = self._state.get(proxy)
        if state is not None:
            state.streak = 0

    def failed(self, proxy: Proxy, now: float) -> float:
        """The proxy failed as a proxy: out until the returned time. Failures of requests that were already
        under way when it was taken out count, but do not lengthen its time out: a proxy that dies under many
        requests at once is one failure, not many in a row."""
        state = self._of(proxy)
        state.failures += 1
        if state.out_until > now:
            return state.out_until
        backoff = min(self._longest, self._first * 2 ** min(state.streak, 30))
        state.streak += 1
        state.out_until = now + backoff
        return state.out_until

    def snapshot(self) -> tuple[ProxyCount, ...]:
        """Every proxy's counters, by label."""
        return tuple(sorted((ProxyCount(p.label, s.requests, s.failures) for p, s in self._state.items()),
                            key=lambda c: c.label))


T = TypeVar("T")


async def carry(egress: Egress, origin: str, proxies: Sequence[Proxy], send: Callable[[Proxy], Awaitable[T]],
                clock: Callable[[], float]) -> T:
    """``send(proxy)`` through the proxy egress chooses for origin (host:port), and through another when that one
    fails as a proxy (it raises ProxyFailed: the proxy is taken out for a while) or the way through it broke
    before any answer (Unanswered), at most MAX_TRIES proxies in all. The one failover every way out through
    proxies takes: the lean path, the httpx transport and the browser's proxy. ProxiesUnavailable when none could
    carry it: this node's fault, not the URL's."""
    limit = min(MAX_TRIES, len(proxies))
    tried: list[Proxy] = []
    last = ""
    while len(tried) < limit:
        proxy = egress.choose(origin, proxies, clock(), pin=current_pin(), tried=tried)
        tried.append(proxy)
        egress.sent(proxy)
        try:
            result = await send(proxy)
        except ProxyFailed as exc:
            egress.failed(proxy, clock())
            last = exc.reason
            continue
        except Unanswered as exc:
            if len(tried) >= limit:
                raise exc.error from None
            last = str(exc.error)
            continue
        egress.succeeded(proxy)
        return result
    raise ProxiesUnavailable(f"{origin}: no proxy carried the request ({', '.join(p.label for p in tried)}"
                             f"{': ' + last if last else ''})")
